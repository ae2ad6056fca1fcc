"""The control-plane client: submit, inspect, follow and cancel jobs over Redis.

``Client`` is synchronous (a control plane is often a plain web service). Events are read
from an explicit stream id, never from ``$``, so a reader that resumes from the last id it
saw gets every later event exactly once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kombu.exceptions
import redis
import redis.exceptions

from worker import keys
from worker.client import queue
from worker.control.watch import CANCEL, control_fields
from worker.errors import InteractionClosed, JobNotFound, ServiceUnavailable
from worker.events.models import TERMINAL_TYPE
from worker.interactions.send import list_records, send_answer
from worker.jobs.spec import JobSpec, parse_job
from worker.leases import scripts
from worker.leases.lease import job_keys
from worker.settings import Settings

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
_PAGE = 500
_BLOCK_MS = 1000
_CONTROL_MAXLEN = 1000


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as its state hash describes it."""

    job_id: str
    attempt: int
    status: str
    fields: Mapping[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        hidden = {"job", "token", "fence", "ev_attempt"}
        extra = {k: v for k, v in self.fields.items() if k not in hidden}
        return {**extra, "job_id": self.job_id, "attempt": self.attempt, "status": self.status}


@dataclass(frozen=True, slots=True)
class Submission:
    """What ``submit`` did: ``created``, ``retried`` (a new attempt) or ``exists``."""

    outcome: str
    state: JobState


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One canonical event with the stream id to resume after."""

    id: str
    event: Mapping[str, Any]
    line: str


class Client:
    """Talks to the job service through Redis (state, events, control) and the broker."""

    def __init__(self, redis_url: str, *, settings: Settings | None = None) -> None:
        self._settings = (settings or Settings()).model_copy(update={"redis_url": redis_url})
        self._redis = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
        self._celery = queue.make_celery(self._settings, name="acp-worker-client")

    def close(self) -> None:
        self._redis.close()
        self._celery.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, job: JobSpec | Mapping[str, Any], *, new_attempt: bool = False) -> Submission:
        """Submit ``job``; the same ``job_id`` again returns the existing job unchanged.

        A settled job runs again only with ``new_attempt=True`` (``attempt`` + 1).

        Raises:
            InvalidJobSpec: ``job`` is not a valid job spec.
            ServiceUnavailable: Redis or the broker did not answer.
        """
        spec = job if isinstance(job, JobSpec) else parse_job(dict(job))
        with _translated():
            reply = self._redis.eval(
                scripts.SUBMIT, 4, *job_keys(spec.job_id), spec.model_dump_json(), int(new_attempt)
            )
            outcome = _text(reply[0])
            state = self.get(spec.job_id)
            if state.status == "queued" and state.fields.get("enqueued") != "1":
                self._enqueue(spec, state)
                state = self.get(spec.job_id)
        return Submission(outcome, state)

    def _enqueue(self, spec: JobSpec, state: JobState) -> None:
        submitted = float(state.fields.get("submitted_at", time.time() * 1000)) / 1000
        queue.send_run(
            self._celery,
            spec,
            settings=self._settings,
            attempt=state.attempt,
            submitted_at=submitted,
        )
        self._redis.hset(keys.state(spec.job_id), "enqueued", "1")

    def get(self, job_id: str) -> JobState:
        """The job's state.

        Raises:
            JobNotFound: Redis has no state for ``job_id``.
            ServiceUnavailable: Redis did not answer.
        """
        with _translated():
            raw = self._redis.hgetall(keys.state(job_id))
        if not raw:
            raise JobNotFound(f"no job {job_id!r}", job_id=job_id)
        fields = {_text(k): _text(v) for k, v in raw.items()}
        attempt = int(fields.get("attempt", 1))
        return JobState(job_id, attempt, fields.get("status", "queued"), fields)

    def cancel(self, job_id: str) -> JobState:
        """Ask the current attempt to stop; a settled job is left as it is.

        Raises:
            JobNotFound: Redis has no state for ``job_id``.
            ServiceUnavailable: Redis did not answer.
        """
        state = self.get(job_id)
        if not state.settled:
            with _translated():
                fields: dict[Any, Any] = control_fields(CANCEL, state.attempt)
                self._redis.xadd(
                    keys.control(job_id),
                    fields,
                    maxlen=_CONTROL_MAXLEN,
                    approximate=True,
                )
        return state

    def answer(self, job_id: str, interaction_id: str, answer: Mapping[str, Any]) -> str:
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

    def interactions(self, job_id: str) -> list[dict[str, Any]]:
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
    ) -> Iterator[StreamEvent]:
        """Events after stream id ``after`` (from the start by default).

        With ``follow``, waits for more and ends after the ``job.completed`` of the
        job's current attempt, or once ``timeout`` seconds passed without it; without
        ``follow``, ends at the current end of the stream.

        Raises:
            ServiceUnavailable: Redis did not answer.
        """
        last = after or "0-0"
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            batch = self._read(job_id, last, follow)
            for item in batch:
                last = item.id
                yield item
                if follow and self._final(job_id, item):
                    return
            if not batch and not follow:
                return

    def _read(self, job_id: str, last: str, follow: bool) -> list[StreamEvent]:
        key = keys.events(job_id)
        entries: Any
        with _translated():
            if follow:
                reply: Any = self._redis.xread({key: last}, count=_PAGE, block=_BLOCK_MS)
                entries = reply[0][1] if reply else []
            else:
                entries = self._redis.xrange(key, min=f"({last}", count=_PAGE)
        return [_stream_event(entry_id, fields) for entry_id, fields in entries]

    def _final(self, job_id: str, item: StreamEvent) -> bool:
        if item.event.get("type") != TERMINAL_TYPE:
            return False
        current = self.get(job_id).attempt
        return int(item.event.get("attempt", 0)) >= current


def _stream_event(entry_id: Any, fields: Mapping[Any, Any]) -> StreamEvent:
    line = _text(fields.get(b"event") or fields.get("event") or "{}")
    return StreamEvent(_text(entry_id), json.loads(line), line)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Redis and broker failures become ``ServiceUnavailable`` at this seam."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise ServiceUnavailable(f"Redis did not answer: {exc}") from exc
    except kombu.exceptions.OperationalError as exc:
        raise ServiceUnavailable(f"the Celery broker did not answer: {exc}") from exc
