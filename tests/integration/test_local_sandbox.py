"""The local backend's lifecycle against real bubblewrap and real cgroupfs.

The contract tests at the top run over every backend that can run here: the local one
and the in-package fake (which must behave the same at the seam, minus isolation).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.sandbox_owner import chown_to_sandbox
from worker.errors import SandboxError
from worker.sandbox import cgroups, staging
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_WORKER,
    ReadOnlyMount,
    ResourceLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from worker.sandbox.config import LocalConfig
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import LocalBackend, LocalSandbox, descendants
from worker.workspace import disk

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
LIMITS = ResourceLimits(memory_bytes=200 << 20, cpus=0.5, pids=50)


def _host_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _spec(tmp_path: Path, **overrides: object) -> SandboxSpec:
    (tmp_path / "ws").mkdir(exist_ok=True)
    chown_to_sandbox(tmp_path / "ws", LocalConfig())  # the sandbox writes as that uid
    (tmp_path / "pack").mkdir(exist_ok=True)
    (tmp_path / "pack" / "agent.txt").write_text("pack-file")
    fields: dict[str, object] = {
        "job_id": "job/7 ünïcode",
        "attempt": 2,
        "workspace": tmp_path / "ws",
        "pack_closure": tmp_path / "pack",
        "limits": LIMITS,
        "labels": {"acpw.token": "17", "team": "a"},
    }
    fields.update(overrides)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Building the shared /etc copies a few hundred entries: once per module, not per test.
    return tmp_path_factory.mktemp("etc") / "etc"


def _local(tmp_path: Path, etc: Path, **settings: object) -> LocalBackend:
    conf = LocalConfig(cgroup_parent="acpw-test", worker_id="w-1", **settings)  # type: ignore[arg-type]
    return LocalBackend(conf, state_dir=tmp_path / "state", etc_dir=etc)


async def _output(box: Sandbox, argv: list[str], **kw: object) -> tuple[int, bytes, bytes]:
    proc = await box.spawn(argv, env=ENV, **kw)  # type: ignore[arg-type]
    out, err = await asyncio.wait_for(
        asyncio.gather(proc.stdout.read(), proc.stderr.read()), timeout=20
    )
    return await proc.wait(), out, err


# --- contract, over every backend -----------------------------------------------------


@pytest.fixture(params=["local", "fake"])
async def made(
    request: pytest.FixtureRequest, tmp_path: Path, etc: Path
) -> AsyncIterator[tuple[SandboxBackend, Sandbox]]:
    backend: SandboxBackend = _local(tmp_path, etc) if request.param == "local" else FakeBackend()
    box = await backend.create(_spec(tmp_path))
    try:
        yield backend, box
    finally:
        await backend.destroy(box.sandbox_id)


async def test_stdin_to_stdout_roundtrip(made: tuple[SandboxBackend, Sandbox]) -> None:
    _, box = made
    proc = await box.spawn(["/bin/cat"], env=ENV)
    proc.stdin.write(b"hello\n")
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"hello\n"
    proc.stdin.close()
    assert await proc.wait() == 0
    assert proc.returncode == 0


async def test_env_is_exact_and_cwd_is_the_workspace(
    made: tuple[SandboxBackend, Sandbox], tmp_path: Path
) -> None:
    _, box = made
    rc, out, _ = await _output(box, ["/bin/sh", "-c", "echo $LANG:$HOME:$USER; echo x > here"])
    assert rc == 0
    assert out == b"C.UTF-8::\n"
    assert (tmp_path / "ws" / "here").read_text() == "x\n"


async def test_list_by_labels_and_destroy(made: tuple[SandboxBackend, Sandbox]) -> None:
    backend, box = made
    found = await backend.list({"team": "a", LABEL_JOB: "job/7 ünïcode", LABEL_ATTEMPT: "2"})
    assert [i.sandbox_id for i in found] == [box.sandbox_id]
    assert found[0].backend == backend.name
    assert await backend.list({"team": "b"}) == []
    proc = await box.spawn(["/bin/sh", "-c", "echo up; exec sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    await backend.destroy(box.sandbox_id)
    # Killed: bwrap itself by SIGKILL, or (when its child died first) bwrap reporting that.
    assert await asyncio.wait_for(proc.wait(), 5) in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert await backend.list({}) == []
    await backend.destroy(box.sandbox_id)  # idempotent


async def test_terminate_gives_the_program_grace(made: tuple[SandboxBackend, Sandbox]) -> None:
    _, box = made
    script = "trap 'echo bye; exit 3' TERM; echo up; while :; do sleep 0.05; done"
    proc = await box.spawn(["/bin/sh", "-c", script], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    proc.terminate()
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"bye\n"
    assert await asyncio.wait_for(proc.wait(), 10) == 3
    proc.terminate()  # idempotent after exit
    proc.kill()


async def test_kill_ends_the_process(made: tuple[SandboxBackend, Sandbox]) -> None:
    _, box = made
    proc = await box.spawn(["/bin/sh", "-c", "trap '' TERM; echo up; sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    proc.kill()
    assert await asyncio.wait_for(proc.wait(), 10) != 0


async def test_stdout_limit_bounds_one_line(made: tuple[SandboxBackend, Sandbox]) -> None:
    _, box = made
    proc = await box.spawn(
        ["/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; echo"], env=ENV, stdout_limit=1024
    )
    with pytest.raises(ValueError, match="limit"):
        await asyncio.wait_for(proc.stdout.readline(), 10)
    proc.kill()
    await proc.wait()


# --- local specifics ------------------------------------------------------------------


@pytest.fixture
async def local_box(tmp_path: Path, etc: Path) -> AsyncIterator[tuple[LocalBackend, LocalSandbox]]:
    backend = _local(tmp_path, etc)
    box = await backend.create(_spec(tmp_path))
    try:
        yield backend, box
    finally:
        await backend.destroy(box.sandbox_id)


async def test_cgroups_carry_the_limits(local_box: tuple[LocalBackend, LocalSandbox]) -> None:
    _, box = local_box
    memory, pids, cpu = box.cgroups.paths
    assert memory == Path("/sys/fs/cgroup/memory/acpw-test") / box.sandbox_id
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(200 << 20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text().strip() == str(200 << 20)
    assert (memory / "memory.swappiness").read_text().strip() == "0"
    assert (pids / "pids.max").read_text().strip() == "50"
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"


async def test_spawned_tree_is_in_the_cgroups(local_box: tuple[LocalBackend, LocalSandbox]) -> None:
    backend, box = local_box
    proc = await box.spawn(["/bin/sh", "-c", "sleep 60 & echo up; wait"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    tree = [proc.pid, *descendants(proc.pid)]
    assert len(tree) >= 4  # bwrap, its pid-1 init, sh, sleep
    for path in box.cgroups.paths:
        assert set(tree) <= {int(p) for p in (path / "cgroup.procs").read_text().split()}
    # bwrap itself runs as the sandbox's host uid, with nothing to gain capabilities from.
    creds = dict(
        line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
    )
    uid, gid = LocalConfig().host_owner()
    assert creds["Uid"].split() == [str(uid)] * 4
    assert creds["Gid"].split() == [str(gid)] * 4
    assert creds["Groups"].strip() == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(creds[caps], 16) == 0, caps
    status = await backend.status(box.sandbox_id)
    assert status is not None
    assert proc.pid in status.pids
    assert len(status.pids) >= 3  # bwrap, its pid-1 init, sh (+ sleep)
    record = backend.store.read(box.sandbox_id)
    assert record is not None
    assert proc.pid in record.pids
    proc.kill()
    await proc.wait()


@pytest.mark.parametrize("delay", [0.0, 0.05])
async def test_the_program_starts_inside_its_cgroups_however_slow_the_join(
    local_box: tuple[LocalBackend, LocalSandbox], monkeypatch: pytest.MonkeyPatch, delay: float
) -> None:
    # A slow first migration (an RCU grace period on a cold kernel) must not let bwrap
    # clone the sandbox, or the program run, outside the cgroups: the sandbox's cgroup
    # namespace is then rooted at its own cgroup, so every line reads "/".
    _, box = local_box
    join = cgroups.join
    calls: list[int] = []

    def slow_join(cgs: cgroups.CgroupSet, pid: int) -> None:
        if not calls:
            time.sleep(delay)
        calls.append(pid)
        join(cgs, pid)

    monkeypatch.setattr(cgroups, "join", slow_join)
    rc, out, err = await _output(box, ["/bin/cat", "/proc/self/cgroup"])
    assert rc == 0, err
    lines = out.decode().splitlines()
    assert {line.split(":", 1)[1] for line in lines if line.split(":")[1]} >= {"memory:/", "pids:/"}
    assert all(line.endswith(":/") for line in lines), lines
    assert len(calls) == 2  # bwrap, then its sandboxed child


async def test_thorough_drop_also_empties_bwraps_bounding_set(
    local_box: tuple[LocalBackend, LocalSandbox],
) -> None:
    # What a host whose bwrap is set-uid, or whose worker holds inheritable caps, gets.
    backend, box = local_box
    backend.tools.thorough = True  # None: detected on first use
    rc, out, _ = await _output(box, ["/bin/echo", "ran"])
    assert (rc, out) == (0, b"ran\n")
    proc = await box.spawn(["/bin/sh", "-c", "sleep 60 & echo up; wait"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    creds = dict(
        line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
    )
    assert int(creds["CapBnd"], 16) == 0
    assert int(creds["CapInh"], 16) == 0
    proc.kill()
    await proc.wait()


async def test_quiesce_returns_once_nothing_can_run_and_destroy_removes_the_rest(
    local_box: tuple[LocalBackend, LocalSandbox],
) -> None:
    """``quiesce`` kills a tree that keeps forking and holds an inotify instance (whose
    release waits for a grace period), and returns once every process left is exiting:
    none runs, writes or forks again. The record and cgroups stay until ``destroy``."""
    backend, box = local_box
    inotify = (
        "import ctypes, time; libc = ctypes.CDLL(None); fd = libc.inotify_init(); "
        "libc.inotify_add_watch(fd, b'/tmp', 0x100); print('up', flush=True); time.sleep(60)"
    )
    script = f'while :; do sleep 0.01 & sleep 0.005; done & exec python3 -c "{inotify}"'
    proc = await box.spawn(["/bin/sh", "-c", script], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    await backend.quiesce(box.sandbox_id)
    left = cgroups.members(box.cgroups)
    assert all(cgroups.exiting(pid) for pid in left)
    await asyncio.sleep(0.05)
    assert cgroups.members(box.cgroups) <= left  # no new process
    assert [s.sandbox_id for s in await backend.list({})] == [box.sandbox_id]
    await backend.quiesce(box.sandbox_id)  # idempotent
    await backend.destroy(box.sandbox_id)
    assert await backend.list({}) == []
    assert not any(path.exists() for path in box.cgroups.paths)


async def test_staging_leaves_the_workers_namespace_and_directory_alone(
    tmp_path: Path, etc: Path
) -> None:
    """A root worker stages the sandbox's sources in a mount namespace it makes on a
    thread of its own: every thread of the worker is still in its namespace, in its
    directory, and the host's mount table holds only the namespace's file."""
    ns, cwd = os.readlink("/proc/self/ns/mnt"), os.getcwd()
    backend = _local(tmp_path, etc)
    assert backend.privileged  # these machines run the tests as root
    box = await backend.create(_spec(tmp_path))
    try:
        threads = {
            os.readlink(f"/proc/self/task/{t}/ns/mnt") for t in os.listdir("/proc/self/task")
        }
        assert (threads, os.getcwd()) == ({ns}, cwd)
        record = backend.store.read(box.sandbox_id)
        assert record is not None
        assert record.stage is not None
        # (This host's sandboxes share the stage directory: only this one's are looked at.)
        ours = staging.ns_file(record.stage)
        assert disk.mounts_below(record.stage) == []
        assert ours in disk.mounts_below(record.stage.parent)
        code, out, _ = await _output(box, ["cat", "/opt/acp-pack/agent.txt"])
        assert (code, out) == (0, b"pack-file")
    finally:
        await backend.destroy(box.sandbox_id)
    assert ours not in disk.mounts_below(record.stage.parent)


async def test_labels_and_id(local_box: tuple[LocalBackend, LocalSandbox]) -> None:
    backend, box = local_box
    assert box.sandbox_id.startswith("acpw-job-7-n-code-2-")
    [info] = await backend.list({})
    assert info.labels == {
        LABEL_JOB: "job/7 ünïcode",
        LABEL_ATTEMPT: "2",
        LABEL_WORKER: "w-1",
        "acpw.token": "17",
        "team": "a",
    }


async def test_pack_and_extra_mounts_are_read_only(tmp_path: Path, etc: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "e.txt").write_text("extra-file")
    backend = _local(tmp_path, etc)
    box = await backend.create(
        _spec(tmp_path, extra_mounts=(ReadOnlyMount(source=extra, target="/opt/extra"),))
    )
    try:
        script = "cat /opt/acp-pack/agent.txt /opt/extra/e.txt; touch /opt/extra/n 2>&1 || true"
        rc, out, _ = await _output(box, ["/bin/sh", "-c", script])
        assert rc == 0
        assert out.startswith(b"pack-fileextra-file")
        assert b"Read-only file system" in out
        assert not (extra / "n").exists()
    finally:
        await backend.destroy(box.sandbox_id)


async def test_credentials_never_on_a_command_line(
    local_box: tuple[LocalBackend, LocalSandbox],
) -> None:
    _, box = local_box
    secret = "sk-canary-6b1f0c"
    proc = await box.spawn(
        ["/bin/sh", "-c", "echo up; cat /proc/1/cmdline; sleep 60"],
        env={**ENV, "API_KEY": secret},
    )
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    init_cmdline = await asyncio.wait_for(proc.stdout.read(200), 10)
    host_cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert secret.encode() not in host_cmdline
    assert secret.encode() not in init_cmdline
    assert str(box.spec.workspace).encode() not in init_cmdline  # no host paths either
    proc.kill()
    await proc.wait()


async def test_spawn_after_destroy_fails_visibly(
    local_box: tuple[LocalBackend, LocalSandbox],
) -> None:
    backend, box = local_box
    await backend.destroy(box.sandbox_id)
    marker = box.spec.workspace / "ran"
    with pytest.raises(SandboxError, match="cgroups"):
        await box.spawn(["/bin/sh", "-c", "touch /workspace/ran"], env=ENV)
    await asyncio.sleep(0.2)  # had the gate opened, the program would have run by now
    assert not marker.exists()
    assert not [p for p in _host_pids() if _cmdline(p).startswith(b"/bin/sh\0-c\0touch")]


async def test_create_refuses_bad_specs(tmp_path: Path, etc: Path) -> None:
    backend = _local(tmp_path, etc)
    with pytest.raises(SandboxError, match="network"):
        await backend.create(_spec(tmp_path, network="allowlist"))
    with pytest.raises(SandboxError, match="workspace") as info:
        await backend.create(_spec(tmp_path, workspace=tmp_path / "missing"))
    assert info.value.code == "sandbox_failed"
    assert await backend.list({}) == []


async def test_create_without_cgroup_controllers_cleans_up(tmp_path: Path, etc: Path) -> None:
    # This host's unified hierarchy exists but has no controllers (all are on v1).
    backend = _local(tmp_path, etc, cgroup_root=Path("/sys/fs/cgroup/unified"))
    with pytest.raises(SandboxError, match="controllers") as info:
        await backend.create(_spec(tmp_path))
    assert info.value.details["action"] == "create"
    assert await backend.list({}) == []
    assert not Path("/sys/fs/cgroup/unified/acpw-test").exists()


async def test_destroy_refuses_foreign_ids(tmp_path: Path, etc: Path) -> None:
    backend = _local(tmp_path, etc)
    with pytest.raises(SandboxError):
        await backend.destroy("../../etc")
    await backend.destroy("acpw-never-made-1-00000000")  # unknown: nothing to do
    assert await backend.status("acpw-never-made-1-00000000") is None


async def test_spawn_refuses_bad_arguments(local_box: tuple[LocalBackend, LocalSandbox]) -> None:
    _, box = local_box
    with pytest.raises(SandboxError):
        await box.spawn([], env=ENV)
    with pytest.raises(SandboxError):
        await box.spawn(["/bin/true"], env=ENV, cwd="relative")
    with pytest.raises(SandboxError):
        await box.spawn(["/bin/true"], env={"A=B": "c"})
    with pytest.raises(SandboxError):
        await box.spawn(["/bin/echo", "a\0b"], env=ENV)


async def test_missing_bwrap_is_a_sandbox_error(tmp_path: Path, etc: Path) -> None:
    backend = _local(tmp_path, etc, bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxError, match="bubblewrap"):
        await backend.create(_spec(tmp_path))
    assert os.path.exists("/usr/bin/bwrap")  # the real one is there; only the setting is bad
