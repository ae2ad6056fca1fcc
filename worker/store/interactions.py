"""Durable interaction records in ``acpw:{J}:interactions`` (a hash by interaction id).

A record is written *before* its ``interaction.requested`` event, so a control plane that
sees the event can always find the record; it is rewritten when the interaction
resolves. Records expire with the job's other keys (``ttl_s`` after the last write).

Every write is fenced like the job's events: ``scripts.PUT_INTERACTION`` compares the
writer's lease token with the job's lease in the same program that writes, so a worker
that lost its lease cannot touch the records of the owner that took over. A job run
outside the service (no lease, token ``None``) writes unfenced.

The control plane reads the records synchronously (:func:`read_record`,
:func:`read_records`) before it sends an answer.

The redis package is imported only by a store that is built: the interaction broker
names this module for every job, a job without Redis never builds one (and a CLI run
without ``--redis`` loads no redis module).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from worker.errors import LeaseLost, ServiceUnavailable
from worker.store import keys

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

OPEN = "open"
RESOLVED = "resolved"


class InteractionStore:
    """Reads and writes one job's interaction records."""

    def __init__(
        self, client: aioredis.Redis, job_id: str, *, ttl_s: int, token: int | None = None
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._keys = [keys.lease(job_id), keys.interactions(job_id)]
        self._key = keys.interactions(job_id)
        self._ttl = ttl_s
        from worker.store import scripts  # redis: only for a job that has it

        self._token = "" if token is None else str(token)
        self._put = scripts.bound(client, scripts.PUT_INTERACTION)

    async def put(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` under its ``interaction_id``, if this writer holds the lease.

        Raises:
            LeaseLost: the job's lease is not this writer's token; nothing was written.
            ServiceUnavailable: Redis did not take the write.
        """
        from worker.store.lease import REDIS_ERRORS

        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        args = (self._token, record["interaction_id"], text, self._ttl)
        try:
            written = await self._put(keys=self._keys, args=args)
        except REDIS_ERRORS as exc:
            raise ServiceUnavailable(f"could not persist an interaction: {exc}") from exc
        if not written:
            raise LeaseLost(
                f"job {self._job_id}: this worker's lease is gone (expired, or another owner "
                "took the job); the interaction record was not written",
                job_id=self._job_id,
                token=self._token,
            )

    async def get(self, interaction_id: str) -> dict[str, object] | None:
        raw = await self._client.hget(self._key, interaction_id)
        return None if raw is None else dict(json.loads(raw))


def read_record(client: redis.Redis, job_id: str, interaction_id: str) -> dict[str, object] | None:
    """One interaction record of the job, or None when it has no such interaction."""
    raw: Any = client.hget(keys.interactions(job_id), interaction_id)
    return None if raw is None else dict(json.loads(raw))


def read_records(client: redis.Redis, job_id: str) -> list[dict[str, object]]:
    """Every interaction record of the job, in no particular order."""
    raw: Any = client.hgetall(keys.interactions(job_id))
    return [dict(json.loads(value)) for value in raw.values()]
