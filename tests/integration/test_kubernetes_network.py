"""Network ``allowlist`` on the kubernetes backend, against the API double: real pods on
Podman, the real forwarder in them, the real per-job proxies behind the worker's TCP
front (``worker.sandbox.kubernetes.netproxy``).

Podman does not enforce NetworkPolicies (the double keeps them, nothing more): that
sandbox pods reach the front alone is checked by schema only
(tests/unit/test_kubernetes_manifests.py), not here. What is checked here is what the
proxy decides: the allowed destination is reached, a denied one is answered 403 and
becomes the job's ``network_denied`` denial, and a connection without the job's token —
none, a guess, or the token of a job that ended — reaches no job's proxy.

The pods reach the front at the gateway of Podman's kube network (an address of this
host); destinations are servers of this test on 127.0.0.1, named literally in the
allowlist as in test_network.py (the proxy runs in the worker, on this host). A real
cluster's pods cannot reach this process, so these tests run on the double only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import (
    ENV,
    _backend,
    _job,
    _on_base,
    _settings,
    _spec,
)
from tests.integration.test_network import CLIENT, Echo
from tests.k8s_double.fixtures import Cluster, base_by_digest, cluster, images
from tests.k8s_double.pods import podman
from worker.errors import SandboxError
from worker.events.sinks import MemorySink
from worker.images.engine import EngineConfig
from worker.job import run_job
from worker.jobs.spec import Network
from worker.network import NetworkDenial
from worker.network.forward import TOKEN_ENV, TOKEN_PREFIX
from worker.sandbox.kubernetes.backend import KubernetesBackend, KubernetesSandbox
from worker.sandbox.kubernetes.netproxy import PodNetwork

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PY = "/usr/bin/python3"
KUBE_NETWORK = "podman-default-kube-network"
# Straight to the front, past the forwarder (over TLS to the front's certificate, given
# as PEM; "plain" for none): prints the first line of its answer.
RAW = r"""
import socket, ssl, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
if sys.argv[3] != "plain":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=sys.argv[3])
    s = ctx.wrap_socket(s)
s.sendall(sys.argv[4].encode().decode("unicode_escape").encode("latin-1"))
s.sendall(b"CONNECT " + sys.argv[5].encode() + b" HTTP/1.1\r\n\r\n")
data = b""
while b"\r\n" not in data:
    try:
        c = s.recv(1)
    except OSError:
        c = b""
    if not c:
        break
    data += c
print(data.split(b"\r\n")[0].decode(errors="replace") or "closed")
"""


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Echo, int]]:
    counter = Echo()
    server = await asyncio.start_server(counter.serve, "127.0.0.1", 0)
    async with server:
        yield counter, server.sockets[0].getsockname()[1]


def _gateway(docker_host: str) -> str:
    """The gateway of the network ``podman kube play`` puts pods on; the network is made
    by the first ``kube play`` on this service, so a run of this file alone makes it
    first (as ``kube play`` would: the default bridge settings)."""
    done = podman(docker_host, "network", "inspect", KUBE_NETWORK)
    if done.returncode != 0 and "network not found" in done.stderr:
        made = podman(docker_host, "network", "create", KUBE_NETWORK)
        assert made.returncode == 0 or "already exists" in made.stderr, made.stderr
        done = podman(docker_host, "network", "inspect", KUBE_NETWORK)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)[0]["subnets"][0]["gateway"])


def _net_backend(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base: str | None, docker_host: str
) -> KubernetesBackend:
    """The backend with its proxy front on this host (``base``: run the base image
    instead of pack images)."""
    if cluster.double is None:
        pytest.skip("a real cluster's pods cannot reach this test's proxy (double only)")
    backend = _backend(tmp_path, cluster, images)
    if base is not None:
        backend = _on_base(backend, base)
    backend.config = backend.config.model_copy(
        update={"k8s_proxy_address": _gateway(docker_host), "k8s_proxy_port": 0}
    )
    backend.network = PodNetwork(backend.config)  # listening on every address, any port
    return backend


async def _run(sandbox: KubernetesSandbox, argv: list[str]) -> str:
    proc = await sandbox.spawn(argv, env=ENV)
    proc.stdin.close()
    code = await asyncio.wait_for(proc.wait(), 60)
    out, err = await proc.stdout.read(), await proc.stderr.read()
    assert code == 0, err
    return out.decode()


def _allowlist(spec: Any, allow: list[str], denials: list[NetworkDenial]) -> Any:
    async def on_denial(denial: NetworkDenial) -> None:
        denials.append(denial)

    return dataclasses.replace(
        spec, network="allowlist", network_allow=allow, on_network_denial=on_denial
    )


async def test_an_allowlist_pod_reaches_what_is_allowed_and_nothing_else(
    tmp_path: Path,
    cluster: Cluster,
    images: EngineConfig,
    base_by_digest: str,
    docker_host: str,
    echo: tuple[Echo, int],
) -> None:
    server, port = echo
    backend = _net_backend(tmp_path, cluster, images, base_by_digest, docker_host)
    denials: list[NetworkDenial] = []
    allowed, other = f"127.0.0.1:{port}", f"127.0.0.1:{port ^ 1}"
    spec = _allowlist(_spec(tmp_path), [allowed], denials)
    sandbox = await backend.create(spec)
    try:
        result = json.loads(await _run(sandbox, [PY, "-c", CLIENT, allowed, other]))
        # A later program of the pod goes through the same forwarder.
        again = json.loads(await _run(sandbox, [PY, "-c", CLIENT, allowed]))
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert result["tunnels"] == [
        "HTTP/1.1 200 Connection Established ping",
        "HTTP/1.1 403 Forbidden",
    ]
    assert again["tunnels"] == ["HTTP/1.1 200 Connection Established ping"]
    # The agent sees the other backends' variables, and never the job's token.
    assert result["env"]["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert TOKEN_ENV not in result["env"]
    assert [(d.reason, d.target) for d in denials] == [("not_allowed", other)]
    assert server.accepted == 2  # only through the proxy, only the allowed tunnel
    assert backend.network.front.stats.refused == 0
    # The proxy-only NetworkPolicy is the chart's here (no k8s_proxy_pod_labels):
    # the backend made the deny-all one only.
    assert cluster.double is not None
    names = {name for _, name in cluster.double.policies}
    assert names == {"acpw-sandbox-deny-all"}


async def test_a_connection_without_the_jobs_token_reaches_no_proxy(
    tmp_path: Path,
    cluster: Cluster,
    images: EngineConfig,
    base_by_digest: str,
    docker_host: str,
    echo: tuple[Echo, int],
) -> None:
    """Job A may reach the echo server, job B may not. From B's pod: through its own
    forwarder (its token) A's destination is refused by B's proxy; straight to the
    front with no identity, a guessed token, or A's token once A's proxy is closed,
    nothing is relayed and neither job hears of it."""
    server, port = echo
    backend = _net_backend(tmp_path, cluster, images, base_by_digest, docker_host)
    allowed = f"127.0.0.1:{port}"
    denials_a: list[NetworkDenial] = []
    denials_b: list[NetworkDenial] = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Job ids of this test alone (pod names on the shared Podman follow them).
    spec_a = dataclasses.replace(_spec(tmp_path / "a"), job_id=f"kn-a-{tmp_path.name[-12:]}")
    spec_b = dataclasses.replace(_spec(tmp_path / "b"), job_id=f"kn-b-{tmp_path.name[-12:]}")
    spec_a = _allowlist(spec_a, [allowed], denials_a)
    spec_b = _allowlist(spec_b, [f"127.0.0.1:{port ^ 1}"], denials_b)
    box_a = await backend.create(spec_a)
    box_b = await backend.create(spec_b)
    try:
        token_a = backend.network._tokens[box_a.sandbox_id]
        front = (str(backend.config.k8s_proxy_address), str(backend.network.front.port))
        via_b = json.loads(await _run(box_b, [PY, "-c", CLIENT, allowed]))
        raw = [PY, "-c", RAW, *front, backend.network.front.certificate]
        no_identity = await _run(box_b, [*raw, "", allowed])
        # A's token in clear, as before the front spoke TLS: it never reaches a proxy.
        line_a = TOKEN_PREFIX.decode() + token_a + r"\r\n"
        plain_a = await _run(box_b, [PY, "-c", RAW, *front, "plain", line_a, allowed])
        guessed = await _run(box_b, [*raw, r"ACPW-TOKEN x" + "A" * 42 + r"\r\n", allowed])
        # A's own token works from anywhere it is known: it is the identity...
        with_a = await _run(box_b, [*raw, line_a, allowed])
        # ...until A ends (its proxy closed, as destroy does first; its pod is removed
        # last, since removing a pod on Podman 4.3 here cuts the other pods' route to the
        # kube network's gateway): then it names no proxy.
        await backend.network.close(box_a.sandbox_id)
        after_a = await _run(box_b, [*raw, line_a, allowed])
    finally:
        await backend.destroy(box_a.sandbox_id)
        await backend.destroy(box_b.sandbox_id)
    assert via_b["tunnels"] == ["HTTP/1.1 403 Forbidden"]
    assert [(d.reason, d.target) for d in denials_b] == [("not_allowed", allowed)]
    refused = "HTTP/1.1 407 Proxy Authentication Required"
    assert (no_identity.strip(), guessed.strip(), after_a.strip()) == (refused,) * 3
    assert "200" not in plain_a
    assert with_a.strip() == "HTTP/1.1 200 Connection Established"
    assert denials_a == []
    assert backend.network.front.stats.refused == 4
    assert server.accepted == 1  # A's token, while A ran


@pytest.mark.usefixtures("base_image")
async def test_a_jobs_denied_request_is_a_network_denied_notice(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, docker_host: str
) -> None:
    """A whole job (``run_job``, the emulator pack in its pack image): what its agent's
    command asks of a host not allowed is refused and the job says so, as on the other
    backends (test_run_job.py's test_network_denials_become_notices)."""
    backend = _net_backend(tmp_path, cluster, images, None, docker_host)
    connect = (
        "import socket; s = socket.create_connection(('127.0.0.1', 3128), timeout=10); "
        "s.sendall(b'CONNECT denied.example:443 HTTP/1.1\\r\\n\\r\\n'); "
        "print(s.recv(12).decode())"
    )
    prompt = f'#!scenario\nexec python3 -c "{connect}"\nsay asked\n'
    job = _job(tmp_path, prompt).model_copy(
        update={"network": Network(mode="allowlist", allow=["allowed.example:443"])}
    )
    sink = MemorySink()
    outcome = await run_job(
        job, settings=_settings(tmp_path), backend=backend, sinks=[sink], environ={}
    )
    events = [dict(e) for e in sink.events]
    assert outcome.status == "succeeded", events[-1]
    denied = [
        e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == "network_denied"
    ]
    assert [(d["details"]["reason"], d["details"]["target"]) for d in denied] == [
        ("not_allowed", "denied.example:443")
    ]
    assert backend.network.front.stats.accepted == 1


def test_allowlist_without_a_proxy_address_is_refused(tmp_path: Path) -> None:
    from worker.sandbox.base import ResourceLimits, SandboxSpec
    from worker.sandbox.config import KubernetesConfig

    config = KubernetesConfig(worker_id="w", cache_dir=tmp_path, k8s_namespace="ns")
    backend = KubernetesBackend(config)
    spec = SandboxSpec(
        job_id="j", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64), labels={},
        network="allowlist", network_allow=("example.com:443",),
    )  # fmt: skip
    with pytest.raises(SandboxError, match="k8s_proxy_address"):
        asyncio.run(backend.create(spec))


async def test_the_front_bounds_connections_that_do_not_identify_themselves(
    tmp_path: Path,
) -> None:
    """No pod needed: connections that start no TLS handshake (or send no identity line)
    are held at most ``LINE_TIMEOUT_S``, and past ``MAX_UNIDENTIFIED`` of them the next
    is refused at once (in clear: it never got to TLS); a connection with the job's token
    still gets through once they are gone."""
    from worker.sandbox.base import ResourceLimits, SandboxSpec
    from worker.sandbox.kubernetes import netproxy

    front = netproxy.ProxyFront("127.0.0.1", 0)
    spec = SandboxSpec(
        job_id="j", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64), labels={},
        network="allowlist", network_allow=("127.0.0.1:9",),
    )  # fmt: skip
    token = await front.add(spec)
    port = front.port
    silent = [
        await asyncio.open_connection("127.0.0.1", front.port)
        for _ in range(netproxy.MAX_UNIDENTIFIED)
    ]
    try:
        await asyncio.sleep(0.5)  # let the front take them all
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(TOKEN_PREFIX + token.encode() + b"\r\n")
        refused = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        assert refused.startswith(b"HTTP/1.1 407")
    finally:
        for _, w in silent:
            w.close()
    await asyncio.sleep(0.5)  # the front sees them gone
    pinned = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    pinned.check_hostname = False
    pinned.load_verify_locations(cadata=front.certificate)
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port, ssl=pinned)
    writer.write(TOKEN_PREFIX + token.encode() + b"\r\nCONNECT elsewhere:1 HTTP/1.1\r\n\r\n")
    answer = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    await front.remove(token)
    assert answer.startswith(b"HTTP/1.1 403")  # its own proxy answered: not allowed
    # The one over the bound, and each silent one when it closed without a line.
    assert front.stats.refused == netproxy.MAX_UNIDENTIFIED + 1
    # The listener stopped with its last proxy.
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
