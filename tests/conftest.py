"""Shared fixtures: a real Redis (started by bootstrap or CI), flushed per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings

# Property tests run the same examples every time (derandomize, no example database) and
# never fail on how long the machine took (these 2-core hosts are shared and noisy): a
# test that passes only sometimes is a failing test.
settings.register_profile(
    "acpw",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("acpw")

REPO = Path(__file__).resolve().parent.parent
# Every process this session starts inherits the mark (tests that build a child's
# environment keep what is not ACPW_*), so what it left running is told from what other
# sessions on this machine run, even once reparented to init.
SESSION_MARK = "PYTEST_ACPW_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex
#: The worker's own processes: none may outlive the session that started it.
OURS = ("acp-worker", "-m worker.cli", "-m celery", "[celeryd")
# A dedicated database so tests never touch what else uses this Redis.
REDIS_URL = os.environ.get("ACPW_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:  # CI must have started one
        pytest.fail(f"no Redis at {REDIS_URL}: {exc}")
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def left_running(mark: str) -> list[str]:
    """The worker processes (``OURS``) still running that carry ``mark`` in their
    environment: started by this session, directly or not."""
    found = []
    needle = f"{SESSION_MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if stat[stat.rfind(")") + 2] == "Z" or needle not in environ:
            continue
        if any(ours in cmdline for ours in OURS):
            found.append(f"{entry.name}: {cmdline.strip()[:200]}")
    return found


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run of the suite leaves no worker process behind (a ``serve`` or ``run`` a test
    started, a pool process, a reaper): any still running fails the session."""
    left = left_running(os.environ[SESSION_MARK])
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "worker processes this session left running", red=True)
        for line in left:
            reporter.write_line(line, red=True)
    if session.exitstatus == 0:
        session.exitstatus = 1
