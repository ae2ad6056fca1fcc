"""Leases, fencing, the fenced sink and the reaper's settling against a real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.redis_proxy import RedisProxy
from worker.errors import LeaseLost
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import EventData, Notice
from worker.interactions import InteractionBroker, InteractionStore
from worker.sandbox.base import LABEL_JOB, LABEL_TOKEN, ResourceLimits, SandboxSpec
from worker.sandbox.fake import FakeBackend
from worker.service.reaper import mark_lost, reap_once
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy, _Pending
from worker.store.lease import Lease, Refusal

pytestmark = pytest.mark.integration


async def _take(client: aioredis.Redis, job_id: str, attempt: int | None = None) -> Lease:
    got = await leases.acquire(client, job_id, worker_id="w1", ttl=30, attempt=attempt)
    assert isinstance(got, Lease), got
    return got


async def _events(client: aioredis.Redis, job_id: str) -> list[dict[str, object]]:
    entries = await client.xrange(keys.events(job_id))
    return [json.loads(fields[b"event"]) for _, fields in entries]


def _emitter(client: aioredis.Redis, lease: Lease, **policy: float) -> EventEmitter:
    sink = FencedStreamSink(client, lease, policy=SinkPolicy(**policy))  # type: ignore[arg-type]
    return EventEmitter(job_id=lease.job_id, attempt=lease.attempt, sinks=[sink])


async def _notice(emitter: EventEmitter, text: str) -> None:
    await emitter.emit(Notice(level="info", code="t", message=text))


async def test_tokens_grow_and_a_live_lease_refuses_a_second_owner(aredis: aioredis.Redis) -> None:
    first = await _take(aredis, "job-l1")
    second = await leases.acquire(aredis, "job-l1", worker_id="w2", ttl=30)
    assert isinstance(second, Refusal)
    assert (second.reason, second.detail) == ("held", str(first.token))
    assert await leases.release(aredis, first)
    orphan = await leases.acquire(aredis, "job-l1", worker_id="w2", ttl=30)
    assert isinstance(orphan, Refusal)  # released unsettled: for the reaper, not a re-run
    assert orphan.reason == "orphaned"
    third = await _take(aredis, "job-l1", attempt=2)
    assert third.token > first.token


async def test_renew_fails_once_the_lease_expired(aredis: aioredis.Redis) -> None:
    lease = await _take(aredis, "job-l2")
    assert await leases.renew(aredis, lease, ttl=30)
    await aredis.delete(keys.lease("job-l2"))  # what a TTL running out does
    assert not await leases.renew(aredis, lease, ttl=30)
    assert not await leases.release(aredis, lease)


async def test_a_settled_attempt_is_not_run_again(aredis: aioredis.Redis) -> None:
    lease = await _take(aredis, "job-l3")
    emitter = _emitter(aredis, lease)
    await emitter.emit(
        job_completed(status="succeeded", stop_reason="end_turn", error=None, duration_ms=1.0)
    )
    await emitter.close()
    await leases.release(aredis, lease)
    again = await leases.acquire(aredis, "job-l3", worker_id="w2", ttl=30)
    assert isinstance(again, Refusal)
    assert again.reason == "settled"
    assert await aredis.ttl(keys.events("job-l3")) > 0  # the stream expires after settling
    nxt = await _take(aredis, "job-l3", attempt=2)
    assert (nxt.attempt, await aredis.ttl(keys.events("job-l3"))) == (2, -1)


async def test_a_worker_that_lost_its_lease_cannot_append(aredis: aioredis.Redis) -> None:
    old = await _take(aredis, "job-l4")
    old_emitter = _emitter(aredis, old)
    await _notice(old_emitter, "old-1")
    await asyncio.sleep(0.05)  # let the first batch land
    await aredis.delete(keys.lease("job-l4"))
    new = await _take(aredis, "job-l4", attempt=2)
    new_emitter = _emitter(aredis, new)
    await _notice(new_emitter, "new-1")
    await _notice(old_emitter, "old-2")
    await _notice(new_emitter, "new-2")
    await new_emitter.close()
    with pytest.raises(LeaseLost):
        await old_emitter.close()
    messages = [e["data"]["message"] for e in await _events(aredis, "job-l4")]  # type: ignore[index]
    assert messages == ["old-1", "new-1", "new-2"]


async def test_a_retried_batch_is_not_appended_twice(aredis: aioredis.Redis) -> None:
    lease = await _take(aredis, "job-l5")
    sink = FencedStreamSink(aredis, lease, policy=SinkPolicy())
    one, two = _Pending(1, "", '{"seq":1}'), _Pending(2, "", '{"seq":2}')
    assert await sink._append([one]) == 1
    assert await sink._append([one, two]) == 1  # the first try's reply was "lost"
    assert await aredis.xlen(keys.events("job-l5")) == 2


async def test_a_broken_connection_loses_nothing_and_keeps_order(
    aredis: aioredis.Redis, redis_url: str, proxy: RedisProxy
) -> None:
    flaky = aioredis.Redis.from_url(proxy.url, socket_timeout=2)
    lease = await _take(aredis, "job-l6")
    emitter = _emitter(flaky, lease, buffer_events=50, retry_for=20)
    for i in range(200):
        await _notice(emitter, str(i))
    await proxy.cut()  # Redis unreachable: the sink buffers, then waits for space
    writer = asyncio.create_task(_emit_range(emitter, 200, 400))
    await asyncio.sleep(0.5)
    assert not writer.done()  # bounded buffer: the producer is held back, nothing dropped
    await proxy.start()  # same port again
    await writer
    await emitter.close()
    await flaky.aclose()
    events = await _events(aredis, "job-l6")
    assert [e["seq"] for e in events] == list(range(1, 401))
    assert [e["data"]["message"] for e in events] == [str(i) for i in range(400)]  # type: ignore[index]


async def _emit_range(emitter: EventEmitter, start: int, stop: int) -> None:
    for i in range(start, stop):
        await _notice(emitter, str(i))


async def test_mark_lost_is_written_once_and_never_after_settling(aredis: aioredis.Redis) -> None:
    settings = Settings(redis_url="redis://unused")
    lease = await _take(aredis, "job-l7")
    emitter = _emitter(aredis, lease)
    await _notice(emitter, "before the crash")
    await emitter.close()
    assert await mark_lost(aredis, "job-l7", settings) == "alive"
    await aredis.delete(keys.lease("job-l7"))
    verdicts = await asyncio.gather(*(mark_lost(aredis, "job-l7", settings) for _ in range(5)))
    assert sorted(verdicts) == ["lost"] + ["settled"] * 4
    events = await _events(aredis, "job-l7")
    assert [(e["seq"], e["type"]) for e in events] == [(1, "notice"), (2, "job.completed")]
    assert events[-1]["data"]["status"] == "lost"  # type: ignore[index]
    assert (await aredis.hget(keys.state("job-l7"), "status")) == b"lost"


async def test_reaper_destroys_orphans_and_spares_live_and_unfenced(
    aredis: aioredis.Redis, tmp_path: Path
) -> None:
    settings = Settings(redis_url="redis://unused", work_dir=tmp_path / "work")
    backend = FakeBackend()
    live = await _take(aredis, "job-live")
    dead = await _take(aredis, "job-dead")
    await _sandbox(backend, "job-live", str(live.token))
    await _sandbox(backend, "job-dead", str(dead.token))
    await _sandbox(backend, "job-inproc", "0")
    await aredis.delete(keys.lease("job-dead"))
    await aredis.zadd(keys.LEASES, {"job-dead": 0})
    report = await reap_once(aredis, settings, {"fake": backend})
    assert report.lost == ("job-dead",)
    remaining = {info.labels[LABEL_JOB] for info in await backend.list({})}
    assert remaining == {"job-live", "job-inproc"}
    again = await reap_once(aredis, settings, {"fake": backend})
    assert (again.lost, again.destroyed) == ((), ())


async def _sandbox(backend: FakeBackend, job_id: str, token: str) -> None:
    spec = SandboxSpec(
        job_id=job_id,
        attempt=1,
        workspace=Path("/tmp"),
        pack_closure=Path("/tmp"),
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64),
        labels={LABEL_JOB: job_id, LABEL_TOKEN: token},
    )
    await backend.create(spec)


# --- interaction records are fenced like events ------------------------------------------


async def test_a_worker_that_lost_its_lease_cannot_write_an_interaction_record(
    aredis: aioredis.Redis,
) -> None:
    old = await _take(aredis, "job-i1")
    stale = InteractionStore(aredis, "job-i1", ttl_s=60, token=old.token)
    await stale.put({"interaction_id": "question-1-1-aa", "status": "open"})
    await aredis.delete(keys.lease("job-i1"))  # its TTL ran out
    with pytest.raises(LeaseLost):  # expired, nobody else yet: refused all the same
        await stale.put({"interaction_id": "question-1-1-aa", "status": "resolved"})
    new = await _take(aredis, "job-i1", attempt=2)  # another worker took the job
    owner = InteractionStore(aredis, "job-i1", ttl_s=60, token=new.token)
    await owner.put({"interaction_id": "question-1-1-aa", "status": "open", "attempt": 2})
    for record in (
        {"interaction_id": "question-1-1-aa", "status": "resolved"},
        {"interaction_id": "question-1-2-bb", "status": "open"},
    ):
        with pytest.raises(LeaseLost):
            await stale.put(record)
    assert await owner.get("question-1-1-aa") == {
        "interaction_id": "question-1-1-aa",
        "status": "open",
        "attempt": 2,
    }
    assert await aredis.hkeys(keys.interactions("job-i1")) == [b"question-1-1-aa"]
    assert 0 < await aredis.ttl(keys.interactions("job-i1")) <= 60


async def test_a_fenced_out_broker_declines_instead_of_asking(aredis: aioredis.Redis) -> None:
    lease = await _take(aredis, "job-i2")
    await aredis.set(keys.lease("job-i2"), str(lease.token + 1))  # a newer owner's token
    emitted: list[EventData] = []

    async def emit(event: EventData) -> None:
        emitted.append(event)

    broker = InteractionBroker(
        job_id="job-i2",
        attempt=1,
        emit=emit,
        store=InteractionStore(aredis, "job-i2", ttl_s=60, token=lease.token),
        timeout_s=30,
    )
    broker.begin_turn()
    reply = await asyncio.wait_for(broker.ask("question", {"questions": []}, tool_call_id=None), 5)
    assert reply["outcome"]["outcome"] == "skipped"
    assert [(e.TYPE, e.wire()["code"]) for e in emitted] == [("notice", "interaction_unavailable")]
    assert await aredis.exists(keys.interactions("job-i2")) == 0


async def test_a_job_without_a_lease_writes_its_records_unfenced(aredis: aioredis.Redis) -> None:
    store = InteractionStore(aredis, "job-i3", ttl_s=60)  # `acp-worker run --redis`, token 0
    await store.put({"interaction_id": "plan-1-1-cc", "status": "open"})
    assert await store.get("plan-1-1-cc") == {"interaction_id": "plan-1-1-cc", "status": "open"}
