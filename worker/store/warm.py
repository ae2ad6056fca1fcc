"""The Redis record of warm slots (``worker.job.warm``): one string per slot, whose TTL
is the slot's lease.

    idle <owner>                      waiting; renewed by the pool process ``owner``
                                      (its ``acpw.owner`` label) while it lives
    claimed <job> <attempt> <token>   taken by that attempt (its lease's fencing token);
                                      never idle again, it lapses on its own

A claim is atomic (``lua/warm_claim.lua``): of two claims of one slot exactly one wins,
and none wins once the slot's lease lapsed or the pool retired it. The reaper destroys a
sandbox labelled as an unclaimed slot whose record is gone (``slot_recorded``).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from worker.store import keys, scripts


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


async def register(client: aioredis.Redis, slot_id: str, *, owner: str, ttl_s: float) -> bool:
    """Record a new idle slot of ``owner`` (False: the id is taken)."""
    script = scripts.bound(client, scripts.WARM_RENEW)
    return bool(await script(keys=[keys.warm_slot(slot_id)], args=[owner, _ms(ttl_s), 1]))


async def renew(client: aioredis.Redis, slot_id: str, *, owner: str, ttl_s: float) -> bool:
    """Extend an idle slot's lease; False once it is not ``owner``'s idle slot."""
    script = scripts.bound(client, scripts.WARM_RENEW)
    return bool(await script(keys=[keys.warm_slot(slot_id)], args=[owner, _ms(ttl_s), 0]))


async def claim(
    client: aioredis.Redis,
    slot_id: str,
    *,
    owner: str,
    job_id: str,
    attempt: int,
    token: str,
    ttl_s: float,
) -> bool:
    """Take ``owner``'s idle slot for one attempt; True for exactly one claimant."""
    script = scripts.bound(client, scripts.WARM_CLAIM)
    args: list[str | int] = [owner, job_id, attempt, token, _ms(ttl_s)]
    return bool(await script(keys=[keys.warm_slot(slot_id)], args=args))


async def retire(client: aioredis.Redis, slot_id: str, *, owner: str) -> bool:
    """Drop ``owner``'s idle slot from the record (it can no longer be claimed)."""
    script = scripts.bound(client, scripts.WARM_RETIRE)
    return bool(await script(keys=[keys.warm_slot(slot_id)], args=[owner]))


async def slot_recorded(client: aioredis.Redis, slot_id: str) -> bool:
    """Whether the slot's record (idle or claimed) is still alive."""
    return bool(await client.exists(keys.warm_slot(slot_id)))
