"""How the fenced Redis Stream sink fails, against a real Redis: typed, once, and never
taking the job's other sinks down with it (``acp-worker run --redis`` relies on this)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from worker.errors import LeaseLost, SinkUnavailable
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import Notice
from worker.events.sinks import MemorySink
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Lease

pytestmark = pytest.mark.integration


async def _notice(emitter: EventEmitter, text: str) -> None:
    await emitter.emit(Notice(level="info", code="t", message=text))


async def _until_raised(emitter: EventEmitter) -> tuple[Exception, int]:
    """Emit notices until one raises; returns the error and how many went out before."""
    for i in range(300):
        try:
            await _notice(emitter, str(i))
        except (SinkUnavailable, LeaseLost) as exc:
            return exc, i
        await asyncio.sleep(0.01)
    raise AssertionError("the sink never reported its failure")


async def _take(client: aioredis.Redis, job_id: str, attempt: int | None = None) -> Lease:
    got = await leases.acquire(client, job_id, worker_id="w1", ttl=30, attempt=attempt)
    assert isinstance(got, Lease), got
    return got


@pytest.fixture
async def nowhere() -> AsyncIterator[aioredis.Redis]:
    """A client of a Redis that is not there (connections refused at once)."""
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    yield client
    await client.aclose()


async def test_redis_gone_for_good_raises_once_and_keeps_the_other_sinks(
    nowhere: aioredis.Redis,
) -> None:
    lease = Lease("job-s1", 1, 1, "w1")
    policy = SinkPolicy(retry_for=0.3)
    local = MemorySink()
    sink = FencedStreamSink(nowhere, lease, policy=policy, raise_when_broken=True)
    emitter = EventEmitter(job_id="job-s1", attempt=1, sinks=[local, sink])
    started = time.monotonic()
    raised, before = await _until_raised(emitter)
    assert isinstance(raised, SinkUnavailable)
    assert time.monotonic() - started < 3  # the retry budget, not forever
    assert sink.broken
    await _notice(emitter, "after")  # the failed sink is out; the others go on
    await emitter.emit(job_completed(status="failed", error=None, duration_ms=1.0))
    assert [e["seq"] for e in local.events] == list(range(1, before + 4))
    with pytest.raises(SinkUnavailable) as info:
        await emitter.close()
    assert info.value.details["undelivered"] >= 1


async def test_by_default_a_broken_sink_reports_only_at_close(nowhere: aioredis.Redis) -> None:
    broken = asyncio.Event()
    sink = FencedStreamSink(
        nowhere, Lease("job-s2", 1, 1, "w1"), policy=SinkPolicy(retry_for=0.2), on_broken=broken.set
    )
    emitter = EventEmitter(job_id="job-s2", attempt=1, sinks=[sink])
    await _notice(emitter, "0")
    await asyncio.wait_for(broken.wait(), 5)
    await _notice(emitter, "1")  # dropped quietly: the service cancels through on_broken
    with pytest.raises(SinkUnavailable):
        await emitter.close()


async def test_a_taken_over_lease_raises_lease_lost_and_writes_nothing_more(
    aredis: aioredis.Redis,
) -> None:
    old = await _take(aredis, "job-s3")
    local = MemorySink()
    sink = FencedStreamSink(aredis, old, policy=SinkPolicy(), raise_when_broken=True)
    emitter = EventEmitter(job_id="job-s3", attempt=1, sinks=[local, sink])
    await _notice(emitter, "mine")
    for _ in range(100):  # let the first batch land
        if await aredis.xlen(keys.events("job-s3")):
            break
        await asyncio.sleep(0.01)
    await aredis.delete(keys.lease("job-s3"))
    await _take(aredis, "job-s3", attempt=2)
    raised, _ = await _until_raised(emitter)
    assert isinstance(raised, LeaseLost)
    await emitter.emit(job_completed(status="failed", error=None, duration_ms=1.0))
    with pytest.raises(LeaseLost):
        await emitter.close()
    assert local.events[-1]["type"] == "job.completed"
    stored = [json.loads(f[b"event"]) for _, f in await aredis.xrange(keys.events("job-s3"))]
    assert [e["data"]["message"] for e in stored] == ["mine"]
