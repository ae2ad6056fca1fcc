"""The workspace's own bounded filesystem: real loop-mounted ext4, real runs, real reaper.

An agent that writes past ``limits.disk_mb`` gets ENOSPC inside its sandbox, the job still
settles cleanly, the host holds no more than the bound, and no mount or loop device is
left behind on any exit path (normal end, kept workspace reaped later, dead worker).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.integration.docker_engine import base_image, docker_host, engine_config
from worker.errors import SandboxError, WorkspaceUnavailable
from worker.sandbox.config import DockerConfig
from worker.service.reaper import reap_workspaces
from worker.settings import Settings
from worker.workspace import disk
from worker.workspace.prepare import Prepared, prepare_workspace, write_labels
from worker.workspace.stage import remove_staged

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures of the docker test

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
FILL = "exec sh -c 'head -c 67108864 /dev/zero > big.bin; echo rc=$?; ls -l big.bin'"


def _loops_under(root: Path) -> list[str]:
    """Loop devices whose backing file is below ``root``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            target = backing.read_text().strip()
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(f"{backing.parts[3]}: {target}")
    return found


def _leftovers(root: Path) -> list[str]:
    return [str(p) for p in disk.mounts_below(root)] + _loops_under(root)


# --- the disk itself --------------------------------------------------------------------


def test_a_bounded_disk_stops_writes_at_its_size_and_goes_away(tmp_path: Path) -> None:
    job_dir = tmp_path / "job dir"  # a space: mountinfo escapes it
    job_dir.mkdir()
    bounded = disk.mount_bounded(job_dir, size_mb=16)
    assert disk.mounts_below(tmp_path) == [bounded.mount]
    stats = os.statvfs(bounded.mount)
    assert 14 * MIB <= stats.f_blocks * stats.f_frsize <= 16 * MIB
    written, failure = 0, None
    with open(bounded.mount / "fill", "wb") as out:
        try:
            while written < 64 * MIB:
                out.write(b"x" * 65536)
                out.flush()
                written += 65536
        except OSError as exc:
            failure = exc.errno
    assert failure == errno.ENOSPC
    assert written <= 16 * MIB
    assert os.stat(bounded.image).st_blocks * 512 <= 16 * MIB  # the host holds the bound
    remove_staged(job_dir)
    assert not job_dir.exists()
    assert _leftovers(tmp_path) == []


def test_disks_are_copies_of_one_template_made_once(tmp_path: Path) -> None:
    """The worker formats a size once (a template under its cache, never mounted, read
    only) and copies it for each disk: each copy is a filesystem of its own, of the full
    size, empty, sparse on the host."""
    templates = tmp_path / "cache" / disk.TEMPLATES
    made, stamps = [], []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            made.append(disk.mount_bounded(tmp_path / name, size_mb=64, templates=templates))
            stamps.append([(p.name, p.stat().st_mtime_ns) for p in templates.iterdir()])
        _two_copies(tmp_path, templates, made, stamps)
    finally:  # a failed check leaves nothing mounted
        disk.unmount_below(tmp_path)
    for name in ("a", "b"):
        remove_staged(tmp_path / name)
    assert _leftovers(tmp_path) == []


def _two_copies(
    tmp_path: Path, templates: Path, made: list[disk.BoundedDisk], stamps: list[Any]
) -> None:
    assert stamps[0] == stamps[1]  # made once, not written since
    [template] = templates.iterdir()
    assert template.name.startswith("ext4-64m-")
    assert template.stat().st_mode & 0o777 == 0o400
    assert templates.stat().st_mode & 0o777 == 0o700
    first, second = made
    (first.mount / "only-here").write_text("a")
    assert sorted(p.name for p in second.mount.iterdir()) == ["lost+found"]
    for bounded in made:
        stats = os.statvfs(bounded.mount)
        assert 56 * MIB <= stats.f_blocks * stats.f_frsize <= 64 * MIB
        assert os.stat(bounded.image).st_blocks * 512 < 8 * MIB  # sparse: metadata only
    assert all(disk.mounts_below(tmp_path / n) for n in ("a", "b"))
    assert template not in [Path(p.split(": ", 1)[1]) for p in _loops_under(tmp_path)]


def test_a_template_copied_by_reading_where_the_kernel_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache and the work directory on two filesystems: ``copy_file_range`` refuses
    (EXDEV), and the copy reads and writes instead, to the same disk."""
    calls = []

    def refuse(*args: object) -> int:
        calls.append(args)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    try:
        bounded = disk.mount_bounded(tmp_path, size_mb=32, templates=tmp_path / "tpl")
        assert calls
        (bounded.mount / "works").write_text("yes")
    finally:
        disk.unmount_below(tmp_path)
    assert _leftovers(tmp_path) == []


def test_a_disk_from_the_template_spawns_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the template exists, a disk is a copy and a mount the worker makes itself:
    no ``mkfs`` and no ``mount(8)``."""
    templates = tmp_path / "tpl"
    disk.template(templates, 16)
    spawned: list[str] = []
    real = subprocess.run

    def record(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        spawned.append(argv[0])
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", record)
    try:
        (tmp_path / "job").mkdir()
        bounded = disk.mount_bounded(tmp_path / "job", size_mb=16, templates=templates)
        assert disk.mounts_below(tmp_path) == [bounded.mount]
    finally:
        disk.unmount_below(tmp_path)
    assert spawned == []
    assert _leftovers(tmp_path) == []


def test_without_loop_configure_mount8_mounts_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker sets up the loop device itself (``LOOP_CONFIGURE``, Linux 5.8); on a
    kernel without it, ``mount(8)`` does, to the same disk."""
    real = fcntl.ioctl

    def older_kernel(fd: int, request: int, *args: Any) -> Any:
        if request == disk._LOOP_CONFIGURE:
            raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")
        return real(fd, request, *args)

    monkeypatch.setattr(fcntl, "ioctl", older_kernel)
    try:
        bounded = disk.mount_bounded(tmp_path, size_mb=16, templates=tmp_path / "tpl")
        (bounded.mount / "works").write_text("yes")
        assert disk.mounts_below(tmp_path) == [bounded.mount]
    finally:
        disk.unmount_below(tmp_path)
    assert _leftovers(tmp_path) == []


def test_a_damaged_template_fails_the_disk_cleanly_and_is_made_again(tmp_path: Path) -> None:
    """A template that is not a filesystem (damaged on the cache's disk) makes no disk:
    a ``disk_failed`` error naming it, nothing mounted, and the template removed, so the
    next disk of that size formats a fresh one and mounts."""
    templates = tmp_path / "tpl"
    templates.mkdir(mode=0o700)
    damaged = disk.template(templates, 16)
    damaged.chmod(0o600)
    damaged.write_bytes(b"\0" * MIB)
    (tmp_path / "job").mkdir()
    with pytest.raises(SandboxError) as failed:
        disk.mount_bounded(tmp_path / "job", size_mb=16, templates=templates)
    assert failed.value.details["reason"] == "disk_failed"
    assert failed.value.details["template"] == str(damaged)
    assert str(damaged) in failed.value.message
    assert _leftovers(tmp_path) == []
    assert not damaged.exists()
    (tmp_path / "next").mkdir()
    bounded = disk.mount_bounded(tmp_path / "next", size_mb=16, templates=templates)
    try:
        assert damaged.is_file()  # formatted again
        (bounded.mount / "ok").write_text("mounted")
    finally:
        disk.unmount_below(tmp_path)


def test_templates_of_another_format_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older worker's template (its name carries another format's digest) is removed
    once this worker makes its own; and one that vanishes between the template's lookup
    and its copy is made again (a worker of the other format removed it)."""
    templates = tmp_path / "tpl"
    templates.mkdir(mode=0o700)
    stale = templates / "ext4-16m-000000000000.img"
    stale.write_bytes(b"old")
    other_size = disk.template(templates, 24)  # this format, another size: kept
    assert not stale.exists()
    current = disk.template(templates, 16)
    assert other_size.is_file()
    assert current.is_file()
    current.unlink()  # as if another worker removed it after the lookup
    (tmp_path / "job").mkdir()
    real_template = disk.template
    calls: list[int] = []

    def lookup(directory: Path, size_mb: int) -> Path:
        calls.append(size_mb)
        return current if len(calls) == 1 else real_template(directory, size_mb)

    monkeypatch.setattr(disk, "template", lookup)
    bounded = disk.mount_bounded(tmp_path / "job", size_mb=16, templates=templates)
    try:
        assert calls == [16, 16]
        assert current.is_file()
        (bounded.mount / "ok").write_text("mounted")
    finally:
        disk.unmount_below(tmp_path)


def test_unmount_below_detaches_a_busy_mount(tmp_path: Path) -> None:
    bounded = disk.mount_bounded(tmp_path, size_mb=16)
    handle = open(bounded.mount / "held", "w")  # noqa: SIM115 - kept open on purpose
    try:
        assert disk.unmount_below(tmp_path) == [bounded.mount]
        assert disk.mounts_below(tmp_path) == []  # gone from the mount table at once
        handle.write("still writable through the open descriptor")
    finally:
        handle.close()
    assert _loops_under(tmp_path) == []  # released with its last user


def test_a_workspace_larger_than_its_disk_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "big.bin").write_bytes(os.urandom(20 * MIB))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    prepared, failure = _prepare(source, job_dir, disk_mb=16)
    assert isinstance(failure, WorkspaceUnavailable)
    assert "does not fit in limits.disk_mb (16 MiB)" in failure.message
    asyncio.run(prepared.remove())
    assert not job_dir.exists()
    assert _leftovers(tmp_path) == []


def _prepare(
    source: Path, job_dir: Path, *, disk_mb: int, owner: tuple[int, int] = (0, 0), **settings: Any
) -> tuple[Prepared, Any]:
    """``prepare_workspace`` of a local source; returns what to clean up and the result
    (or the exception it raised)."""
    from worker.jobs.spec import LocalWorkspace

    prepared = Prepared(cleanup=[job_dir])
    coro = prepare_workspace(
        LocalWorkspace(path=str(source)),
        prepared,
        settings=Settings(**settings),
        job_dir=job_dir,
        base_dir=None,
        provider="cursor",
        owner=owner,
        secrets={},
        disk_mb=disk_mb,
    )
    try:
        return prepared, asyncio.run(coro)
    except Exception as exc:
        return prepared, exc


def test_staging_on_the_disk_keeps_lost_found_out_of_the_workspace(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("print(1)\n")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    prepared, staged = _prepare(source, job_dir, disk_mb=32, owner=(61000, 61000))
    try:
        assert staged.path == job_dir / "disk" / "workspace"
        assert sorted(p.name for p in staged.path.iterdir()) == ["pkg"]
        assert set(staged.before) == {"pkg", "pkg/a.py"}
        assert staged.path.stat().st_uid == 61000
        assert (job_dir / "disk" / "lost+found").is_dir()
    finally:
        asyncio.run(prepared.remove())
    assert _leftovers(tmp_path) == []


def test_off_stages_on_the_host_disk(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    prepared, staged = _prepare(source, job_dir, disk_mb=32, workspace_disk="off")
    assert staged.path == job_dir / "workspace"
    assert prepared.disk is None
    assert disk.mounts_below(tmp_path) == []
    asyncio.run(prepared.remove())


def test_without_root_the_disk_is_refused_clearly(tmp_path: Path) -> None:
    """As uid 61000 the loop disk cannot be made: a typed refusal that names the way out.

    The unprivileged side is a forked child of this process, so it needs no read access
    to the checkout (a clone under a 0700 directory must pass too)."""
    tmp_path.chmod(0o777)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the sandbox uid, try, report, exit
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(61000, 61000, 61000)
            os.setresuid(61000, 61000, 61000)
            try:
                disk.mount_bounded(tmp_path, size_mb=16)
                report = "mounted"
            except SandboxError as exc:
                report = f"{exc.details['reason']} {exc.message}"
            os.write(write_end, report.encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        report = reader.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report.startswith("disk_unavailable"), report
    assert "ACPW_WORKSPACE_DISK=off" in report
    assert list(tmp_path.iterdir()) == []  # refused before making anything


def test_mkfs_failure_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / disk.MOUNT).mkdir()  # the mount point is taken: nothing is half-made
    with pytest.raises(SandboxError) as info:
        disk.mount_bounded(tmp_path, size_mb=16)
    assert info.value.details["reason"] == "disk_failed"
    assert disk.mounts_below(tmp_path) == []


# --- the reaper -------------------------------------------------------------------------


async def test_the_reaper_unmounts_a_dead_workers_disk(tmp_path: Path, redis_url: str) -> None:
    work = tmp_path / "work"
    job_dir = work / "gone-1-abcd"
    job_dir.mkdir(parents=True)
    write_labels(job_dir, {"acpw.job": "gone", "acpw.token": "0", "pid": "0"})
    bounded = disk.mount_bounded(job_dir, size_mb=16)
    (bounded.mount / "workspace").mkdir()
    (bounded.mount / "workspace" / "left.txt").write_text("left behind")
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await reap_workspaces(client, work) == [job_dir.name]
    finally:
        await client.aclose()
    assert list(work.iterdir()) == []
    assert _leftovers(tmp_path) == []


# --- whole runs -------------------------------------------------------------------------


def _run(
    tmp_path: Path,
    prompt: str,
    *,
    disk_mb: int,
    settings: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[int, list[Any], str]:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "key").write_text("disk-test-key-1234\n")
    job = {
        "v": 1,
        "job_id": f"disk-{uuid.uuid4().hex[:8]}",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": prompt,
        "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128, "disk_mb": disk_mb},
        **extra,
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        ACPW_CACHE_DIR=str(tmp_path / "cache"),
        ACPW_WORK_DIR=str(tmp_path / "work"),
        ACPW_RESULTS_DIR=str(tmp_path / "results"),
        ACPW_SHUTDOWN_EOF_GRACE="1",
        ACPW_KEEP_WORKSPACE_S="0",
    )
    env.update(settings or {})
    argv = [sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return done.returncode, events, done.stderr


def _tool_output(events: list[Any]) -> str:
    return json.dumps([e["data"] for e in events if e["type"] == "tool.completed"])


def test_an_agent_filling_its_disk_gets_enospc_and_the_job_ends_cleanly(tmp_path: Path) -> None:
    code, events, stderr = _run(tmp_path, f"#!scenario\n{FILL}\nsay done\n", disk_mb=16)
    assert code == 0, stderr
    assert events[-1]["data"]["status"] == "succeeded"
    output = _tool_output(events)
    assert "No space left on device" in output
    assert "rc=1" in output
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    [big] = [p for p in changed["paths"] if p["path"] == "big.bin"]
    assert 8 * MIB < big["size"] <= 16 * MIB  # filled up to the bound, not a byte past
    assert list((tmp_path / "work").iterdir()) == []
    assert _leftovers(tmp_path) == []


async def test_a_kept_full_disk_holds_no_more_than_its_bound_until_reaped(
    tmp_path: Path, redis_url: str
) -> None:
    prompt = f"#!scenario\n{FILL}\n"
    code, events, stderr = await asyncio.to_thread(
        _run, tmp_path, prompt, disk_mb=16, keep_workspace=True
    )
    assert code == 0, stderr
    notices = [e["data"] for e in events if e["type"] == "notice"]
    kept = next(n for n in notices if n["code"] == "workspace_kept")
    workspace = Path(kept["details"]["path"])
    [job_dir] = list((tmp_path / "work").iterdir())
    assert workspace == job_dir / "disk" / "workspace"
    assert disk.mounts_below(tmp_path) == [job_dir / "disk"]  # kept: still mounted
    assert 8 * MIB < (workspace / "big.bin").stat().st_size <= 16 * MIB
    assert (job_dir / "disk.img").stat().st_blocks * 512 <= 16 * MIB
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await reap_workspaces(client, tmp_path / "work") == [job_dir.name]
    finally:
        await client.aclose()
    assert list((tmp_path / "work").iterdir()) == []
    assert _leftovers(tmp_path) == []


def test_a_job_whose_workspace_does_not_fit_fails_before_launch(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "data.bin").write_bytes(os.urandom(24 * MIB))
    code, events, _ = _run(tmp_path, "scenario: hello", disk_mb=16)
    assert code == 2
    error = events[-1]["data"]["error"]
    assert error["code"] == "workspace_unavailable"
    assert "limits.disk_mb" in error["message"]
    assert "sandbox.ready" not in [e["type"] for e in events]
    assert list((tmp_path / "work").iterdir()) == []
    assert _leftovers(tmp_path) == []


def test_an_unbounded_worker_says_so(tmp_path: Path) -> None:
    off = {"ACPW_WORKSPACE_DISK": "off"}
    code, events, stderr = _run(tmp_path, "scenario: hello", disk_mb=16, settings=off)
    assert code == 0, stderr
    notices = [e["data"] for e in events if e["type"] == "notice"]
    assert [n["code"] for n in notices] == ["workspace_disk_unbounded"]
    assert _leftovers(tmp_path) == []


# --- the docker backend binds the same bounded directory --------------------------------


async def test_docker_sandboxes_write_into_the_bounded_disk(
    tmp_path: Path, engine_config: Any, base_image: str
) -> None:
    from worker.events.sinks import MemorySink
    from worker.job import run_job
    from worker.jobs.spec import parse_job
    from worker.sandbox.docker import DockerBackend

    settings = Settings(
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        worker_id="w-disk",
        shutdown_eof_grace=1.0,
    )
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "README.md").write_text("# hi\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("docker-disk-key-1234\n")
    job = parse_job(
        {
            "v": 1,
            "job_id": f"disk-dk-{uuid.uuid4().hex[:6]}",
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
            "prompt": f"#!scenario\n{FILL}\nsay done\n",
            "credentials": {"CURSOR_API_KEY": "file:key"},
            "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128, "disk_mb": 16},
        }
    )
    sink = MemorySink()
    backend = DockerBackend(DockerConfig.from_settings(settings), engine_config=engine_config)
    outcome = await run_job(job, settings=settings, backend=backend, sinks=[sink], environ={})
    events = [dict(e) for e in sink.events]
    assert outcome.status == "succeeded", events[-1]
    assert "No space left on device" in _tool_output(events)
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    [big] = [p for p in changed["paths"] if p["path"] == "big.bin"]
    assert 8 * MIB < big["size"] <= 16 * MIB
    assert list((tmp_path / "work").iterdir()) == []
    assert _leftovers(tmp_path) == []
