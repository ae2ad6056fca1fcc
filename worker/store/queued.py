"""The reaper's index of published, not yet started attempts (``acpw:queued``) and of
those it found without a broker message (``acpw:stranded``).

``mark_enqueued`` (the client, once it published an attempt's message) adds the job,
scored by that time; a lease acquired drops it; the reaper drops a job it finds no longer
queued. A job published before the index existed is not in it: ``acp-worker requeue``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from worker.store import fields, keys
from worker.store.state import text, text_or_none


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job of the index as its state and lease read now."""

    job_id: str
    status: str | None  # None: no state
    attempt: int
    enqueued: bool
    claimed: bool  # a live ``enqueue_claim``: a submit or requeue is publishing it
    leased: bool

    @property
    def stranded_candidate(self) -> bool:
        """Queued, published, nobody publishing it, no lease."""
        return (
            self.status == fields.QUEUED and self.enqueued and not self.claimed and not self.leased
        )


async def published_before(client: aioredis.Redis, cutoff: float) -> list[str]:
    """Job ids of the index published at or before ``cutoff`` (epoch seconds)."""
    return [text(i) for i in await client.zrangebyscore(keys.QUEUED, "-inf", cutoff)]


async def read_waiting(client: aioredis.Redis, job_ids: list[str]) -> list[Waiting]:
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(
            keys.state(job_id),
            [fields.STATUS, fields.ATTEMPT, fields.ENQUEUED, fields.ENQUEUE_CLAIM],
        )
        pipe.exists(keys.lease(job_id))
    replies = await pipe.execute()
    now_ms = time.time() * 1000
    out = []
    for i, job_id in enumerate(job_ids):
        status, attempt, enqueued, claim = (text_or_none(v) for v in replies[2 * i])
        lapses = (claim or "").rpartition(" ")[2]
        out.append(
            Waiting(
                job_id,
                status,
                int(attempt) if attempt and attempt.isdigit() else 0,
                enqueued == "1",
                lapses.isdigit() and int(lapses) > now_ms,
                bool(replies[2 * i + 1]),
            )
        )
    return out


async def forget(client: aioredis.Redis, job_id: str) -> None:
    """Drop ``job_id`` from both indexes (it started, settled or expired)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.QUEUED, job_id)
    pipe.zrem(keys.STRANDED, job_id)
    await pipe.execute()


async def seen_stranded(client: aioredis.Redis, job_id: str, now: float) -> float:
    """Record that a pass found ``job_id`` without a message (kept if already recorded);
    returns when a pass first did."""
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.STRANDED, {job_id: now}, nx=True)
    pipe.zscore(keys.STRANDED, job_id)
    _, first = await pipe.execute()
    return float(first if first is not None else now)


async def not_stranded(client: aioredis.Redis, job_id: str) -> None:
    """Its message was found (or it was requeued): any earlier finding is void."""
    await client.zrem(keys.STRANDED, job_id)
