"""Shared fixtures: a real Redis (started by bootstrap or CI), flushed per test."""

from __future__ import annotations

import os
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
