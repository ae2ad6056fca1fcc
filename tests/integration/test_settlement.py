"""Against a real Redis: a settled job never runs again from a broker message delivered
after its keys expired (the settlement record outlives them), and concurrent submits of
one job publish one broker message per attempt.

Expiry is real, with shortened TTLs (``events_ttl`` = 1 s): the tests wait for Redis to
drop the keys, never assume when it does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import kombu.exceptions
import pytest
import redis
import redis.asyncio as aioredis

from worker.client import Client, queue
from worker.client.client import spec_digest
from worker.errors import ServiceUnavailable
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.jobs.spec import parse_job
from worker.service.guarded import Delivery, run_delivery
from worker.service.reaper import mark_lost
from worker.settings import Settings
from worker.store import jobs, keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy

pytestmark = pytest.mark.integration


def _job(job_id: str) -> dict[str, Any]:
    return {
        "v": 1,
        "job_id": job_id,
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "/tmp"},
        "prompt": "scenario: hello",
    }


def _short(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, broker_url=redis_url, events_ttl=1)


async def _until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


async def _expired(client: aioredis.Redis, job_id: str) -> None:
    """Wait for Redis to expire the job's state, events and control keys."""
    job_keys = [keys.state(job_id), keys.events(job_id), keys.control(job_id)]

    async def gone() -> bool:
        return await client.exists(*job_keys) == 0

    await _until(gone, f"the keys of {job_id} to expire")


async def _settle_succeeded(client: aioredis.Redis, job_id: str, policy: SinkPolicy) -> None:
    """What a worker writes for attempt 1: the lease, then ``job.completed`` succeeded."""
    lease = await leases.acquire(client, job_id, worker_id="w", ttl=30, attempt=1)
    assert isinstance(lease, leases.Lease), lease
    emitter = EventEmitter(
        job_id=job_id, attempt=1, sinks=[FencedStreamSink(client, lease, policy=policy)]
    )
    await emitter.emit(job_completed(status="succeeded", error=None, duration_ms=1.0))
    await emitter.close()
    await leases.release(client, lease)


# --- item 8: a settled job never runs again -----------------------------------------------


async def test_a_job_reaped_lost_is_refused_when_redelivered_after_its_keys_expired(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    settings = _short(redis_url)
    got = await leases.acquire(aredis, "gone-1", worker_id="dead", ttl=0.05, attempt=1)
    assert isinstance(got, leases.Lease), got

    async def lease_lapsed() -> bool:
        return await aredis.exists(keys.lease("gone-1")) == 0

    await _until(lease_lapsed, "the dead worker's lease to lapse")
    assert await mark_lost(aredis, "gone-1", settings) == "lost"  # the reaper
    await _expired(aredis, "gone-1")

    # The dead worker's message, delivered again after the visibility timeout.
    for attempt in (1, None):
        refused = await leases.acquire(aredis, "gone-1", worker_id="w2", ttl=30, attempt=attempt)
        assert refused == leases.Refusal("gone-1", "settled", 1, "lost")
    result = await run_delivery(Delivery(_job("gone-1"), attempt=1), settings=settings, environ={})
    assert (result.outcome, result.attempt) == ("settled", 1)
    # Nothing ran, nothing was made again; the refusal is counted in the record.
    assert await aredis.exists(keys.state("gone-1"), keys.events("gone-1")) == 0
    record = await aredis.hgetall(keys.settled("gone-1"))
    assert record[b"attempt"] == b"1"
    assert record[b"status"] == b"lost"
    assert (record[b"duplicates"], record[b"last_refusal"]) == (b"1", b"settled")
    # It outlives every window in which the broker may deliver the message again.
    assert await aredis.ttl(keys.settled("gone-1")) > queue.visibility_timeout(settings)


async def test_a_job_settled_by_its_worker_is_refused_once_its_keys_expired(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    settings = _short(redis_url)
    await _settle_succeeded(aredis, "gone-2", SinkPolicy(ttl_s=1))
    await _expired(aredis, "gone-2")
    result = await run_delivery(Delivery(_job("gone-2"), attempt=1), settings=settings, environ={})
    assert (result.outcome, result.status) == ("settled", None)
    assert await aredis.exists(keys.state("gone-2")) == 0


async def test_a_job_id_submitted_again_after_its_keys_expired_goes_on_from_its_record(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    settings = _short(redis_url)
    await _settle_succeeded(aredis, "gone-3", SinkPolicy(ttl_s=1))
    await _expired(aredis, "gone-3")
    with Client(redis_url, settings=settings) as client:
        again = client.submit(_job("gone-3"))
        assert (again.outcome, again.state.attempt) == ("created", 2)
    # The old attempt's message is stale; the new one's runs.
    old = await leases.acquire(aredis, "gone-3", worker_id="w", ttl=30, attempt=1)
    assert isinstance(old, leases.Refusal)
    assert (old.reason, old.attempt) == ("stale", 2)
    new = await leases.acquire(aredis, "gone-3", worker_id="w", ttl=30, attempt=2)
    assert isinstance(new, leases.Lease)
    assert new.attempt == 2


async def test_new_attempts_and_new_job_ids_still_run(
    aredis: aioredis.Redis, redis_url: str
) -> None:
    settings = _short(redis_url)
    await _settle_succeeded(aredis, "again-1", SinkPolicy(ttl_s=3600))
    with Client(redis_url, settings=settings) as client:
        retry = client.submit(_job("again-1"), new_attempt=True)
    assert (retry.outcome, retry.state.attempt) == ("retried", 2)
    lease = await leases.acquire(aredis, "again-1", worker_id="w", ttl=30, attempt=2)
    assert isinstance(lease, leases.Lease)
    fresh = await leases.acquire(aredis, "never-seen", worker_id="w", ttl=30, attempt=None)
    assert isinstance(fresh, leases.Lease)
    assert fresh.attempt == 1


def test_the_record_outlives_the_broker_visibility_timeout_whatever_is_configured() -> None:
    floor = queue.visibility_timeout(Settings()) + queue.SETTLED_MARGIN_S
    assert queue.settled_ttl(Settings(settled_ttl=10)) == floor
    assert queue.settled_ttl(Settings(settled_ttl=10 * floor)) == 10 * floor
    assert queue.settled_ttl(Settings(events_ttl=10 * floor)) == 10 * floor


# --- item 9: one broker message per attempt -----------------------------------------------


@pytest.fixture
def slow_publish(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Publishing takes a while (a remote broker): every submit racing the first one has
    time to find the attempt not yet marked enqueued. Counts the publishes."""
    real = queue.send_run
    published: list[int] = []

    def send_run(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        real(*args, **kwargs)
        published.append(kwargs["attempt"])

    monkeypatch.setattr(queue, "send_run", send_run)
    return published


def _submit_concurrently(redis_url: str, job_id: str, *, n: int, new_attempt: bool) -> list[str]:
    settings = Settings(redis_url=redis_url, broker_url=redis_url)
    clients = [Client(redis_url, settings=settings) for _ in range(n)]
    start = threading.Barrier(n)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def submit(client: Client) -> None:
        try:
            start.wait(timeout=30)
            outcomes.append(client.submit(_job(job_id), new_attempt=new_attempt).outcome)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for client in clients:
        client.close()
    assert not errors, errors
    assert len(outcomes) == n
    return outcomes


def test_eight_concurrent_submits_publish_one_message_per_attempt(
    redis_url: str, slow_publish: list[int]
) -> None:
    outcomes = _submit_concurrently(redis_url, "race-1", n=8, new_attempt=False)
    assert sorted(outcomes) == ["created"] + ["exists"] * 7
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1
        assert raw.hget(keys.state("race-1"), "enqueued") == b"1"
        assert not raw.hexists(keys.state("race-1"), "enqueue_claim")
    assert slow_publish == [1]

    asyncio.run(_settle_attempt(redis_url, "race-1", 1))
    outcomes = _submit_concurrently(redis_url, "race-1", n=8, new_attempt=True)
    assert sorted(outcomes) == ["exists"] * 7 + ["retried"]
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 2  # one more, for attempt 2
    assert slow_publish == [1, 2]


async def _settle_attempt(redis_url: str, job_id: str, attempt: int) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        lease = await leases.acquire(client, job_id, worker_id="w", ttl=30, attempt=attempt)
        assert isinstance(lease, leases.Lease), lease
        sink = FencedStreamSink(client, lease, policy=SinkPolicy())
        emitter = EventEmitter(job_id=job_id, attempt=attempt, sinks=[sink])
        await emitter.emit(job_completed(status="failed", error=None, duration_ms=1.0))
        await emitter.close()
        await leases.release(client, lease)
    finally:
        await client.aclose()


def test_a_failed_publish_gives_the_claim_back_so_a_retry_publishes(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = queue.send_run

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise kombu.exceptions.OperationalError("broker down")

    settings = Settings(redis_url=redis_url, broker_url=redis_url)
    with Client(redis_url, settings=settings) as client:
        monkeypatch.setattr(queue, "send_run", broker_down)
        with pytest.raises(ServiceUnavailable):
            client.submit(_job("pub-1"))
        monkeypatch.setattr(queue, "send_run", real)
        again = client.submit(_job("pub-1"))
        assert again.state.enqueued
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1


def test_a_claim_held_by_a_vanished_submitter_lapses(redis_url: str) -> None:
    settings = Settings(redis_url=redis_url, broker_url=redis_url)
    with Client(redis_url, settings=settings) as client, redis.Redis.from_url(redis_url) as raw:
        spec = parse_job(_job("claim-1"))
        digest = spec_digest(spec)
        jobs.submit(
            raw, "claim-1", job_json=spec.model_dump_json(), new_attempt=False, digest=digest
        )
        # A submitter claimed the publish and died before publishing (its claim lasts).
        assert jobs.claim_enqueue(raw, "claim-1", 1, "dead", hold_ms=3_600_000)
        waiting = client.submit(_job("claim-1"))
        assert not waiting.state.enqueued
        assert raw.llen("runs") == 0
        # Once its claim lapsed (held 0 ms here), the next submit publishes.
        raw.hdel(keys.state("claim-1"), "enqueue_claim")
        assert jobs.claim_enqueue(raw, "claim-1", 1, "dead", hold_ms=0)
        assert client.submit(_job("claim-1")).state.enqueued
        assert raw.llen("runs") == 1


def test_a_submit_interrupted_mid_publish_is_retried_by_its_client_at_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover in the middle of a submit: the publish fails and so does giving the
    claim back (Redis is gone too), so the claim stays live. The error says a retry is
    safe; the same client's retry takes its own claim again and publishes at once (another
    client's would wait for the claim to lapse), and a further submit publishes nothing."""
    real = queue.send_run

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise kombu.exceptions.OperationalError("broker down")

    def redis_down(*args: Any, **kwargs: Any) -> None:
        raise redis.exceptions.ConnectionError("Redis down")

    settings = Settings(redis_url=redis_url, broker_url=redis_url)
    with Client(redis_url, settings=settings) as client, redis.Redis.from_url(redis_url) as raw:
        monkeypatch.setattr(queue, "send_run", broker_down)
        monkeypatch.setattr(jobs, "release_enqueue", redis_down)
        with pytest.raises(ServiceUnavailable) as failed:
            client.submit(_job("mid-1"))
        assert failed.value.details == {"job_id": "mid-1", "retry_safe": True}
        monkeypatch.setattr(queue, "send_run", real)
        with Client(redis_url, settings=settings) as other:
            assert not other.submit(_job("mid-1")).state.enqueued  # the claim is live
        assert raw.llen("runs") == 0
        assert client.submit(_job("mid-1")).state.enqueued
        assert client.submit(_job("mid-1")).outcome == "exists"
        assert raw.llen("runs") == 1


def test_a_submit_whose_replication_is_unknown_publishes_again_when_retried(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit's writes went through but the master died before ``WAIT`` answered: the
    message may be lost with it, so the retry publishes it again even though the state
    says enqueued. A duplicate message costs a refused delivery; a lost one, the job."""
    from worker.store import connect

    real = connect.replicated_sync
    calls = {"n": 0}

    def dies_once(*args: Any, **kwargs: Any) -> int | None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise redis.exceptions.ConnectionError("master gone")
        return real(*args, **kwargs)

    monkeypatch.setattr(connect, "replicated_sync", dies_once)
    settings = Settings(redis_url=redis_url, broker_url=redis_url)
    with Client(redis_url, settings=settings) as client, redis.Redis.from_url(redis_url) as raw:
        with pytest.raises(ServiceUnavailable, match="submitting the same spec again is safe"):
            client.submit(_job("mid-2"))
        assert raw.llen("runs") == 1
        assert client.submit(_job("mid-2")).outcome == "exists"
        assert raw.llen("runs") == 2
        client.submit(_job("mid-2"))
        assert raw.llen("runs") == 2
