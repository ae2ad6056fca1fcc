"""``worker.service.ownership.owning`` against a real Redis: the lease is given back only
once the stream settled, a refusal starts nothing, an orphaned attempt is settled lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.service.ownership import Claim, LeaseRefusedError, claim_lease, owning
from worker.settings import Settings
from worker.store import keys, scripts
from worker.store import lease as leases
from worker.store.state import read_state

pytestmark = pytest.mark.integration

SETTINGS = Settings(lease_ttl=30, lease_renew=10)
DONE = job_completed(status="succeeded", stop_reason="end_turn", error=None, duration_ms=1.0)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client made as the worker makes its own (``redis_client``). These short blocks
    exit while the control reader is mid-XREAD: before ``store.lease.still_cancelling``,
    redis-py swallowed that cancel now and then and the exit waited forever."""
    made = leases.redis_client(redis_url)
    yield made
    await made.aclose()


async def _indexed(client: aioredis.Redis, job_id: str) -> bool:
    return await client.zscore(keys.LEASES, job_id) is not None


async def test_a_settled_job_gives_its_lease_back(client: aioredis.Redis) -> None:
    async with owning(client, Claim("own-1"), settings=SETTINGS, cancel=asyncio.Event()) as owned:
        # the token and this acquire's own nonce (docs/contracts.md, Redis keys)
        assert await client.get(keys.lease("own-1")) == owned.lease.holder.encode()
        assert owned.lease.holder.startswith(f"{owned.lease.token}:")
        assert owned.labels == {"acpw.token": str(owned.lease.token)}
        emitter = EventEmitter(job_id="own-1", attempt=owned.lease.attempt, sinks=[owned.sink])
        await emitter.emit(DONE)
        await emitter.close()
    assert await client.get(keys.lease("own-1")) is None
    assert not await _indexed(client, "own-1")
    state = await read_state(client, "own-1")
    assert state is not None
    assert state.status == "succeeded"


async def test_a_job_that_never_settled_keeps_its_lease_for_the_reaper(
    client: aioredis.Redis,
) -> None:
    with pytest.raises(RuntimeError, match="a bug"):
        async with owning(client, Claim("own-2"), settings=SETTINGS, cancel=asyncio.Event()):
            raise RuntimeError("a bug before job.completed")
    # Released, the job would be `running` for good and out of the reaper's index.
    assert await client.get(keys.lease("own-2")) is not None
    assert await _indexed(client, "own-2")


async def test_a_cancel_entry_sets_cancel_while_owned(client: aioredis.Redis) -> None:
    cancel = asyncio.Event()
    async with owning(client, Claim("own-3"), settings=SETTINGS, cancel=cancel):
        await client.xadd(keys.control("own-3"), {"type": "cancel", "attempt": "1"})
        await asyncio.wait_for(cancel.wait(), 5)


async def test_a_held_lease_is_refused_and_an_orphan_is_settled_lost(
    client: aioredis.Redis,
) -> None:
    first = await leases.acquire(client, "own-4", worker_id="w1", ttl=30)
    assert isinstance(first, leases.Lease)
    with pytest.raises(LeaseRefusedError) as held:
        async with owning(client, Claim("own-4"), settings=SETTINGS, cancel=asyncio.Event()):
            pytest.fail("a held lease was granted")
    assert held.value.refusal.reason == "held"
    await client.delete(keys.lease("own-4"))  # its owner died: the lease ran out
    with pytest.raises(LeaseRefusedError) as orphan:
        async with owning(client, Claim("own-4"), settings=SETTINGS, cancel=asyncio.Event()):
            pytest.fail("an orphaned attempt was granted")
    assert orphan.value.refusal.reason == "orphaned"
    state = await read_state(client, "own-4")
    assert state is not None
    assert state.status == "lost"


async def test_the_next_attempt_waits_for_the_settled_attempts_lease(
    client: aioredis.Redis,
) -> None:
    """A new attempt (``submit --new-attempt``) can be delivered while the settled attempt
    before it still holds the lease (its work directory is removed after ``job.completed``,
    before the lease is given back). Its delivery waits for that lease instead of being
    refused, which acknowledged its message and left the attempt queued with nothing to
    run it; a duplicate delivery of a running attempt is still refused at once."""
    cancel = asyncio.Event()
    async with owning(client, Claim("own-n"), settings=SETTINGS, cancel=cancel) as first:
        emitter = EventEmitter(job_id="own-n", attempt=first.lease.attempt, sinks=[first.sink])
        await emitter.emit(DONE)
        await emitter.close()  # attempt 1 settled, its lease still held
        submit = scripts.bound(client, scripts.SUBMIT)
        retried = await submit(keys=keys.job_keys("own-n"), args=["{}", "1", "d"])
        assert retried[:2] == [b"retried", b"2"]
        second = asyncio.ensure_future(
            claim_lease(client, Claim("own-n", attempt=2), settings=SETTINGS)
        )
        await asyncio.sleep(0.3)
        assert not second.done()  # waiting, not refused
    lease, _ = await asyncio.wait_for(second, 10)  # granted once attempt 1 gave it back
    try:
        assert lease.attempt == 2
        with pytest.raises(LeaseRefusedError) as duplicate:
            async with owning(
                client, Claim("own-n", attempt=2), settings=SETTINGS, cancel=asyncio.Event()
            ):
                pytest.fail("a duplicate delivery of a running attempt was granted")
        assert duplicate.value.refusal.reason == "held"
    finally:
        await leases.release(client, lease)


async def test_each_renewal_moves_the_deadline_never_past_the_lease(
    client: aioredis.Redis,
) -> None:
    """``Owned.deadline`` (what bounds the job's sandbox) follows the heartbeat, and is
    never later than the lease's expiry in Redis."""
    settings = Settings(lease_ttl=2, lease_renew=0.1)
    before = time.monotonic()
    async with owning(client, Claim("own-d"), settings=settings, cancel=asyncio.Event()) as owned:
        first = owned.deadline.at
        assert before < first <= time.monotonic() + 2
        seen = [first]
        owned.deadline.follow(seen.append)
        while len(seen) < 3:  # two renewals
            await asyncio.sleep(0.05)
            at = owned.deadline.at
            left_ms = await client.pttl(keys.lease("own-d"))
            # Read after the reply: the expiry is at least then + what was left (PTTL
            # truncates to the ms); a clock read before the request ran early by the
            # request's latency, which failed under load.
            now = time.monotonic()
            assert at <= now + left_ms / 1000 + 0.001
        assert seen == sorted(seen)
        assert seen[-1] > first
        emitter = EventEmitter(job_id="own-d", attempt=owned.lease.attempt, sinks=[owned.sink])
        await emitter.emit(DONE)
        await emitter.close()
