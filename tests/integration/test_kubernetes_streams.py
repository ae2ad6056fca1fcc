"""The exec streams of the Kubernetes backend as a real API server treats them, against
the API double (real pods on Podman) through the official client:

- overlapping calls — file operations, look-ups, signals and REST reads while the agent
  streams — share no ``ApiClient`` (the client's ``stream()`` swaps ``call_api`` on the
  client it is given), so every later call, the final delete included, still works;
- a server that negotiates only ``v4.channel.k8s.io`` (no stdin half-close): file
  writes and the copy in and out never wait for stdin's EOF, an exec that would wait
  for one ends at its deadline, and a job's agent is stopped by the signal escalation
  with a ``stdin_eof_unavailable`` notice;
- a load balancer's idle cut-off (``ApiDouble(idle_cutoff_s=…)``): an idle agent's
  stream outlives it (pings), and a stream it cuts is ``sandbox_connection_lost``, never
  an OOM kill.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import (
    ENV,
    _backend,
    _on_base,
    _run,
    _spec,
    assert_within_rbac,
)
from tests.k8s_double.fixtures import (
    NAMESPACE,
    Cluster,
    base_by_digest,
    cluster,
    images,
    real_cluster,
)
from tests.k8s_double.server import ApiDouble
from worker.errors import SandboxError
from worker.images.engine import EngineConfig
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.kubernetes import transfer
from worker.sandbox.kubernetes.manifests import CONTAINER

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = pytest.mark.integration

#: An agent that streams all along.
TICKER = ["/bin/sh", "-c", "while :; do echo tick; sleep 0.1; done"]
OPERATIONS = 60


async def test_overlapping_calls_while_the_agent_streams_share_no_client(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """≥ 50 file writes, reads, look-ups, signals and pod reads at once while the agent
    streams: each succeeds, and so does every call after them, the delete included."""
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        agent = await sandbox.spawn(TICKER, env=ENV)
        assert await agent.stdout.readline() == b"tick\n"
        files = sandbox.workspace_files()

        async def operation(i: int) -> None:
            kind = i % 5
            if kind == 0:
                await files.write_text(f"f{i}.txt", f"content {i}")
                assert await files.read_text(f"f{i}.txt", limit=64) == f"content {i}"
            elif kind == 1:
                assert await files.read_text("README.md", limit=64) == "# staged\n"
            elif kind == 2:
                await files.look_up(["README.md", f"absent{i}"])
                assert files.artifact("README.md").reason is None
            elif kind == 3:
                await sandbox.signal(agent.pid, signal.SIGCONT)
            else:
                assert await asyncio.to_thread(backend.api.read_pod, sandbox.sandbox_id)

        results = await asyncio.gather(
            *(operation(i) for i in range(OPERATIONS)), return_exceptions=True
        )
        assert [r for r in results if r is not None] == []
        # Every later call still works: REST (a list), exec (a signal that must land).
        listed = await backend.list({LABEL_JOB: spec.job_id})
        assert [i.sandbox_id for i in listed] == [sandbox.sandbox_id]
        assert await agent.stdout.readline() == b"tick\n"  # the agent streamed all along
        agent.terminate()
        assert await asyncio.wait_for(agent.wait(), 30) == -signal.SIGTERM
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert {f"f{i}.txt" for i in range(0, OPERATIONS, 5)} <= {
        p.name for p in spec.workspace.iterdir()
    }
    assert await backend.list({LABEL_JOB: spec.job_id}) == []
    if cluster.double is not None:
        assert cluster.double.pods == {}  # no pod leaked
    assert_within_rbac(cluster)


@pytest.mark.parametrize("cluster", ["v4"], indirect=True)
async def test_on_a_v4_server_nothing_waits_for_stdin_eof(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """v4 only: the copy in and out and file writes work without stdin's EOF; the
    process says it gets none; an exec that waits for one ends at its deadline."""
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    (spec.workspace / "sub").mkdir()
    (spec.workspace / "sub" / "big.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    sandbox = await backend.create(spec)  # the copy in
    try:
        files = sandbox.workspace_files()
        await asyncio.wait_for(files.write_text("new/w.txt", "written over v4"), 60)
        assert await files.read_text("new/w.txt", limit=64) == "written over v4"
        proc = await sandbox.spawn(
            ["/bin/sh", "-c", "cmp sub/big.bin - <sub/big.bin; cat"], env=ENV
        )
        assert not proc.stdin_eof
        proc.stdin.close()  # no EOF reaches `cat`: it is signalled instead
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), 2)
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGTERM
        # A short exec waiting for an EOF that never comes ends at its deadline.
        api = backend.api
        ws = await asyncio.to_thread(
            api.exec, sandbox.sandbox_id, CONTAINER, ["cat"], stdin=True, timeout_s=30
        )
        try:
            ws.close_channel(0)
            began = time.monotonic()
            with pytest.raises(SandboxError, match="did not end in time"):
                await asyncio.to_thread(transfer.drain, ws, timeout_s=2.0, ping_s=0.5)
            assert time.monotonic() - began < 30
        finally:
            transfer.close(ws)
        await sandbox.signal(1, signal.SIGCONT)  # signals still go through
    finally:
        await backend.destroy(sandbox.sandbox_id)  # the copy out
    assert (spec.workspace / "new" / "w.txt").read_text() == "written over v4"
    assert (spec.workspace / "sub" / "big.bin").read_bytes() == bytes(range(256)) * 4096
    assert await backend.list({LABEL_JOB: spec.job_id}) == []


@pytest.mark.usefixtures("base_image")
@pytest.mark.parametrize("cluster", ["v4"], indirect=True)
async def test_a_job_on_a_v4_server_stops_its_agent_by_signal_with_a_notice(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    """The emulator exits on EOF; v4 has none: the job still completes, its agent
    stopped by the escalation, and says so in a notice; what it wrote comes back."""
    backend = _backend(tmp_path, cluster, images)
    prompt = "#!scenario\nwrite notes/v4.txt written over v4\nsay Hello over v4\n"
    outcome, events = await _run(tmp_path, backend, prompt)
    assert outcome.status == "succeeded", events[-1]
    notices = [e["data"] for e in events if e["type"] == "notice"]
    assert "stdin_eof_unavailable" in [n["code"] for n in notices]
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert ("notes/v4.txt", "added") in [(p["path"], p["status"]) for p in changed["paths"]]
    if cluster.double is not None:
        assert cluster.double.pods == {}


@pytest.fixture
def idle_double(docker_host: str, tmp_path: Path) -> Iterator[Cluster]:
    """A double behind a load balancer that drops exec streams idle for 2 s (only a
    double can be made to: skipped on a real cluster)."""
    if real_cluster() is not None:
        pytest.skip("a real cluster's load balancer cannot be set from a test")
    double = ApiDouble(docker_host, idle_cutoff_s=2.0)
    double.start()
    try:
        path = double.kubeconfig(tmp_path / "kubeconfig-idle", namespace=NAMESPACE)
        yield Cluster(path, NAMESPACE, double, None)
    finally:
        double.close()


async def test_an_idle_agent_outlives_the_idle_cut_off_and_a_cut_stream_is_no_oom_kill(
    tmp_path: Path, idle_double: Cluster, engine_config: EngineConfig, base_by_digest: str
) -> None:
    backend = _backend(tmp_path, idle_double, engine_config, k8s_exec_ping_s=0.5)
    backend = _on_base(backend, base_by_digest)
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        # Silent for twice the cut-off: the pings keep its stream.
        quiet = await sandbox.spawn(["/bin/sh", "-c", "sleep 4; echo done"], env=ENV)
        assert await asyncio.wait_for(quiet.wait(), 60) == 0
        assert await quiet.stdout.read() == b"done\n"
        # No pings: the cut-off drops the stream; no Status is no exit 137 and no OOM.
        backend.api.ping_s = 60.0
        cut = await sandbox.spawn(["/bin/sleep", "6"], env=ENV)
        await asyncio.wait_for(cut.wait(), 60)
        diagnosis = await cut.exit_diagnosis()
        assert not diagnosis.oom_killed
        assert diagnosis.sandbox_error is not None
        assert diagnosis.sandbox_error.code == "sandbox_connection_lost"
        assert diagnosis.sandbox_error.details["pod"] == sandbox.sandbox_id
        backend.api.ping_s = 0.5
        assert await sandbox.workspace_files().read_text("README.md", limit=64) == "# staged\n"
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert idle_double.double is not None
    assert idle_double.double.pods == {}
