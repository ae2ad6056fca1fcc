"""The allowlisting CONNECT proxy on real sockets, from the host side (no sandbox).

Every destination is a server of this test on 127.0.0.1: nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from worker.network import AllowlistProxy, NetworkDenial, ProxyLimits

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


class Harness:
    def __init__(
        self, allow: list[str], limits: ProxyLimits | None = None, private: list[str] | None = None
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="acpw-net-test-"))  # short: sun_path bound
        self.denials: list[NetworkDenial] = []
        self.proxy = AllowlistProxy(
            allow,
            socket_path=self.dir / "p.sock",
            on_denial=self._denied,
            limits=limits,
            private=private or (),
        )

    async def _denied(self, denial: NetworkDenial) -> None:
        self.denials.append(denial)

    async def connect(self, head: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(str(self.proxy.socket_path))
        writer.write(head)
        await writer.drain()
        return reader, writer

    async def status(self, head: bytes) -> bytes:
        reader, writer = await self.connect(head)
        line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return line.strip()


@pytest.fixture
async def harness_factory() -> AsyncIterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for harness in made:
        await harness.proxy.close()
        harness.dir.rmdir()


async def _harness(
    made: list[Harness],
    allow: list[str],
    limits: ProxyLimits | None = None,
    private: list[str] | None = None,
) -> Harness:
    harness = Harness(allow, limits, private)
    await harness.proxy.start()
    made.append(harness)
    return harness


def _connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


async def test_an_allowed_literal_is_relayed_both_ways_with_half_close(
    harness_factory: list[Harness], echo_port: int
) -> None:
    h = await _harness(harness_factory, [f"127.0.0.1:{echo_port}"])
    reader, writer = await h.connect(_connect(f"127.0.0.1:{echo_port}") + b"early")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    writer.write(b"-late")
    await writer.drain()
    writer.write_eof()  # the echo server answers EOF with EOF: the relay passes both on
    assert await asyncio.wait_for(reader.read(), 10) == b"early-late"
    writer.close()
    assert (h.proxy.stats.allowed, h.proxy.stats.denied) == (1, 0)
    assert h.proxy.stats.bytes_relayed == 2 * len(b"early-late")
    assert h.denials == []


async def test_a_destination_not_listed_is_refused_and_reported(
    harness_factory: list[Harness], echo_port: int
) -> None:
    h = await _harness(harness_factory, [f"127.0.0.1:{echo_port}"])
    other = echo_port + 1 if echo_port < 65535 else echo_port - 1
    assert await h.status(_connect(f"127.0.0.1:{other}")) == b"HTTP/1.1 403 Forbidden"
    assert await h.status(_connect(f"LOCALHOST:{echo_port}")) == b"HTTP/1.1 403 Forbidden"
    assert [(d.reason, d.target, d.seq) for d in h.denials] == [
        ("not_allowed", f"127.0.0.1:{other}", 1),
        ("not_allowed", f"localhost:{echo_port}", 2),
    ]


async def test_a_listed_name_that_resolves_to_loopback_is_refused(
    harness_factory: list[Harness], echo_port: int
) -> None:
    # Only an IP literal in the allowlist may reach a private or loopback address.
    h = await _harness(harness_factory, [f"localhost:{echo_port}"])
    assert await h.status(_connect(f"Localhost:{echo_port}")) == b"HTTP/1.1 403 Forbidden"
    (denial,) = h.denials
    assert denial.reason == "private_address"
    assert "127.0.0.1" in denial.message
    assert h.proxy.stats.allowed == 0


async def test_a_name_declared_private_may_resolve_to_loopback(
    harness_factory: list[Harness], echo_port: int
) -> None:
    # An operator's model endpoint on this host or a private network (``private``).
    h = await _harness(
        harness_factory, [f"localhost:{echo_port}"], private=[f"localhost:{echo_port}"]
    )
    reader, writer = await h.connect(_connect(f"localhost:{echo_port}") + b"ping")
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 10) == b"ping"
    writer.close()
    await writer.wait_closed()
    assert h.denials == []


async def test_private_applies_only_to_allowed_entries(
    harness_factory: list[Harness], echo_port: int
) -> None:
    h = await _harness(harness_factory, ["a:1"], private=[f"localhost:{echo_port}"])
    assert await h.status(_connect(f"localhost:{echo_port}")) == b"HTTP/1.1 403 Forbidden"
    assert [d.reason for d in h.denials] == ["not_allowed"]


@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (b"GET http://127.0.0.1/ HTTP/1.1\r\n\r\n", b"405", "method_not_allowed"),
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"400", "bad_request"),
        (b"\x16\x03\x01 tls hello\r\n\r\n", b"400", "bad_request"),
        (b"CONNECT a:1 HTTP/1.1\r\n" + b"X: " + b"a" * 9000 + b"\r\n\r\n", b"400", "bad_request"),
        (b"CONNECT a:1 HTTP/1.1\r\n", b"400", "bad_request"),  # then EOF, no blank line
    ],
)
async def test_malformed_or_other_requests_are_refused(
    harness_factory: list[Harness], head: bytes, status: bytes, reason: str
) -> None:
    h = await _harness(harness_factory, ["a:1"])
    reader, writer = await h.connect(head)
    if not head.endswith(b"\r\n\r\n"):
        writer.write_eof()
    line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert line.split(b" ")[1] == status
    assert [d.reason for d in h.denials] == [reason]


async def test_connections_are_bounded(harness_factory: list[Harness], echo_port: int) -> None:
    h = await _harness(harness_factory, [f"127.0.0.1:{echo_port}"], ProxyLimits(max_connections=2))
    held = [await h.connect(_connect(f"127.0.0.1:{echo_port}")) for _ in range(2)]
    for reader, _ in held:
        await reader.readuntil(b"\r\n\r\n")
    assert await h.status(_connect(f"127.0.0.1:{echo_port}")) == b"HTTP/1.1 503 Service Unavailable"
    assert [d.reason for d in h.denials] == ["too_many_connections"]
    for _, writer in held:
        writer.close()


async def test_bytes_per_connection_are_bounded(
    harness_factory: list[Harness], echo_port: int
) -> None:
    limits = ProxyLimits(max_connection_bytes=100_000)
    h = await _harness(harness_factory, [f"127.0.0.1:{echo_port}"], limits)
    reader, writer = await h.connect(_connect(f"127.0.0.1:{echo_port}"))
    await reader.readuntil(b"\r\n\r\n")
    with contextlib.suppress(ConnectionError):  # the proxy may cut us mid-write
        for _ in range(100):  # 6.4 MB offered, far past the budget
            writer.write(b"x" * 65536)
            await asyncio.wait_for(writer.drain(), 5)
    received = 0
    with contextlib.suppress(ConnectionError):  # EOF or reset; a timeout fails the test
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            received += len(chunk)
    writer.close()
    assert received <= 100_000
    assert h.proxy.stats.bytes_relayed <= 100_000 + 2 * 65536


async def test_reported_denials_are_bounded_but_all_counted(harness_factory: list[Harness]) -> None:
    h = await _harness(harness_factory, ["a:1"], ProxyLimits(max_reported_denials=3))
    for port in range(2, 8):
        assert (await h.status(_connect(f"a:{port}"))).startswith(b"HTTP/1.1 403")
    assert [d.seq for d in h.denials] == [1, 2, 3]
    assert h.proxy.stats.denied == 6


async def test_a_failing_denial_handler_does_not_break_the_proxy(echo_port: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="acpw-net-test-"))

    async def broken(_: NetworkDenial) -> None:
        raise RuntimeError("handler bug")

    proxy = AllowlistProxy(
        [f"127.0.0.1:{echo_port}"], socket_path=directory / "p.sock", on_denial=broken
    )
    await proxy.start()
    try:
        for target in (f"127.0.0.1:{echo_port + 1}", f"127.0.0.1:{echo_port}"):
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
            writer.write(_connect(target))
            line = await asyncio.wait_for(reader.readline(), 10)
            writer.close()
        assert line.startswith(b"HTTP/1.1 200")  # the second, allowed one still works
        assert proxy.stats.denied == 1
    finally:
        await proxy.close()
        directory.rmdir()


async def test_close_cuts_live_relays_and_removes_the_socket(
    harness_factory: list[Harness], echo_port: int
) -> None:
    h = await _harness(harness_factory, [f"127.0.0.1:{echo_port}"])
    reader, writer = await h.connect(_connect(f"127.0.0.1:{echo_port}"))
    await reader.readuntil(b"\r\n\r\n")
    await h.proxy.close()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # the relay ended
    writer.close()
    assert not h.proxy.socket_path.exists()
    with pytest.raises(FileNotFoundError):  # nobody listens there any more
        await asyncio.open_unix_connection(str(h.proxy.socket_path))
    await h.proxy.close()  # idempotent


def test_a_malformed_allowlist_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port"):
        AllowlistProxy(["example.com"], socket_path=tmp_path / "s")
    with pytest.raises(ValueError, match="at most 64"):
        AllowlistProxy([f"h{i}.example:1" for i in range(65)], socket_path=tmp_path / "s")
