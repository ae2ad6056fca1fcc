"""Durable interaction records in ``acpw:{J}:interactions`` (a hash by interaction id).

A record is written *before* its ``interaction.requested`` event, so a control plane that
sees the event can always find the record; it is rewritten when the interaction
resolves. Records expire with the job's other keys (``ttl_s`` after the last write).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from worker import keys
from worker.errors import ServiceUnavailable
from worker.leases.lease import REDIS_ERRORS

OPEN = "open"
RESOLVED = "resolved"


class InteractionStore:
    """Reads and writes one job's interaction records."""

    def __init__(self, client: aioredis.Redis, job_id: str, *, ttl_s: int) -> None:
        self._client = client
        self._key = keys.interactions(job_id)
        self._ttl = ttl_s

    async def put(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` under its ``interaction_id``.

        Raises:
            ServiceUnavailable: Redis did not take the write.
        """
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(self._key, record["interaction_id"], text)
                pipe.expire(self._key, self._ttl)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            raise ServiceUnavailable(f"could not persist an interaction: {exc}") from exc

    async def get(self, interaction_id: str) -> dict[str, Any] | None:
        raw = await self._client.hget(self._key, interaction_id)
        return None if raw is None else dict(json.loads(raw))
