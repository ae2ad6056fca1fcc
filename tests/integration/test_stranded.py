"""The reaper's stranded-job sweep against real Redis: a job left ``queued`` and
``enqueued`` with its broker message gone (a failover took it mid-delivery) is requeued
once it was queued longer than ``ACPW_REQUEUE_STRANDED_AFTER_S`` and two passes found no
message of it; a job whose message is in the queue or delivered (kombu's ``unacked``),
one younger than the grace and one with a lease are left alone. End to end, a served
worker's own reaper requeues a stranded job and the worker runs it once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from tests.integration.test_redis_tls import PASSWORD as ACL_PASSWORD
from tests.integration.test_redis_tls import operators_acl
from tests.integration.test_service import (
    BROKER_URL,
    Worker,
    assert_contiguous,
    completed,
    job,
)
from tests.redis_servers import start_redis
from worker import metrics
from worker.client import Client
from worker.service.reaper import reap_once
from worker.service.stranded import requeue_stranded
from worker.settings import Settings
from worker.store import broker, keys

pytestmark = pytest.mark.integration

QUEUE = Settings().queue


@pytest.fixture
def raw_broker() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(BROKER_URL) as raw:
        raw.flushdb()
        yield raw
        raw.flushdb()


def _settings(redis_url: str, tmp_path: Path, grace: float) -> Settings:
    return Settings(
        redis_url=redis_url,
        broker_url=BROKER_URL,
        requeue_stranded_after_s=grace,
        reaper_interval=60,
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        session_dir=tmp_path / "sessions",
    )


def _messages(raw: redis.Redis) -> dict[str, list[bytes]]:
    """The queue's messages by the job they run."""
    out: dict[str, list[bytes]] = {}
    for message in raw.lrange(QUEUE, 0, -1):
        delivery = broker.delivery_of(message)
        assert delivery is not None
        out.setdefault(delivery[0], []).append(message)
    return out


def _take(raw: redis.Redis, job_id: str) -> bytes:
    """Pop ``job_id``'s message off the queue, as a consumer (or a lost failover) did."""
    (message,) = _messages(raw)[job_id]
    assert raw.lrem(QUEUE, 1, message) == 1
    return message


async def test_the_reaper_requeues_a_job_whose_message_is_gone_and_no_other(
    redis_url: str, aredis: aioredis.Redis, raw_broker: redis.Redis, tmp_path: Path
) -> None:
    ids = ("st-gone", "st-listed", "st-unacked", "st-leased")
    with Client(redis_url, settings=_settings(redis_url, tmp_path, 60)) as client:
        for job_id in ids:
            client.submit(job(job_id))
    _take(raw_broker, "st-gone")
    # Delivered, not acknowledged: in kombu's unacked hash as [message, exchange, key].
    unacked = json.loads(_take(raw_broker, "st-unacked"))
    raw_broker.hset(broker.UNACKED, "tag-1", json.dumps([unacked, "", QUEUE]))
    # Taken by a consumer that holds its lease (and has not recorded it running yet).
    _take(raw_broker, "st-leased")
    await aredis.set(keys.lease("st-leased"), "1:n", px=60_000)
    counted = metrics.REQUEUED_STRANDED._value.get()

    young = await reap_once(aredis, _settings(redis_url, tmp_path, 3600), {})
    assert young.requeued == ()
    assert await aredis.zcard(keys.STRANDED) == 0  # too young to be looked for

    settings = _settings(redis_url, tmp_path, 0.05)
    time.sleep(0.1)
    first = await reap_once(aredis, settings, {})
    assert first.requeued == ()  # one pass found it gone: not yet
    assert [i.decode() for i in await aredis.zrange(keys.STRANDED, 0, -1)] == ["st-gone"]
    time.sleep(0.1)
    second = await reap_once(aredis, settings, {})
    assert second.to_dict()["requeued"] == ["st-gone"]
    assert metrics.REQUEUED_STRANDED._value.get() == counted + 1
    queued = _messages(raw_broker)
    assert sorted((j, len(m)) for j, m in queued.items()) == [("st-gone", 1), ("st-listed", 1)]
    assert await aredis.zcard(keys.STRANDED) == 0
    time.sleep(0.1)
    third = await reap_once(aredis, settings, {})
    assert third.requeued == ()  # its message is queued again
    assert len(_messages(raw_broker)["st-gone"]) == 1
    # A finding of an earlier pass is void once the job is leased.
    await aredis.zadd(keys.STRANDED, {"st-leased": time.time() - 60})
    assert (await reap_once(aredis, settings, {})).requeued == ()
    assert await aredis.zscore(keys.STRANDED, "st-leased") is None


async def test_a_served_workers_reaper_requeues_a_stranded_job_which_runs_once(
    redis_url: str, raw_broker: redis.Redis, tmp_path: Path
) -> None:
    with Client(redis_url, settings=_settings(redis_url, tmp_path, 60)) as client:
        client.submit(job("st-served"))
        _take(raw_broker, "st-served")
        served = Worker(
            tmp_path / "worker.log",
            worker_id="it-stranded",
            env={"ACPW_REQUEUE_STRANDED_AFTER_S": "0.2"},
        )
        try:
            events = [dict(e.event) for e in client.events("st-served", follow=True, timeout=60)]
        finally:
            served.stop()
        state = client.get("st-served")
    assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [(1, "succeeded")]
    assert [e["type"] for e in events].count("job.started") == 1
    assert_contiguous(events)
    assert state.fields.get("duplicates") is None
    assert "requeued" in served.log.read_text()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://guest@127.0.0.1:1//", "not readable as Redis"),
        ("redis://127.0.0.1:1/0", "did not answer"),
    ],
)
async def test_a_broker_the_reaper_cannot_read_skips_the_sweep_with_a_log_line(
    redis_url: str,
    aredis: aioredis.Redis,
    raw_broker: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    url: str,
    said: str,
) -> None:
    with Client(redis_url, settings=_settings(redis_url, tmp_path, 60)) as client:
        client.submit(job("st-blind"))
    caplog.set_level(logging.INFO, logger="worker.service.stranded")
    _take(raw_broker, "st-blind")
    settings = _settings(redis_url, tmp_path, 0.01).model_copy(update={"broker_url": url})
    time.sleep(0.05)
    for _ in range(2):
        assert await requeue_stranded(aredis, settings) == []
        time.sleep(0.05)
    assert said in caplog.text
    assert await aredis.zcard(keys.STRANDED) == 0  # never judged: nothing was read


async def test_the_sweep_needs_no_more_than_the_operators_acl(tmp_path: Path) -> None:
    """Store and broker one Redis whose only user is docs/durability.md's operator's."""
    server = start_redis(tmp_path / "redis", users=[operators_acl()])
    try:
        url = f"redis://acpw:{ACL_PASSWORD}@127.0.0.1:{server.port}/0"
        settings = _settings(url, tmp_path, 0.01).model_copy(update={"broker_url": url})
        admin = server.admin()  # the test's own reads and the lost pop: not the ACL's
        with Client(url, settings=settings) as client:
            client.submit(job("st-acl"))
        _take(admin, "st-acl")
        store = aioredis.Redis.from_url(url)
        try:
            time.sleep(0.05)
            assert await requeue_stranded(store, settings) == []
            time.sleep(0.05)
            assert await requeue_stranded(store, settings) == ["st-acl"]
        finally:
            await store.aclose()
        assert list(_messages(admin)) == ["st-acl"]
        admin.close()
    finally:
        server.stop()
