"""The kubernetes proxy front's TLS, with no pod: the real front (its per-job proxies)
and the real forwarder's route and relay (``worker.network.forward``), over loopback.

A recording relay sits between them where the pod network would be: what crosses it is
encrypted (no token, no ``CONNECT``, no payload in it), a front holding another key gets
nothing from the forwarder, and a client that skips TLS reaches no job's proxy. The pods
that run the same forwarder through Podman are tests/integration/test_kubernetes_network.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_network import Echo
from worker.network import forward
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.kubernetes.netproxy import ProxyFront

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PAYLOAD = b"a payload only the two ends may read"


class Tap:
    """A TCP relay to ``port`` that keeps every byte it passes, both ways."""

    def __init__(self, port: int) -> None:
        self.port, self.seen = port, bytearray()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))


@contextlib.asynccontextmanager
async def _server(handler: object) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    async with server:
        yield server.sockets[0].getsockname()[1]


def _spec(tmp_path: Path, allow: str) -> SandboxSpec:
    return SandboxSpec(
        job_id="j", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64), labels={},
        network="allowlist", network_allow=(allow,),
    )  # fmt: skip


def _through_forwarder(port: int, token: str, pinned: str, target: str) -> bytes:
    """What the forwarder's tunnel to ``target`` gives back for PAYLOAD (its route to the
    front at ``port``, its CONNECT, then its TLS relay between a local socket and it)."""
    route = forward._Route(("127.0.0.1", port), token, pinned)
    upstream = route.open()
    assert forward._connect(upstream, target)
    ours, theirs = socket.socketpair()
    relay = threading.Thread(target=forward._relay_tls, args=(theirs, upstream), daemon=True)
    relay.start()
    try:
        ours.sendall(PAYLOAD)
        ours.settimeout(10)
        got = b""
        while len(got) < len(PAYLOAD):
            chunk = ours.recv(65536)
            if not chunk:
                break
            got += chunk
    finally:
        ours.close()
        relay.join(10)
        theirs.close()
        upstream.close()
    assert not relay.is_alive()  # the local side's end ended the relay
    return got


async def test_what_crosses_the_pod_network_is_encrypted_and_pinned(tmp_path: Path) -> None:
    echo = Echo()
    async with _server(echo.serve) as echo_port:
        target = f"127.0.0.1:{echo_port}"
        front = ProxyFront("127.0.0.1", 0)
        token = await front.add(_spec(tmp_path, target))
        try:
            tap = Tap(front.port)
            async with _server(tap.serve) as tapped:
                got = await asyncio.to_thread(
                    _through_forwarder, tapped, token, front.certificate, target
                )
        finally:
            await front.remove(token)
    assert got == PAYLOAD  # echoed, end to end
    assert echo.accepted == 1
    assert front.stats.accepted == 1
    assert len(tap.seen) > len(PAYLOAD)  # the tap saw the traffic, and none of it in clear
    for clear in (token.encode(), forward.TOKEN_PREFIX, b"CONNECT", target.encode(), PAYLOAD):
        assert clear not in tap.seen


async def test_a_front_without_the_pinned_key_gets_nothing(tmp_path: Path) -> None:
    """An impostor (another front: its own key, a token it would accept) in the real
    front's place: the forwarder's handshake fails before a byte of the job is sent."""
    real, impostor = ProxyFront("127.0.0.1", 0), ProxyFront("127.0.0.1", 0)
    token = await real.add(_spec(tmp_path, "127.0.0.1:9"))
    its_own = await impostor.add(_spec(tmp_path, "127.0.0.1:9"))
    try:
        assert real.certificate != impostor.certificate
        route = forward._Route(("127.0.0.1", impostor.port), token, real.certificate)
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(route.open)
        await asyncio.sleep(0.2)  # the impostor sees the handshake fail
    finally:
        await real.remove(token)
        await impostor.remove(its_own)
    assert (impostor.stats.accepted, impostor.stats.refused) == (0, 1)


async def test_a_client_skipping_tls_reaches_no_proxy(tmp_path: Path) -> None:
    front = ProxyFront("127.0.0.1", 0)
    token = await front.add(_spec(tmp_path, "127.0.0.1:9"))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        line = forward.TOKEN_PREFIX + token.encode() + b"\r\n"
        writer.write(line + b"CONNECT 127.0.0.1:9 HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 15)
        writer.close()
    finally:
        await front.remove(token)
    assert b"200" not in answer
    assert (front.stats.accepted, front.stats.refused) == (0, 1)
