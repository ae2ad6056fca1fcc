"""Network policy ``allowlist`` from inside real sandboxes (bubblewrap and Podman).

The sandbox keeps no route out; its one way out is the job's proxy socket, reached
through the forwarder on the sandbox's own ``127.0.0.1:3128``. Destinations are servers
of this test on the host's 127.0.0.1: nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.sandbox_owner import chown_to_sandbox
from worker.errors import SandboxError
from worker.network import AllowlistProxy, NetworkDenial
from worker.sandbox.base import ResourceLimits, Sandbox, SandboxBackend, SandboxSpec
from worker.sandbox.config import DockerConfig, LocalConfig
from worker.sandbox.docker import DockerBackend
from worker.sandbox.local import LocalBackend

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PY = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin:/bin"}
# CONNECT through the forwarder; prints the status line, then the echo of "ping".
CLIENT = r"""
import json, os, socket, sys
result = {"env": {k: v for k, v in os.environ.items() if "proxy" in k.lower()}}
def tunnel(target):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    except OSError as e:
        return "no-forwarder %d" % e.errno
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    status = head.split(b"\r\n")[0].decode()
    if " 200 " in status:
        s.sendall(b"ping")
        status += " " + s.recv(16).decode()
    s.close()
    return status
result["tunnels"] = [tunnel(t) for t in sys.argv[1:]]
print(json.dumps(result))
"""
# Everything a mode-none sandbox could try to reach the host or a proxy with.
PROBE = r"""
import json, os, socket, sys
def tcp(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return "connected"
    except OSError as e:
        return "refused %d" % e.errno
def unix(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return "connected"
    except OSError as e:
        return "refused %d" % e.errno
print(json.dumps({
    "forwarder": tcp(3128),
    "echo": tcp(int(sys.argv[1])),
    "run_acpw": os.path.exists("/run/acpw"),
    "host_proxy": unix(sys.argv[2]),
    "env": sorted(k for k in os.environ if "proxy" in k.lower()),
}))
"""


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


class Echo:
    def __init__(self) -> None:
        self.accepted = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await _echo(reader, writer)


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Echo, int]]:
    counter = Echo()
    server = await asyncio.start_server(counter.serve, "127.0.0.1", 0)
    async with server:
        yield counter, server.sockets[0].getsockname()[1]


@pytest.fixture(scope="module")
def etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("etc") / "etc"


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, etc: Path) -> SandboxBackend:
    if request.param == "local":
        conf = LocalConfig(cgroup_parent="acpw-test")
        return LocalBackend(conf, state_dir=tmp_path / "state", etc_dir=etc)
    request.getfixturevalue("base_image")
    return DockerBackend(DockerConfig(), engine_config=request.getfixturevalue("engine_config"))


def _spec(tmp_path: Path, **kw: Any) -> SandboxSpec:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    chown_to_sandbox(ws, LocalConfig())
    (tmp_path / "pack").mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "job_id": "net",
        "attempt": 1,
        "workspace": ws,
        "pack_closure": tmp_path / "pack",
        "limits": ResourceLimits(memory_bytes=256 << 20, cpus=1.0, pids=64),
        "labels": {"suite": "network"},
        "mask_config": False,
    }
    return SandboxSpec(**{**fields, **kw})


async def _run(box: Sandbox, argv: list[str], env: Mapping[str, str] = ENV) -> dict[str, Any]:
    proc = await box.spawn(argv, env=env)
    proc.stdin.close()
    out, err = await asyncio.wait_for(
        asyncio.gather(proc.stdout.read(), proc.stderr.read()), timeout=30
    )
    assert await asyncio.wait_for(proc.wait(), 30) == 0, err
    return dict(json.loads(out))


async def test_allowed_connect_works_and_a_denied_one_is_reported(
    backend: SandboxBackend, tmp_path: Path, echo: tuple[Echo, int]
) -> None:
    server, port = echo
    denials: list[NetworkDenial] = []

    async def on_denial(denial: NetworkDenial) -> None:
        denials.append(denial)

    allowed, other = f"127.0.0.1:{port}", f"127.0.0.1:{port ^ 1}"
    spec = _spec(
        tmp_path, network="allowlist", network_allow=[allowed], on_network_denial=on_denial
    )
    box = await backend.create(spec)
    try:
        result = await _run(box, [PY, "-c", CLIENT, allowed, other])
    finally:
        await backend.destroy(box.sandbox_id)
    assert result["tunnels"] == [
        "HTTP/1.1 200 Connection Established ping",
        "HTTP/1.1 403 Forbidden",
    ]
    assert result["env"]["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert result["env"]["no_proxy"] == "localhost,127.0.0.1,::1"
    assert [(d.reason, d.target) for d in denials] == [("not_allowed", other)]
    assert server.accepted == 1  # only through the proxy, only the allowed tunnel


async def test_curl_reaches_an_allowed_server_through_the_proxy_variables(
    tmp_path: Path, etc: Path
) -> None:
    # An ordinary tool, finding the proxy only through the variables the sandbox sets.
    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = LocalBackend(
        LocalConfig(cgroup_parent="acpw-test"), state_dir=tmp_path / "state", etc_dir=etc
    )
    spec = _spec(tmp_path, network="allowlist", network_allow=[f"127.0.0.1:{port}"])
    async with server:
        box = await backend.create(spec)
        try:
            # --noproxy "": the test server is on loopback, which NO_PROXY exempts.
            url = f"http://127.0.0.1:{port}/x"
            argv = ["/usr/bin/curl", "-sS", "--proxytunnel", "--noproxy", "", url]
            proc = await box.spawn(argv, env=ENV)
            out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
            assert await proc.wait() == 0, err
        finally:
            await backend.destroy(box.sandbox_id)
    assert out == b"hello\n"


async def test_with_mode_none_nothing_reaches_a_proxy(
    backend: SandboxBackend, tmp_path: Path, echo: tuple[Echo, int]
) -> None:
    server, port = echo
    # Another job's proxy, allowing this very server, runs on the host meanwhile.
    directory = Path(tempfile.mkdtemp(prefix="acpw-net-test-"))
    other_job = AllowlistProxy([f"127.0.0.1:{port}"], socket_path=directory / "p.sock")
    await other_job.start()
    box = await backend.create(_spec(tmp_path))
    try:
        found = await _run(box, [PY, "-c", PROBE, str(port), str(other_job.socket_path)])
    finally:
        await backend.destroy(box.sandbox_id)
        await other_job.close()
        directory.rmdir()
    assert found["forwarder"] == "refused 111"  # ECONNREFUSED: nothing listens inside
    assert found["echo"] == "refused 111"  # the host's loopback is another namespace
    assert found["host_proxy"] == "refused 2"  # ENOENT: the socket is not in the view
    assert found["run_acpw"] is False
    assert found["env"] == []
    assert other_job.stats.connections == 0
    assert server.accepted == 0


async def test_destroy_tears_the_proxy_down(
    backend: SandboxBackend, tmp_path: Path, echo: tuple[Echo, int]
) -> None:
    _, port = echo
    spec = _spec(tmp_path, network="allowlist", network_allow=[f"127.0.0.1:{port}"])
    box = await backend.create(spec)
    assert isinstance(backend, LocalBackend | DockerBackend)
    proxy = backend._proxies.get(box.sandbox_id)
    assert proxy is not None
    if isinstance(backend, LocalBackend) and backend.privileged:
        # No socket of its own: it serves the listeners each spawn makes in the sandbox.
        assert proxy.socket_path is None
        proc = await box.spawn(["/bin/sleep", "30"], env=ENV)
        assert len(proxy._fronts) == 1  # the proxy's port, in that process's namespace
        await backend.destroy(box.sandbox_id)
        assert proxy._fronts == []
        await proc.wait()
    else:
        assert proxy.socket_path is not None
        assert proxy.socket_path.is_socket()
        await backend.destroy(box.sandbox_id)
        assert not proxy.socket_path.parent.exists()  # socket and its directory are gone
    assert backend._proxies.get(box.sandbox_id) is None
    await backend.destroy(box.sandbox_id)  # idempotent


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"network": "allowlist"}, "at least one"),
        ({"network": "allowlist", "network_allow": ["*.example.com:443"]}, "hostname"),
        ({"network": "none", "network_allow": ["a.example:443"]}, "needs network 'allowlist'"),
        ({"network": "host"}, "unknown network policy"),
    ],
)
async def test_bad_network_policies_are_refused_before_anything_is_made(
    backend: SandboxBackend, tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SandboxError, match=message):
        await backend.create(_spec(tmp_path, **fields))
    assert await backend.list({"suite": "network"}) == []


# What runs in the sandbox beside the program, and its tunnels (PORT=expected reply).
INSIDE = r"""
import json, os, socket, sys
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdlines.append(f.read().replace(b"\0", b" ").decode())
        except OSError:
            pass
def tunnel(port):
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
    s.sendall(b"ping")
    got = s.recv(16).decode()
    s.close()
    return got
print(json.dumps({"cmdlines": cmdlines, "tunnels": [tunnel(p) for p in sys.argv[1:]]}))
"""


async def test_a_root_worker_serves_the_proxy_port_itself_no_forwarder_runs(
    tmp_path: Path, etc: Path, echo: tuple[Echo, int]
) -> None:
    """A root worker makes the proxy's port and each tunnel's in the sandbox's network
    namespace before the sandbox runs (``worker/sandbox/local/netns.py``); a worker that
    is not root runs the forwarder in front of the program instead. The ports accept
    only while the process they were made for runs."""
    server, port = echo
    backend = LocalBackend(
        LocalConfig(cgroup_parent="acpw-test"), state_dir=tmp_path / "state", etc_dir=etc
    )
    allowed = f"127.0.0.1:{port}"
    spec = _spec(
        tmp_path, network="allowlist", network_allow=[allowed], network_tunnels=((3129, allowed),)
    )
    box = await backend.create(spec)
    try:
        result = await _run(box, [PY, "-c", INSIDE, "3129"])
        proxy = backend.proxy(box.sandbox_id)
        assert proxy is not None
        for _ in range(100):  # the process exited: its ports close
            if not proxy._fronts:
                break
            await asyncio.sleep(0.01)
        assert proxy._fronts == []
    finally:
        await backend.destroy(box.sandbox_id)
    forwarders = [c for c in result["cmdlines"] if "forward.py" in c]
    if backend.privileged:
        assert forwarders == []
        assert len(result["cmdlines"]) <= 2  # the program (and bwrap's init, if any)
    else:
        assert len(forwarders) == 1
    assert result["tunnels"] == ["ping"]  # through the proxy, to the allowed target
    assert server.accepted == 1
