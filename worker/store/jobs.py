"""The control plane's reads and writes of a job's keys (synchronous, for ``Client``).

A control plane is often a plain web service, so these take a synchronous
``redis.Redis``; the worker's side of the same keys is asyncio (:mod:`.lease`,
:mod:`.fenced`, :mod:`.control`, :mod:`.state`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from worker.store import fields, keys, scripts
from worker.store.keys import job_keys
from worker.store.state import JobState, text, text_or_none

EVENT_FIELD = "event"
"""The one field of an events stream entry: the event's JSON line."""


@dataclass(frozen=True, slots=True)
class SubmitReply:
    """What ``SUBMIT`` did: ``created``, ``retried``, ``exists`` or ``conflict``, and the
    spec digest the state holds ('' for a state recorded before digests were)."""

    outcome: str
    digest: str


@dataclass(frozen=True, slots=True)
class EventsPage:
    """Entries after a cursor as ``(stream id, event line)``, and the trim watermark read
    in the same transaction (None: nothing was ever trimmed)."""

    entries: list[tuple[str, str]]
    trimmed_until: str | None


def submit(
    client: redis.Redis, job_id: str, *, job_json: str, new_attempt: bool, digest: str
) -> SubmitReply:
    """Record a job (or a new attempt of a settled one) as ``queued``; see ``submit.lua``."""
    reply: Any = scripts.bound_sync(client, scripts.SUBMIT)(
        keys=job_keys(job_id), args=[job_json, int(new_attempt), digest]
    )
    return SubmitReply(text(reply[0]), text(reply[3]))


def read_state(client: redis.Redis, job_id: str) -> JobState | None:
    """The job's state, or None when Redis holds none."""
    raw: Any = client.hgetall(keys.state(job_id))
    return JobState.from_hash(job_id, raw) if raw else None


ENQUEUE_HOLD_MS = 60_000
"""How long a claim to publish an attempt's message holds: a submitter that died between
claiming and publishing blocks the others no longer than this."""


def claim_enqueue(
    client: redis.Redis, job_id: str, attempt: int, claim: str, *, hold_ms: int = ENQUEUE_HOLD_MS
) -> bool:
    """Whether the caller may publish ``attempt``'s message: it is the current attempt,
    queued, not yet published, and nobody else holds a live claim (``enqueue.lua``).

    Concurrent submits of one job race here, atomically, before publishing: exactly one
    wins, so one message is published per attempt.
    """
    return _enqueue_op(client, job_id, "claim", attempt, claim, hold_ms=hold_ms)


def reclaim_enqueue(
    client: redis.Redis, job_id: str, attempt: int, claim: str, *, hold_ms: int = ENQUEUE_HOLD_MS
) -> bool:
    """Whether the caller may publish ``attempt``'s message again, whether or not it was
    published before: it is the current attempt, still queued, and nobody else holds a
    live claim (``enqueue.lua``, op ``reclaim``).

    For a queued attempt whose message is gone from the broker (Redis restarted from an
    older snapshot). Requeues and submits racing each other publish one at a time: while
    one holds the claim, the others are refused.
    """
    return _enqueue_op(client, job_id, "reclaim", attempt, claim, hold_ms=hold_ms)


def mark_enqueued(client: redis.Redis, job_id: str, attempt: int, claim: str) -> None:
    """Record that ``attempt``'s message was published (a resubmit will not again), and
    index the job for the reaper's stranded-job sweep (:mod:`.queued`) from now."""
    _enqueue_op(client, job_id, "done", attempt, claim, hold_ms=0)
    client.zadd(keys.QUEUED, {job_id: time.time()})


def release_enqueue(client: redis.Redis, job_id: str, attempt: int, claim: str) -> None:
    """Drop the claim after a failed publish, so that a retry may publish."""
    _enqueue_op(client, job_id, "release", attempt, claim, hold_ms=0)


def _enqueue_op(
    client: redis.Redis, job_id: str, op: str, attempt: int, claim: str, *, hold_ms: int
) -> bool:
    reply: Any = scripts.bound_sync(client, scripts.ENQUEUE)(
        keys=job_keys(job_id), args=[op, attempt, claim, hold_ms]
    )
    return bool(reply)


def events_page(client: redis.Redis, job_id: str, *, after: str, count: int) -> EventsPage:
    """Up to ``count`` events after stream id ``after``, with the trim watermark.

    Both are read in one MULTI/EXEC, so they describe the same instant: a trim removes a
    prefix of the stream and raises the watermark to the id of its last entry atomically,
    hence entries after ``after`` are missing from the page exactly when the watermark is
    above ``after``.
    """
    pipe = client.pipeline(transaction=True)
    pipe.xrange(keys.events(job_id), min=f"({after}", count=count)
    pipe.hget(keys.state(job_id), fields.TRIMMED_UNTIL)
    entries, trimmed = pipe.execute()
    return EventsPage(
        [(text(entry_id), _line(values)) for entry_id, values in entries], text_or_none(trimmed)
    )


def wait_for_events(client: redis.Redis, job_id: str, *, after: str, block_ms: int) -> None:
    """Block until the stream has an entry after ``after`` (or ``block_ms`` passed)."""
    client.xread({keys.events(job_id): after}, count=1, block=block_ms)


def _line(values: Any) -> str:
    return text(values.get(EVENT_FIELD.encode()) or values.get(EVENT_FIELD) or "{}")
