"""Integration fixtures: an S3 service (moto's server mode) on loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.redis_proxy import RedisProxy

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",  # moto accepts any; not a real secret
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API (moto server) on 127.0.0.1 for the whole session."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client on the moto server, with the fake credentials in the environment."""
    import boto3

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[RedisProxy]:
    """A proxy to the test Redis the test can cut (see ``tests.redis_proxy``)."""
    made = RedisProxy(redis_url)
    await made.start()
    yield made
    await made.cut()
