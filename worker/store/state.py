"""One typed view of a job's state hash ``acpw:{J}:state``, and the worker's small writes
to it outside the Lua programs.

:class:`JobState` is parsed from the hash as Redis returns it (bytes or text) by both
the synchronous control-plane client and the asyncio worker: whatever reads the state
asks it, never the raw hash, so a field name is spelled only in :mod:`.fields`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from worker.store import fields as f
from worker.store import keys, scripts


def text(value: object) -> str:
    """A Redis reply (bytes or text) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def text_or_none(value: object) -> str | None:
    return None if value is None else text(value)


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as its state hash describes it; ``fields`` is the whole hash, as text."""

    job_id: str
    attempt: int
    status: str
    fields: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_hash(cls, job_id: str, raw: Mapping[Any, Any]) -> JobState:
        """Parse ``HGETALL`` of the state hash (not empty: a job with no state has none)."""
        values = {text(k): text(v) for k, v in raw.items()}
        attempt = int(values.get(f.ATTEMPT, 1))
        return cls(job_id, attempt, values.get(f.STATUS, f.QUEUED), values)

    @property
    def settled(self) -> bool:
        return self.status in f.TERMINAL_STATUSES

    @property
    def running(self) -> bool:
        return self.status == f.RUNNING

    @property
    def queued(self) -> bool:
        return self.status == f.QUEUED

    @property
    def enqueued(self) -> bool:
        """Whether ``submit`` already queued this attempt's message."""
        return self.fields.get(f.ENQUEUED) == "1"

    @property
    def submitted_at(self) -> float:
        """When the attempt was submitted (epoch seconds; now if the state does not say)."""
        return float(self.fields.get(f.SUBMITTED_AT, time.time() * 1000)) / 1000

    @property
    def started_at_ms(self) -> str | None:
        return self.fields.get(f.STARTED_AT)

    @property
    def fence(self) -> int | None:
        """The last fencing token issued for this job (None: never leased here)."""
        raw = self.fields.get(f.FENCE)
        return int(raw) if raw is not None and raw.isdigit() else None

    @property
    def last_seq(self) -> int:
        """The seq of the current attempt's last event written (0: none yet)."""
        if self.fields.get(f.EV_ATTEMPT) != str(self.attempt):
            return 0
        return int(self.fields.get(f.EV_SEQ) or 0)

    @property
    def spec_digest(self) -> str | None:
        return self.fields.get(f.SPEC_DIGEST)

    @property
    def job_json(self) -> str:
        """The current attempt's job spec as recorded ('' when the state has none)."""
        return self.fields.get(f.JOB, "")

    @property
    def attempt_after(self) -> str | None:
        """The stream id after which the current attempt's events begin."""
        return self.fields.get(f.ATTEMPT_AFTER) or None

    def to_dict(self) -> dict[str, object]:
        """What ``acp-worker status --json`` prints: the hash less its bookkeeping."""
        extra = {k: v for k, v in self.fields.items() if k not in f.INTERNAL}
        return {**extra, "job_id": self.job_id, "attempt": self.attempt, "status": self.status}


async def read_state(client: aioredis.Redis, job_id: str) -> JobState | None:
    """The job's state, or None when Redis holds none."""
    raw = await client.hgetall(keys.state(job_id))
    return JobState.from_hash(job_id, raw) if raw else None


async def record_refusal(client: aioredis.Redis, job_id: str, reason: str) -> None:
    """Count a delivery that did not get the lease, and say why (``last_refusal``), in the
    job's state, or in its settlement record when its other keys expired (no state is
    made for it); see ``lua/refuse.lua``."""
    await scripts.bound(client, scripts.REFUSE)(keys=keys.job_keys(job_id), args=[reason])


async def issued_fence(client: aioredis.Redis, job_id: str) -> int | None:
    """The last fencing token this Redis issued for ``job_id`` (None: it issued none)."""
    raw = text_or_none(await client.hget(keys.state(job_id), f.FENCE))
    return int(raw) if raw is not None and raw.isdigit() else None


async def lease_holder(client: aioredis.Redis, job_id: str) -> str | None:
    """The token holding the job's lease now (None: nobody holds it); the lease's value
    is ``<token>:<nonce>`` (``lua/acquire.lua``), the nonce is left out."""
    value = text_or_none(await client.get(keys.lease(job_id)))
    return None if value is None else value.split(":", 1)[0]
