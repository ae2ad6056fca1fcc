"""A served job (``run_delivery``, in-process) whose Redis goes away for longer than the
sink's retry budget: the lease is left to expire, and a reaper settles the job ``lost``
once. Real bubblewrap, the real emulator pack, a real Redis behind a real TCP proxy."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.integration.test_run_job import _job
from tests.integration.test_run_redis import _stored, _ticks
from tests.redis_proxy import RedisProxy
from worker.service.guarded import Delivery, run_delivery
from worker.service.reaper import ReapReport, reap_once
from worker.settings import Settings
from worker.store import keys

pytestmark = pytest.mark.integration


class _GaveUp(logging.Handler):
    """Sets ``event`` when the fenced sink logs that it gave up on Redis."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__(logging.ERROR)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("event sink gave up on Redis"):
            self.event.set()


@pytest.fixture
def gave_up() -> Iterator[asyncio.Event]:
    event = asyncio.Event()
    handler = _GaveUp(event)
    sink_log = logging.getLogger("worker.store.fenced")
    sink_log.addHandler(handler)
    yield event
    sink_log.removeHandler(handler)


async def _until(job_id: str, redis_url: str, text: str) -> None:
    for _ in range(600):
        if any(text in json.dumps(e) for e in _stored(redis_url, job_id)):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{text!r} never reached Redis")


async def test_a_served_job_whose_redis_stayed_away_is_settled_lost_once(
    tmp_path: Path, redis_url: str, proxy: RedisProxy, gave_up: asyncio.Event
) -> None:
    job = json.loads(_job(tmp_path, _ticks(100)).read_text())
    job["workspace"]["path"] = str(tmp_path / "ws")
    job_id = job["job_id"]
    settings = Settings(
        redis_url=proxy.url,
        lease_ttl=3,  # outlives the outage: the worker keeps its lease throughout
        lease_renew=0.5,
        sink_retry_s=0.5,
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        secrets_dir=tmp_path / "secrets",
        shutdown_eof_grace=1,
    )
    served = asyncio.create_task(run_delivery(Delivery(job), settings=settings, environ={}))
    await _until(job_id, redis_url, "tick-010")
    await proxy.cut()
    await asyncio.wait_for(gave_up.wait(), 30)  # longer than the retry budget
    await proxy.start()  # back while the job still tears down: it could release its lease
    result = await asyncio.wait_for(served, 60)
    assert result.outcome == "unsettled"
    assert result.error is not None
    assert result.error["code"] == "sink_unavailable"

    direct = aioredis.Redis.from_url(redis_url)
    try:
        assert await direct.hget(keys.state(job_id), "status") == b"running"
        assert await direct.zscore(keys.LEASES, job_id) is not None  # the reaper's hint
        report = await _reap_until_lost(direct, settings, job_id)
        again = await reap_once(direct, settings, {})
        assert await direct.hget(keys.state(job_id), "status") == b"lost"
        assert await direct.zscore(keys.LEASES, job_id) is None
    finally:
        await direct.aclose()
    assert report.lost == (job_id,)
    assert again.lost == ()
    stored = _stored(redis_url, job_id)
    completed = [e for e in stored if e["type"] == "job.completed"]
    assert [e["data"]["status"] for e in completed] == ["lost"]
    assert stored[-1] == completed[0]
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert list((tmp_path / "work").iterdir()) == []  # the job cleaned up after itself


async def _reap_until_lost(client: aioredis.Redis, settings: Settings, job_id: str) -> ReapReport:
    """Reap passes until the lease has expired and one settles the job (a pass while the
    lease lives settles nothing)."""
    deadline = time.monotonic() + settings.lease_ttl + 10
    while time.monotonic() < deadline:
        report = await reap_once(client, settings, {})
        if report.lost:
            return report
        assert await client.hget(keys.state(job_id), "status") == b"running"
        await asyncio.sleep(0.2)
    pytest.fail("no reaper pass settled the job")


async def test_a_served_job_whose_lease_is_taken_over_writes_no_results(
    tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The service side of a lost lease (the sink does not raise there): no capture, no
    patch, no upload attempted, no traceback logged; the new owner's state untouched."""
    job = json.loads(
        _job(tmp_path, "#!scenario\nwrite new.txt hi\nsay lease-marker\nhang\n").read_text()
    )
    job["workspace"]["path"] = str(tmp_path / "ws")
    job_id = job["job_id"]
    settings = Settings(
        redis_url=redis_url,
        lease_renew=0.2,
        results_bucket="never-used",  # an upload would be attempted, and fail, without the fix
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        secrets_dir=tmp_path / "secrets",
        shutdown_eof_grace=1,
    )
    caplog.set_level(logging.INFO)
    served = asyncio.create_task(run_delivery(Delivery(job), settings=settings, environ={}))
    await _until(job_id, redis_url, "lease-marker")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.set(keys.lease(job_id), "999999", px=60_000)  # a newer owner's fence
        result = await asyncio.wait_for(served, 60)
        assert await client.get(keys.lease(job_id)) == b"999999"
    finally:
        await client.aclose()
    assert result.outcome == "lease_lost", result
    assert not (tmp_path / "results" / job_id).exists()  # no patch written
    assert list((tmp_path / "work").iterdir()) == []
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("upload" in r.getMessage() and "fail" in r.getMessage() for r in caplog.records)
    assert any("capture" in r.getMessage() and "lease" in r.getMessage() for r in caplog.records)
    assert "workspace.changed" not in [e["type"] for e in _stored(redis_url, job_id)]
