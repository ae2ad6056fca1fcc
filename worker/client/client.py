"""The control-plane client: submit, inspect, follow, cancel and requeue jobs over Redis.

``Client`` is synchronous (a control plane is often a plain web service). Events are read
from an explicit stream id, never from ``$``, so a reader that resumes from the last id it
saw gets every later event exactly once, or ``EventsTrimmed`` when the bounded stream has
already dropped some of them: never a silent gap.

A job id names one job spec: submitting the same id with the same spec (compared by the
digest of its canonical JSON, kept in the job's state as ``spec_digest``) is idempotent,
with another spec it is a ``JobConflict``. A new attempt of a settled job may change
the spec (a retry with a longer timeout, a fixed credential reference): it is then the
spec of that attempt and of the submits that follow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Self

import kombu.exceptions
import redis
import redis.exceptions

from worker.client import queue
from worker.errors import (
    EventsTrimmed,
    HandedBack,
    InteractionClosed,
    InvalidInput,
    InvalidJobSpec,
    JobConflict,
    JobNotFound,
    ServiceUnavailable,
    StoreRefused,
)
from worker.events.models import Event, JobCompleted
from worker.interactions.send import list_records, send_answer
from worker.jobs.spec import JobSpec, parse_job
from worker.settings import Settings
from worker.store import connect
from worker.store import jobs as store
from worker.store.control import CANCEL, append_control, control_fields
from worker.store.state import JobState

_PAGE = 500
_REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
_BLOCK_MS = 1000


@dataclass(frozen=True, slots=True)
class Submission:
    """What ``submit`` did: ``created``, ``retried`` (a new attempt) or ``exists``."""

    outcome: str
    state: JobState


REQUEUED = "requeued"
NOT_QUEUED = "not_queued"
IN_PROGRESS = "in_progress"


@dataclass(frozen=True, slots=True)
class Requeue:
    """What ``requeue`` did: ``requeued`` (the attempt's message was published again),
    ``not_queued`` (the attempt is running or settled: left alone, ``state`` says which)
    or ``in_progress`` (another requeue or submit is publishing it right now)."""

    outcome: str
    state: JobState


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One canonical event with the stream id to resume after: ``envelope`` typed (its
    ``data`` one of ``worker.events.models``' classes), ``event`` the stored JSON as a
    mapping, ``line`` that JSON's text."""

    id: str
    event: Mapping[str, object]
    line: str
    envelope: Event

    @classmethod
    def from_line(cls, entry_id: str, line: str) -> StreamEvent:
        event = json.loads(line)
        return cls(entry_id, event, line, Event.model_validate(event))


class Client:
    """Talks to the job service through Redis (state, events, control) and the broker."""

    def __init__(self, redis_url: str, *, settings: Settings | None = None) -> None:
        self._settings = (settings or Settings()).model_copy(update={"redis_url": redis_url})
        self._target = connect.target(redis_url, self._settings)
        # A read never waits on a Redis longer than its longest blocking command (an
        # events follow's 1 s XREAD, a WAIT's bound) plus a margin: a master that stopped
        # answering mid-failover is an error the caller can retry, not a hang.
        self._redis = connect.sync_client(
            self._target,
            self._settings,
            socket_connect_timeout=5,
            socket_timeout=5 + max(_BLOCK_MS, self._settings.redis_wait_ms) / 1000,
        )
        self._celery = queue.make_celery(self._settings, name="acp-worker-client", current=False)
        self._events = _EventReader(self._redis)
        # Claims to publish an attempt's message that a Redis or broker failure interrupted
        # (job id, attempt -> claim id): a retried submit takes its own claim again.
        self._interrupted: dict[tuple[str, int], str] = {}

    def close(self) -> None:
        self._redis.close()
        self._celery.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self, job: JobSpec | Mapping[str, object], *, new_attempt: bool = False
    ) -> Submission:
        """Submit ``job``; the same ``job_id`` and spec again returns the existing job
        unchanged (``exists``).

        A settled job runs again only with ``new_attempt=True`` (``attempt`` + 1, with
        this spec, which may differ from the previous attempt's). Once its state expired,
        the id may be submitted again: it goes on from the attempt its settlement record
        names. However many submits of one job run at once, each attempt's broker message
        is published once.

        A submit returns once its state and message are on a replica too, when the
        settings ask for one (``ACPW_REDIS_WAIT_REPLICAS``; 1 with Sentinel), so a
        failover right after it does not undo it. A submit interrupted by Redis or the
        broker (a failover) raises ``ServiceUnavailable`` with ``retry_safe``: submitting
        the same spec again is idempotent, never a second job (docs/durability.md).

        Raises:
            InvalidJobSpec: ``job`` is not a valid job spec.
            JobConflict: the job id is taken by a job with another spec (and no new
                attempt of it was started); nothing changed.
            ServiceUnavailable: Redis or the broker did not answer.
        """
        spec = job if isinstance(job, JobSpec) else parse_job(dict(job))
        digest = spec_digest(spec)
        key: tuple[str, int] | None = None
        try:
            with _translated():
                reply = store.submit(
                    self._redis,
                    spec.job_id,
                    job_json=spec.model_dump_json(),
                    new_attempt=new_attempt,
                    digest=digest,
                )
                state = self.get(spec.job_id)
                _check_same_spec(reply.outcome, state, digest, reply.digest)
                key = (spec.job_id, state.attempt)
                # After an interrupted submit its message may be lost with the old master
                # even if the state says enqueued: published again (a duplicate is refused).
                again = key in self._interrupted
                if state.queued and (again or not state.enqueued):
                    self._enqueue(spec, state, again=again)
                    state = self.get(spec.job_id)
                connect.replicated_sync(self._redis, f"submit of {spec.job_id}", strict=True)
            self._interrupted.pop(key, None)
        except StoreRefused:
            raise
        except (ServiceUnavailable, JobNotFound) as exc:  # JobNotFound: the failover lost it
            if key is not None:
                self._interrupted.setdefault(key, uuid.uuid4().hex)
            raise ServiceUnavailable(
                f"the submit of job {spec.job_id} was interrupted ({exc.message}): it may or "
                "may not have been recorded; submitting the same spec again is safe",
                job_id=spec.job_id,
                retry_safe=True,
            ) from exc
        return Submission(reply.outcome, state)

    def requeue(self, job_id: str) -> Requeue:
        """Publish the broker message of the job's current attempt again, if it is still
        ``queued``, even though ``submit`` already published it once.

        For a job that stays ``queued`` because its message is gone: Redis came back
        from an older snapshot that predates the message's consumption (docs/durability.md).
        A running or settled attempt is left alone (``not_queued``). Requeues and submits
        racing each other publish one message at a time (``enqueue.lua``, op
        ``reclaim``): the others answer ``in_progress``. Should the old message still be
        in the queue after all, the attempt still runs once: the worker that takes the
        second delivery is refused the lease (``held`` while the first runs, ``settled``
        after) and counts it in the state's ``duplicates``.

        Raises:
            JobNotFound: Redis has no state for ``job_id``.
            InvalidJobSpec: the spec the state records is not a valid job spec.
            ServiceUnavailable: Redis or the broker did not answer.
        """
        state = self.get(job_id)
        if not state.queued:
            return Requeue(NOT_QUEUED, state)
        spec = parse_job(state.job_json)
        with _translated():
            published = self._enqueue(spec, state, again=True)
        if published:
            self._interrupted.pop((job_id, state.attempt), None)
        state = self.get(job_id)
        if published:
            return Requeue(REQUEUED, state)
        return Requeue(IN_PROGRESS if state.queued else NOT_QUEUED, state)

    def _enqueue(self, spec: JobSpec, state: JobState, *, again: bool = False) -> bool:
        """Publish the attempt's message, once however many submits race: the enqueue is
        claimed atomically first; a publish that fails gives the claim back. With
        ``again``, whether it was published before is not asked (``requeue``).

        Returns whether this call published it.
        """
        key = (spec.job_id, state.attempt)
        claim = self._interrupted.get(key) or uuid.uuid4().hex
        take = store.reclaim_enqueue if again else store.claim_enqueue
        if not take(self._redis, spec.job_id, state.attempt, claim):
            return False  # published already, or another submit is publishing it
        # Until the submit is through: if anything below fails, a retry of this client
        # takes the same claim again (should the release fail too, the claim is still
        # live) and publishes; its message may be the second, whose delivery is refused.
        self._interrupted[key] = claim
        try:
            queue.send_run(
                self._celery,
                spec,
                settings=self._settings,
                attempt=state.attempt,
                submitted_at=state.submitted_at,
            )
        except BaseException:
            with contextlib.suppress(*_REDIS_ERRORS):  # else the claim lapses by itself
                store.release_enqueue(self._redis, spec.job_id, state.attempt, claim)
            raise
        store.mark_enqueued(self._redis, spec.job_id, state.attempt, claim)
        return True

    def get(self, job_id: str) -> JobState:
        """The job's state.

        Raises:
            JobNotFound: Redis has no state for ``job_id``.
            ServiceUnavailable: Redis did not answer.
        """
        with _translated():
            state = store.read_state(self._redis, job_id)
        if state is None:
            raise JobNotFound(f"no job {job_id!r}", job_id=job_id)
        return state

    def cancel(self, job_id: str) -> JobState:
        """Ask the current attempt to stop; a settled job is left as it is.

        Raises:
            JobNotFound: Redis has no state for ``job_id``.
            ServiceUnavailable: Redis did not answer.
        """
        state = self.get(job_id)
        if not state.settled:
            with _translated():
                append_control(self._redis, job_id, control_fields(CANCEL, state.attempt))
                connect.replicated_sync(self._redis, f"cancel of {job_id}")
        return state

    def answer(self, job_id: str, interaction_id: str, answer: Mapping[str, object]) -> str:
        """Answer an open interaction (question, plan, permission); returns the control
        stream entry id. The worker validates again and reports the outcome as
        ``interaction.resolved`` or ``interaction.answer_rejected``.

        Raises:
            InteractionNotFound, InteractionClosed, InvalidAnswer: refused before sending.
            ServiceUnavailable: Redis did not answer.
        """
        try:
            state: JobState | None = self.get(job_id)
        except JobNotFound:
            state = None  # a job run outside the service (`acp-worker run --redis`)
        if state is not None and state.settled:
            raise InteractionClosed(f"job {job_id!r} has settled ({state.status})", job_id=job_id)
        current = None if state is None else state.attempt
        with _translated():
            return send_answer(self._redis, job_id, interaction_id, answer, current_attempt=current)

    def interactions(self, job_id: str) -> list[dict[str, object]]:
        """Every interaction record of the job (open and resolved), oldest first.

        Raises:
            ServiceUnavailable: Redis did not answer.
        """
        with _translated():
            return list_records(self._redis, job_id)

    def events(
        self,
        job_id: str,
        *,
        after: str | None = None,
        follow: bool = False,
        timeout: float | None = None,
        attempt: int | None = None,
    ) -> Iterator[StreamEvent]:
        """Events after stream id ``after`` (from the start by default), each exactly once.

        With ``attempt``, only that attempt's events; when it is the job's current attempt
        and ``after`` is not given, reading starts where the attempt's events begin (the
        state's ``attempt_after``), so earlier attempts are not even read.

        With ``follow``, waits for more and ends after the ``job.completed`` of
        ``attempt``, or by default of the attempt that was current when the call began
        (an earlier attempt's completion does not end it; a job with no state, e.g. one
        run by ``acp-worker run --redis``, ends at the first), or once ``timeout`` seconds
        passed without it. A completion whose error is ``handed_back`` (a draining worker
        queued the job again) does not end it: the follow goes on with the next attempt,
        as ``attempt`` then too; without ``follow``, ends at the current end of the stream. A
        cursor already past that ``job.completed`` (resuming after it) ends it too: once
        the job's state says the attempt settled and the stream, read again after that,
        has nothing more.

        The stream keeps only the newest ``events_maxlen`` events; the worker records the
        id of the last event it trimmed in the job's state (``events_trimmed_until``).
        Every read is checked against it, so events are never skipped silently: when some
        after the cursor (``after``, then the last id yielded) are gone, this raises
        instead, and resuming with ``after=`` the error's ``details["trimmed_until"]``
        reads on from the oldest event kept.

        Raises:
            EventsTrimmed: events after the cursor were trimmed before they were read.
            InvalidInput: ``after`` is not a stream id.
            ServiceUnavailable: Redis did not answer.
        """
        yield from self._events.read(
            job_id, after=after, follow=follow, timeout=timeout, attempt=attempt
        )


class _EventReader:
    """Reads a job's bounded event stream page by page, never past a silent gap.

    Split from :class:`Client` because following a stream (cursor, trim watermark, the
    end of an attempt) is its own protocol; the client only submits and asks.
    """

    def __init__(self, redis_client: redis.Redis) -> None:
        self._redis = redis_client

    def read(
        self,
        job_id: str,
        *,
        after: str | None,
        follow: bool,
        timeout: float | None,
        attempt: int | None,
    ) -> Iterator[StreamEvent]:
        """See :meth:`Client.events`."""
        state = self._state_or_none(job_id) if follow or attempt is not None else None
        last = _cursor(after or _attempt_start(state, attempt))
        until = attempt if attempt is not None else (state.attempt if state else None)
        deadline = None if timeout is None else time.monotonic() + timeout
        # The state hash is settled in the same Lua call that appends the attempt's
        # job.completed: once it reads settled, the stream read to its end again holds
        # that event, so a cursor that met no job.completed on the way was already past it.
        settled = False
        while deadline is None or time.monotonic() < deadline:
            batch = self._read(job_id, last)
            for item in batch:
                last = item.id
                if attempt is not None and item.envelope.attempt != attempt:
                    continue
                yield item
                if follow and _completes(item, until):
                    following = _handed_back_to(item)
                    if following is None:
                        return
                    # The job goes on as its next attempt: so does the follow.
                    until = following
                    attempt = following if attempt is not None else None
            if len(batch) < _PAGE:
                if not follow or settled:
                    return
                settled = self._settled(job_id, until)
                if not settled:
                    self._wait(job_id, last)

    def _settled(self, job_id: str, attempt: int | None) -> bool:
        """Whether the job's state says ``attempt`` is over (settled, or superseded by a
        later attempt, which only a settled one can be); never for a job with no state."""
        state = None if attempt is None else self._state_or_none(job_id)
        if state is None or attempt is None:
            return False
        return state.attempt > attempt or (state.attempt == attempt and state.settled)

    def _state_or_none(self, job_id: str) -> JobState | None:
        with _translated():
            return store.read_state(self._redis, job_id)

    def _read(self, job_id: str, last: str) -> list[StreamEvent]:
        """The next page after ``last``, or ``EventsTrimmed`` if part of it is gone.

        The page and the watermark are read in one MULTI/EXEC
        (:func:`worker.store.jobs.events_page`), so they describe the same instant. Read
        apart, a trim landing between the two reads would make either a hole look whole
        (watermark read first) or a page read in full look holed (watermark read after).
        """
        with _translated():
            page = store.events_page(self._redis, job_id, after=last, count=_PAGE)
        batch = [StreamEvent.from_line(entry_id, line) for entry_id, line in page.entries]
        trimmed = page.trimmed_until
        if trimmed is not None and _stream_id(trimmed) > _stream_id(last):
            raise _trimmed(job_id, last, trimmed, batch[0].id if batch else None)
        return batch

    def _wait(self, job_id: str, last: str) -> None:
        """Block until the stream has an entry after ``last`` (or ``_BLOCK_MS`` passed).

        What XREAD returns is not used: only ``_read`` sees the watermark with the page.
        """
        with _translated():
            store.wait_for_events(self._redis, job_id, after=last, block_ms=_BLOCK_MS)


def spec_digest(spec: JobSpec) -> str:
    """``sha256:<hex>`` of the spec's canonical JSON (sorted keys, defaults filled in), so
    two specs that mean the same job have the same digest however they were written."""
    canonical = json.dumps(
        spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_same_spec(outcome: str, state: JobState, digest: str, existing: str) -> None:
    """Raise ``JobConflict`` when ``submit`` found the job id taken by another spec.

    A state written before digests were recorded (or by a worker that took a message
    published without ``submit``) has none: its stored spec is digested here instead.
    """
    if outcome == "exists" and not existing:
        existing = _stored_digest(state) or digest
    if outcome not in ("exists", "conflict") or existing == digest:
        return
    retry = "as a new attempt" if state.settled else "as a new attempt once it settled"
    raise JobConflict(
        f"job {state.job_id} already exists (attempt {state.attempt}, {state.status}) with "
        f"another spec: submit this one under another job id, or {retry}",
        job_id=state.job_id,
        attempt=state.attempt,
        status=state.status,
        existing_digest=existing,
        submitted_digest=digest,
    )


def _stored_digest(state: JobState) -> str | None:
    try:
        return spec_digest(parse_job(state.job_json))
    except InvalidJobSpec:
        return None


def _attempt_start(state: JobState | None, attempt: int | None) -> str:
    """Where ``attempt``'s events begin, if the state says (the current attempt only)."""
    if state is None or attempt is None or attempt != state.attempt:
        return "0-0"
    return state.attempt_after or "0-0"


def _completes(item: StreamEvent, attempt: int | None) -> bool:
    """Whether ``item`` is the ``job.completed`` of ``attempt`` (of any, if None) or of a
    later one (which can only follow it: a resumed cursor may have passed it)."""
    if not isinstance(item.envelope.data, JobCompleted):
        return False
    return attempt is None or item.envelope.attempt >= attempt


def _handed_back_to(item: StreamEvent) -> int | None:
    """The next attempt, when ``item`` is the ``job.completed`` of an attempt a draining
    worker handed back (``cancelled``, error ``handed_back``); None otherwise."""
    data = item.envelope.data
    if not isinstance(data, JobCompleted) or data.error is None:
        return None
    if data.error.code != HandedBack.code:
        return None
    return item.envelope.attempt + 1


def _stream_id(text: str) -> tuple[int, int]:
    """``ms-seq`` (or ``ms``, meaning ``ms-0`` as Redis reads it) as a comparable pair."""
    ms, dash, seq = text.partition("-")
    parts = (ms, seq if dash else "0")
    if not all(part.isascii() and part.isdigit() and int(part) < 2**64 for part in parts):
        raise InvalidInput(f"not a stream id: {text!r} (expected MS-SEQ)", after=text)
    return int(parts[0]), int(parts[1])


def _cursor(text: str) -> str:
    ms, seq = _stream_id(text)
    return f"{ms}-{seq}"


def _trimmed(job_id: str, last: str, until: str, first: str | None) -> EventsTrimmed:
    where = "from the start" if last == "0-0" else f"after {last}"
    oldest = f"the oldest still kept is {first}" if first else "none is kept yet"
    return EventsTrimmed(
        f"events of job {job_id} {where} were trimmed off its bounded stream before they "
        f"were read (everything up to {until} is gone); {oldest}: resume after {until}",
        job_id=job_id,
        after=last,
        trimmed_until=until,
        first_available=first,
    )


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Redis and broker failures become ``ServiceUnavailable`` at this seam."""
    try:
        yield
    except (*_REDIS_ERRORS, redis.exceptions.NoPermissionError) as exc:
        raise connect.refused(exc) from exc
    except kombu.exceptions.OperationalError as exc:
        typed = connect.refused(exc)
        if isinstance(typed, StoreRefused):
            raise typed from exc
        raise ServiceUnavailable(f"the Celery broker did not answer: {exc}") from exc
