"""``acp-worker pack gc`` against a real pack cache: real packs materialized through the
CLI, real locks held by another process, and a closure mounted by a running bubblewrap
sandbox."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_owner import chown_to_sandbox
from worker.cli import main
from worker.packs.cache import hold_closure
from worker.packs.gc import MountTable
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend

REPO = Path(__file__).resolve().parents[2]
EMULATOR = REPO / "provider_packs" / "cursor-emulator"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def _synthetic_pack(packs: Path, name: str, size: int) -> Path:
    """A pack folder with a fresh archive of ``size`` random bytes, locked by the CLI."""
    pack_dir = packs / name
    (pack_dir / "dist").mkdir(parents=True)
    manifest = {
        "schema": 1,
        "name": name,
        "version": "1.0.0",
        "provider": "cursor",
        "dialect": "acp",  # a toy agent, not under the cursor launch contract
        "launch": {"argv": ["{pack}/bin/agent", "acp"]},
    }
    (pack_dir / "pack.json").write_text(json.dumps(manifest))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data, mode in (
            ("bin/agent", b"#!/bin/sh\necho agent\n", 0o755),
            ("lib/blob", os.urandom(size), 0o644),
        ):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    (pack_dir / "dist" / "agent.tar").write_bytes(buf.getvalue())
    archive = str(pack_dir / "dist" / "agent.tar")
    assert main(["pack", "lock", archive, "--pack", str(pack_dir), "--platform", "any"]) == 0
    return pack_dir


def _tree_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def packs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    """Three real packs: the Cursor emulator and two synthetic ones (300 KB, 600 KB)."""
    emulator = tmp_path / "packs" / "cursor-emulator"
    shutil.copytree(EMULATOR, emulator, ignore=shutil.ignore_patterns("src"))
    found = {
        "emulator": emulator,
        "small": _synthetic_pack(tmp_path / "packs", "small", 300_000),
        "large": _synthetic_pack(tmp_path / "packs", "large", 600_000),
    }
    capsys.readouterr()
    return found


def _materialize(capsys: pytest.CaptureFixture[str], cache: Path, pack: Path) -> Path:
    code, out = _cli(capsys, "pack", "materialize", str(pack), "--cache", str(cache))
    assert code == 0
    return Path(out.strip())


def _gc(capsys: pytest.CaptureFixture[str], cache: Path, *argv: str) -> dict[str, Any]:
    code, out = _cli(capsys, "pack", "gc", "--cache", str(cache), "--json", *argv)
    assert code == 0
    report: dict[str, Any] = json.loads(out)
    return report


def _by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in report["entries"]}


def test_least_recently_used_go_first_until_under_budget(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path]
) -> None:
    closures = {name: _materialize(capsys, cache, pack) for name, pack in packs.items()}
    time.sleep(0.01)
    # A use (verify runs the launch-time check) makes the emulator the most recent.
    code, _ = _cli(capsys, "pack", "verify", str(packs["emulator"]), "--cache", str(cache))
    assert code == 0
    sizes = {name: _tree_bytes(path) for name, path in closures.items()}

    report = _gc(capsys, cache, "--budget", str(sizes["emulator"] + sizes["large"]))

    entries = _by_name(report)
    assert entries[closures["small"].name]["action"] == "removed"
    assert entries[closures["small"].name]["reason"] == "over budget"
    assert entries[closures["large"].name]["action"] == "kept"
    assert entries[closures["emulator"].name]["reason"] == "within budget"
    assert report["freed_bytes"] == sizes["small"]
    assert report["kept_bytes"] == sizes["emulator"] + sizes["large"]
    assert report["over_budget"] is False
    assert not closures["small"].exists()
    assert closures["large"].is_dir()
    assert closures["emulator"].is_dir()
    assert os.listdir(cache / "tmp") == []  # removed through tmp/, nothing left behind
    # The cache still works: the removed pack is extracted again on its next use.
    assert _materialize(capsys, cache, packs["small"]) == closures["small"]
    assert _tree_bytes(closures["small"]) == sizes["small"]


def test_dry_run_reports_and_removes_nothing(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path]
) -> None:
    closures = [_materialize(capsys, cache, pack) for pack in packs.values()]
    before = {p: _tree_bytes(p) for p in closures}

    report = _gc(capsys, cache, "--budget", "0", "--dry-run")

    assert report["dry_run"] is True
    assert {e["action"] for e in report["entries"]} == {"would_remove"}
    assert report["freed_bytes"] == sum(before.values())
    assert {p: _tree_bytes(p) for p in closures} == before


def test_text_output_names_each_entry_and_the_bytes_freed(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path]
) -> None:
    small = _materialize(capsys, cache, packs["small"])
    code, out = _cli(capsys, "pack", "gc", "--cache", str(cache), "--budget", "0")
    assert code == 0
    line, summary = out.splitlines()
    assert line.startswith(f"removed      closure  {small.name}  293.")  # 300 004 bytes
    assert line.endswith("(over budget)")
    assert summary == "freed 293.0 KiB; kept 0 B of a 0 B budget"


def test_a_bad_budget_is_a_usage_error(capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["pack", "gc", "--cache", str(cache), "--budget", "ten gigs"])
    assert info.value.code == 2
    assert "not a size: 'ten gigs'" in capsys.readouterr().err


def _hold_lock(lock: Path) -> subprocess.Popen[str]:
    """Another process holding ``lock`` (as a materializer extracting does)."""
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_locked_closures_and_leftovers_are_kept_until_released(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path]
) -> None:
    closure = _materialize(capsys, cache, packs["large"])
    crashed = cache / "tmp" / f"{closure.name}.crashed1"  # a half extraction, by its name
    (crashed / "lib").mkdir(parents=True)
    (crashed / "lib" / "blob").write_bytes(b"x" * 1000)
    holder = _hold_lock(cache / "locks" / f"{closure.name}.lock")
    try:
        held = _by_name(_gc(capsys, cache, "--budget", "0"))
    finally:
        holder.communicate("", timeout=10)  # EOF: the holder exits, the lock is released
    assert held[closure.name]["reason"] == "in use: locked"
    assert held[crashed.name] == {**held[crashed.name], "kind": "leftover", "action": "kept"}
    assert closure.is_dir()
    assert crashed.is_dir()

    released = _by_name(_gc(capsys, cache, "--budget", "0"))
    assert released[crashed.name]["action"] == "removed"
    assert released[crashed.name]["reason"] == "leftover"
    assert released[closure.name]["action"] == "removed"
    assert not closure.exists()
    assert not crashed.exists()


async def test_a_closure_mounted_by_a_running_sandbox_is_never_removed(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path], tmp_path: Path
) -> None:
    in_use = _materialize(capsys, cache, packs["emulator"])
    idle = _materialize(capsys, cache, packs["small"])
    os.utime(idle)  # the idle one is even the most recently used
    workspace = tmp_path / "ws"
    workspace.mkdir()
    conf = LocalConfig(cgroup_parent="acpw-test", worker_id="gc-test")
    chown_to_sandbox(workspace, conf)
    backend = LocalBackend(conf, state_dir=tmp_path / "state", etc_dir=tmp_path / "etc")
    spec = SandboxSpec(
        job_id="gc-in-use",
        attempt=1,
        workspace=workspace,
        pack_closure=in_use,
        limits=ResourceLimits(memory_bytes=200 << 20, cpus=0.5, pids=50),
        labels={},
        mask_config=False,
    )
    box = await backend.create(spec)
    try:
        proc = await box.spawn(
            ["/bin/sh", "-c", "ls /opt/acp-pack/cursor_emulator.py; exec sleep 60"],
            env={"PATH": "/usr/bin:/bin"},
        )
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert line == b"/opt/acp-pack/cursor_emulator.py\n"
        during = await asyncio.to_thread(_gc, capsys, cache, "--budget", "0")
    finally:
        await backend.destroy(box.sandbox_id)
    entries = _by_name(during)
    assert entries[in_use.name]["action"] == "kept"
    assert entries[in_use.name]["reason"] == "in use: mounted"
    assert entries[idle.name]["action"] == "removed"
    assert during["over_budget"] is True
    assert in_use.is_dir()
    assert not idle.exists()

    after = _by_name(_gc(capsys, cache, "--budget", "0"))
    assert after[in_use.name]["action"] == "removed"
    assert not in_use.exists()


def test_mountinfo_escapes_are_decoded(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "27 1 254:0 / / rw - ext4 /dev/vda rw\n"
        "67 65 254:0 /srv/my\\040cache/c /opt/acp-pack ro - ext4 /dev/vda rw\n"
    )
    table = MountTable.read(proc)
    assert ("254:0", "/srv/my cache/c") in table.everywhere


def test_a_job_hold_keeps_its_closure_and_a_vanished_closure_is_not_held(
    capsys: pytest.CaptureFixture[str], cache: Path, packs: dict[str, Path]
) -> None:
    # What the runner does from prepare_pack until teardown (shared: jobs of the same
    # pack hold it together, and a materializer of a published closure takes no lock).
    closure = _materialize(capsys, cache, packs["small"])
    first = hold_closure(cache, closure)
    second = hold_closure(cache, closure)
    assert first is not None
    assert second is not None
    try:
        assert _by_name(_gc(capsys, cache, "--budget", "0"))[closure.name]["action"] == "kept"
        assert _materialize(capsys, cache, packs["small"]) == closure  # not blocked
    finally:
        os.close(first)
        os.close(second)
    assert _by_name(_gc(capsys, cache, "--budget", "0"))[closure.name]["action"] == "removed"
    assert hold_closure(cache, closure) is None  # gone: the runner prepares it again
