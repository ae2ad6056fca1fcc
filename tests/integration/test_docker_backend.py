"""The sandbox contract over both backends, and the docker backend's containment.

The contract tests run the same assertions against real bubblewrap (``local``) and a
real container engine (``docker``: Podman's Docker API, started by the session fixture
``docker_host``); the containment tests prove from inside a container what it can and
cannot do. Containers run the sandbox base image (built once per machine).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.sandbox_owner import chown_to_sandbox
from worker.errors import SandboxError
from worker.events.artifacts import Verdict
from worker.images.engine import EngineConfig
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_TOKEN,
    ExitDiagnosis,
    ResourceLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    WritableMount,
)
from worker.sandbox.config import DockerConfig, LocalConfig
from worker.sandbox.docker import DockerBackend, DockerSandbox, exit_status, launch_header
from worker.sandbox.files import PathRefused
from worker.sandbox.local import LocalBackend

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
PY = "/usr/bin/python3"
LIMITS = ResourceLimits(memory_bytes=200 << 20, cpus=0.5, pids=50)


def _spec(tmp_path: Path, **overrides: Any) -> SandboxSpec:
    (tmp_path / "ws").mkdir(exist_ok=True)
    chown_to_sandbox(tmp_path / "ws", LocalConfig())
    (tmp_path / "pack").mkdir(exist_ok=True)
    (tmp_path / "pack" / "agent.txt").write_text("pack-file")
    fields: dict[str, Any] = {
        "job_id": "job/7 ünïcode",
        "attempt": 2,
        "workspace": tmp_path / "ws",
        "pack_closure": tmp_path / "pack",
        "limits": LIMITS,
        "labels": {LABEL_TOKEN: "17", "team": "a"},
        "mask_config": False,
    }
    fields.update(overrides)
    return SandboxSpec(**fields)


def _docker(config: EngineConfig) -> DockerBackend:
    return DockerBackend(DockerConfig(worker_id="w-1"), engine_config=config)


@pytest.fixture(scope="module")
def etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("etc") / "etc"


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, etc: Path) -> SandboxBackend:
    if request.param == "local":
        conf = LocalConfig(cgroup_parent="acpw-test", worker_id="w-1")
        return LocalBackend(conf, state_dir=tmp_path / "state", etc_dir=etc)
    request.getfixturevalue("base_image")
    return _docker(request.getfixturevalue("engine_config"))


@pytest.fixture
async def box(backend: SandboxBackend, tmp_path: Path) -> AsyncIterator[Sandbox]:
    made = await backend.create(_spec(tmp_path))
    try:
        yield made
    finally:
        await backend.destroy(made.sandbox_id)


async def _output(box: Sandbox, argv: list[str]) -> tuple[int, str, str]:
    proc = await box.spawn(argv, env=ENV)
    proc.stdin.close()
    out, err = await asyncio.wait_for(
        asyncio.gather(proc.stdout.read(), proc.stderr.read()), timeout=30
    )
    return await asyncio.wait_for(proc.wait(), 30), out.decode(), err.decode()


# --- contract, over both backends ------------------------------------------------------


async def test_stdin_to_stdout_roundtrip(box: Sandbox) -> None:
    proc = await box.spawn(["/bin/cat"], env=ENV)
    proc.stdin.write(b"hello\n")
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"hello\n"
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    assert proc.returncode == 0


async def test_env_is_exact_cwd_is_the_workspace_stderr_is_separate(
    box: Sandbox, tmp_path: Path
) -> None:
    rc, out, err = await _output(
        box, ["/bin/sh", "-c", "echo $LANG:$HOME:$USER; echo x > here; echo oops >&2; exit 4"]
    )
    assert (rc, out, err) == (4, "C.UTF-8::\n", "oops\n")
    assert (tmp_path / "ws" / "here").read_text() == "x\n"


async def test_pack_is_read_only_and_root_is_frozen(box: Sandbox) -> None:
    script = (
        "cat /opt/acp-pack/agent.txt; echo;"
        "touch /opt/acp-pack/new 2>/dev/null && echo pack-writable;"
        "touch /etc/new 2>/dev/null && echo root-writable;"
        "touch /tmp/t $HOME/t 2>/dev/null && echo tmp-ok; id -u"
    )
    rc, out, _ = await _output(box, ["/bin/sh", "-c", script.replace("$HOME", "/home/agent")])
    assert rc == 0
    assert out.splitlines() == ["pack-file", "tmp-ok", "1000"]


async def _ended(box: Sandbox, code: str) -> ExitDiagnosis:
    proc = await box.spawn([PY, "-c", code], env=ENV)
    proc.stdin.close()
    await asyncio.wait_for(asyncio.gather(proc.stdout.read(), proc.stderr.read()), 30)
    await asyncio.wait_for(proc.wait(), 30)
    return await proc.exit_diagnosis()


async def test_an_ended_program_is_diagnosed(box: Sandbox) -> None:
    assert await _ended(box, "raise SystemExit(3)") == ExitDiagnosis(3, None)
    assert await _ended(box, "pass") == ExitDiagnosis(0, None)
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert await _ended(box, killed) == ExitDiagnosis(None, "SIGTERM")
    # Past the memory bound (LIMITS: 200 MiB), the kernel's OOM killer ends it.
    oom = await _ended(box, "b = bytearray(400 << 20); print('survived')")
    assert oom == ExitDiagnosis(None, "SIGKILL", oom_killed=True)


async def test_a_kill_of_ours_is_no_oom(box: Sandbox) -> None:
    proc = await box.spawn(["/bin/sh", "-c", "echo up; exec sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    proc.kill()
    await asyncio.wait_for(proc.wait(), 30)
    assert await proc.exit_diagnosis() == ExitDiagnosis(None, "SIGKILL")


async def test_list_by_labels_and_destroy(backend: SandboxBackend, box: Sandbox) -> None:
    found = await backend.list({"team": "a", LABEL_JOB: "job/7 ünïcode", LABEL_ATTEMPT: "2"})
    assert [i.sandbox_id for i in found] == [box.sandbox_id]
    assert found[0].backend == backend.name
    assert found[0].labels[LABEL_TOKEN] == "17"
    assert await backend.list({"team": "b"}) == []
    proc = await box.spawn(["/bin/sh", "-c", "echo up; exec sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    await backend.destroy(box.sandbox_id)
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
    assert await backend.list({LABEL_JOB: "job/7 ünïcode"}) == []
    await backend.destroy(box.sandbox_id)  # idempotent


async def test_terminate_gives_the_program_grace(box: Sandbox) -> None:
    script = "trap 'echo bye; exit 3' TERM; echo up; while :; do sleep 0.05; done"
    proc = await box.spawn(["/bin/sh", "-c", script], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    proc.terminate()
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"bye\n"
    assert await asyncio.wait_for(proc.wait(), 10) == 3
    proc.terminate()  # idempotent after exit
    proc.kill()


async def test_kill_ends_a_program_that_ignores_term(box: Sandbox) -> None:
    proc = await box.spawn(["/bin/sh", "-c", "trap '' TERM; echo up; sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    proc.terminate()
    await asyncio.sleep(0.3)
    assert proc.returncode is None
    proc.kill()
    assert await asyncio.wait_for(proc.wait(), 10) != 0


async def test_stdout_limit_bounds_one_line(box: Sandbox) -> None:
    proc = await box.spawn(
        ["/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; echo"], env=ENV, stdout_limit=1024
    )
    with pytest.raises(ValueError, match="limit"):
        await asyncio.wait_for(proc.stdout.readline(), 10)
    proc.kill()
    await asyncio.wait_for(proc.wait(), 10)


async def test_a_second_spawn_runs_in_the_same_sandbox(box: Sandbox, tmp_path: Path) -> None:
    assert (await _output(box, ["/bin/sh", "-c", "echo one > f"]))[0] == 0
    rc, out, _ = await _output(box, ["/bin/cat", "f"])
    assert (rc, out) == (0, "one\n")


async def test_missing_program_fails_without_hanging(box: Sandbox) -> None:
    rc, _, err = await _output(box, ["/no/such/program"])
    assert rc != 0
    assert "/no/such/program" in err or rc == 127


async def test_workspace_files_are_the_sandboxs_own(box: Sandbox) -> None:
    """What the worker writes through the sandbox's files, the sandbox user can change
    (file and new folders are its own), and the worker reads back what it wrote."""
    files = box.workspace_files()
    assert files is not None
    running = await box.spawn(["/bin/cat"], env=ENV)  # docker: a container shows the bind
    try:
        await files.write_text("/workspace/new/dir/f.txt", "from the worker\n")
        script = "echo sandbox >> new/dir/f.txt && touch new/dir/g && stat -c %u new/dir/f.txt"
        rc, out, _ = await _output(box, ["/bin/sh", "-c", script])
        assert (rc, out) == (0, "1000\n")
        assert await files.read_text("new/dir/f.txt", limit=64) == "from the worker\nsandbox\n"
        assert files.artifact("/workspace/new/dir/g") == Verdict("new/dir/g", 0)
        with pytest.raises(PathRefused) as refused:
            await files.read_text("new/dir/f.txt", limit=8)
        assert refused.value.reason == "too_large"
    finally:
        running.stdin.close()
        await asyncio.wait_for(running.wait(), 30)


async def test_an_allowlist_without_entries_is_refused(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    # Allowlists that work are proven in test_network.py, over both backends.
    with pytest.raises(SandboxError, match="at least one host:port"):
        await backend.create(_spec(tmp_path, network="allowlist"))
    assert await backend.list({LABEL_JOB: "job/7 ünïcode"}) == []


async def test_a_state_mount_below_home_is_writable_and_so_are_its_parents(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    state = tmp_path / "agent-state"
    state.mkdir()
    chown_to_sandbox(state, LocalConfig())
    target = "/home/agent/.cursor/acp-sessions"
    box = await backend.create(_spec(tmp_path, state_mounts=(WritableMount(state, target),)))
    script = (
        f"echo kept > {target}/s1 && mkdir /home/agent/.cursor/plans"
        " && echo tmp > /home/agent/.cursor/plans/p && stat -c %u /home/agent/.cursor"
    )
    try:
        code, out, err = await _output(box, ["/bin/sh", "-c", script])
    finally:
        await backend.destroy(box.sandbox_id)
    assert code == 0, err
    assert out == "1000\n"  # ~/.cursor belongs to the agent, not to the engine
    assert (state / "s1").read_text() == "kept\n"
    assert os.listdir(state) == ["s1"]  # the rest stayed on the private HOME
    with pytest.raises(SandboxError, match="below /home/agent"):
        await backend.create(_spec(tmp_path, state_mounts=(WritableMount(state, "/etc/x"),)))


# --- docker containment ----------------------------------------------------------------


@pytest.fixture
async def dbox(
    engine_config: EngineConfig, base_image: str, tmp_path: Path
) -> AsyncIterator[DockerSandbox]:
    backend = _docker(engine_config)
    made = await backend.create(_spec(tmp_path, limits=ResourceLimits(96 << 20, 1.0, 64)))
    try:
        yield made
    finally:
        await backend.destroy(made.sandbox_id)


async def test_files_wait_for_a_container_that_shows_the_bind(dbox: DockerSandbox) -> None:
    """Until a running container of the sandbox is seen to bind the staged directory at
    ``/workspace`` (same inode, through ``/proc/<pid>/root``), every path is refused."""
    (dbox.spec.workspace / "a.txt").write_text("a")
    files = dbox.workspace_files()
    assert files.artifact("a.txt") == Verdict(reason="workspace_not_reachable")
    with pytest.raises(PathRefused) as refused:
        await files.write_text("b.txt", "b")
    assert refused.value.reason == "workspace_not_reachable"
    assert not (dbox.spec.workspace / "b.txt").exists()
    running = await dbox.spawn(["/bin/cat"], env=ENV)
    try:
        assert files.artifact("a.txt") == Verdict("a.txt", 1)
        await files.write_text("b.txt", "b")
    finally:
        running.stdin.close()
        await asyncio.wait_for(running.wait(), 30)
    assert files.artifact("b.txt") == Verdict("b.txt", 1)  # once proven, remembered


async def test_no_capabilities_no_new_privileges_no_network(dbox: DockerSandbox) -> None:
    script = (
        "import socket\n"
        "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in l)\n"
        "print(st['CapEff'], st['CapBnd'], st['NoNewPrivs'], st['Uid'].split()[0])\n"
        "print(sorted(open('/proc/net/dev').read().split()[20::17]))\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        "try:\n    s.connect(('1.1.1.1', 443)); print('connected')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    rc, out, err = await _output(dbox, [PY, "-c", script])
    assert rc == 0, err
    caps, ifaces, net = out.splitlines()
    assert caps == "0000000000000000 0000000000000000 1 1000"
    assert ifaces == "['lo:']"
    assert net.startswith("refused")


async def test_the_engine_config_holds_no_environment(dbox: DockerSandbox) -> None:
    proc = await dbox.spawn(["/bin/sh", "-c", "echo $SECRET_X"], env={"SECRET_X": "s3cr3t-v"})
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"s3cr3t-v\n"
    await asyncio.wait_for(proc.wait(), 10)
    attrs = dbox.backend.client.api.inspect_container(proc.container_id)
    assert "s3cr3t-v" not in str(attrs)


async def test_pids_limit_stops_a_fork_bomb(dbox: DockerSandbox) -> None:
    script = (
        "import os, time\nn = 0\n"
        "try:\n    while n < 500:\n"
        "        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n"
    )
    rc, out, _ = await _output(dbox, [PY, "-c", script])
    assert rc == 0
    assert out.startswith("stopped")
    assert int(out.split()[1]) < 64


async def test_memory_limit_kills_and_is_reported_as_oom(dbox: DockerSandbox) -> None:
    proc = await dbox.spawn([PY, "-c", "b = bytearray(400 << 20); print('survived')"], env=ENV)
    proc.stdin.close()
    assert await asyncio.wait_for(proc.stdout.read(), 30) == b""
    assert await asyncio.wait_for(proc.wait(), 30) == -signal.SIGKILL
    assert proc.oom_killed
    assert dbox.oom_killed()


async def test_a_second_backend_instance_lists_and_reaps(
    engine_config: EngineConfig, dbox: DockerSandbox
) -> None:
    # A reaper in another process knows only the engine and the labels.
    proc = await dbox.spawn(["/bin/sh", "-c", "echo up; exec sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    reaper = _docker(engine_config)
    found = await reaper.list({LABEL_TOKEN: "17", LABEL_JOB: "job/7 ünïcode"})
    assert [i.sandbox_id for i in found] == [dbox.sandbox_id]
    await reaper.destroy(dbox.sandbox_id)
    assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL
    assert await reaper.list({LABEL_TOKEN: "17"}) == []


def test_launch_header_and_exit_status_mapping() -> None:
    header = launch_header(["/bin/true"], {"A": "b"}, "/workspace")
    assert header[:10] == b"%010d" % (len(header) - 10)
    assert exit_status(137) == -signal.SIGKILL
    assert exit_status(143) == -signal.SIGTERM
    assert exit_status(3) == 3
