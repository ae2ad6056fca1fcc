"""The reaper and what ``acp-worker run`` makes: a job without a lease (token ``0``) is
reaped once its process is gone — sandbox, cgroups, staging namespace, loop device and
work directory — and never while the process lives. Real bubblewrap, real Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.procs import finish
from worker.errors import SandboxError
from worker.leases.owner import LABEL_OWNER, owner_labels, owner_state
from worker.leases.reaper import reap_once, reap_pass
from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_TOKEN, ResourceLimits, SandboxSpec
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import DEFAULT_STAGE_DIR, LocalBackend, SandboxRecord
from worker.settings import Settings
from worker.workspace import disk
from worker.workspace.prepare import write_labels

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        reap_backends=("local",),
    )


def _start_run(tmp_path: Path, job_id: str) -> subprocess.Popen[str]:
    """``acp-worker run`` of a hanging turn, returned once the turn is under way."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("reaper-test-key-0001\n")
    job = {
        "v": 1,
        "job_id": job_id,
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": "scenario: hang",
        "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 120, "memory_mb": 512, "pids": 128, "disk_mb": 64},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        ACPW_CACHE_DIR=str(tmp_path / "cache"),
        ACPW_WORK_DIR=str(tmp_path / "work"),
        ACPW_RESULTS_DIR=str(tmp_path / "results"),
        ACPW_SHUTDOWN_EOF_GRACE="1",
    )
    argv = [sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"), "--json"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the turn is running
        if '"message.delta"' in line:
            return proc
    _, err = finish(proc, timeout=30)
    pytest.fail(f"the run ended before its turn: {err}")


def _records(tmp_path: Path, redis_url: str, job_id: str) -> list[SandboxRecord]:
    backend = LocalBackend(_settings(tmp_path, redis_url))  # the host's sandbox records
    infos = asyncio.run(backend.list({LABEL_JOB: job_id}))
    records = [backend.store.read(info.sandbox_id) for info in infos]
    return [r for r in records if r is not None]


def _leftovers(tmp_path: Path, records: list[SandboxRecord], job_id: str) -> dict[str, Any]:
    mountinfo = Path("/proc/self/mountinfo").read_text()
    return {
        "records": [r.sandbox_id for r in _records(tmp_path, "redis://unused", job_id)],
        "cgroups": [str(p) for r in records for p in r.cgroups.paths if p.exists()],
        "stage": [r.sandbox_id for r in records if r.sandbox_id in mountinfo]
        + [str(p) for r in records for p in DEFAULT_STAGE_DIR.glob(f"{r.sandbox_id}*")],
        "loops": _loops_under(tmp_path),
        "mounts": [str(p) for p in disk.mounts_below(tmp_path)],
        "work": sorted(p.name for p in (tmp_path / "work").iterdir()),
    }


def _loops_under(root: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            target = backing.read_text().strip()
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(f"{backing.parts[3]}: {target}")
    return found


def test_a_killed_run_is_reaped_whole_and_a_live_one_is_left_alone(
    tmp_path: Path, redis_url: str
) -> None:
    job_id = f"reap-run-{uuid.uuid4().hex[:8]}"
    settings = _settings(tmp_path, redis_url)
    proc = _start_run(tmp_path, job_id)
    try:
        record, job_dir = _check_alone_while_alive(tmp_path, settings, job_id)
        proc.send_signal(signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not waited for yet:
        assert owner_state(record.labels[LABEL_OWNER]) == "gone"  # a zombie is gone too
        report = asyncio.run(reap_pass(settings))
    finally:
        proc.kill()
        finish(proc, timeout=30)
    assert record.sandbox_id in report.destroyed
    assert report.workspaces == (job_dir.name,)
    assert report.lost == ()  # no lease, no Redis state: nothing to settle
    assert _leftovers(tmp_path, [record], job_id) == {
        "records": [],
        "cgroups": [],
        "stage": [],
        "loops": [],
        "mounts": [],
        "work": [],
    }


def _check_alone_while_alive(
    tmp_path: Path, settings: Settings, job_id: str
) -> tuple[SandboxRecord, Path]:
    """A pass while the run is alive leaves its sandbox and work directory alone."""
    [record] = _records(tmp_path, "redis://unused", job_id)
    assert record.labels[LABEL_TOKEN] == "0"
    assert owner_state(record.labels[LABEL_OWNER]) == "alive"
    [job_dir] = (tmp_path / "work").iterdir()
    alive = asyncio.run(reap_pass(settings))
    assert record.sandbox_id not in alive.destroyed
    assert job_dir.name not in alive.workspaces
    assert _records(tmp_path, "redis://unused", job_id) == [record]
    assert job_dir.is_dir()
    assert _loops_under(tmp_path) != []  # the workspace disk is still there, in use
    status = asyncio.run(LocalBackend(settings).status(record.sandbox_id))
    assert status is not None
    assert status.running
    return record, job_dir


# --- the rules, on the in-package fake backend ------------------------------------------


class _StuckBackend(FakeBackend):
    """A backend whose destroy fails (a busy cgroup, say): the sandbox stays."""

    async def destroy(self, sandbox_id: str) -> None:
        raise SandboxError("sandbox processes survived destroy", sandbox_id=sandbox_id)


def _gone_owner() -> str:
    """This process's owner label with another start time: a reused pid, i.e. gone."""
    boot, namespace, pid, _ = owner_labels()[LABEL_OWNER].split(":")
    return f"{boot}:{namespace}:{pid}:1"


async def _sandbox_and_dir(backend: FakeBackend, work: Path, job_id: str, owner: str) -> Path:
    labels = {LABEL_TOKEN: "0", LABEL_OWNER: owner}
    spec = SandboxSpec(
        job_id=job_id,
        attempt=1,
        workspace=Path("/tmp"),
        pack_closure=Path("/tmp"),
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64),
        labels=labels,
    )
    await backend.create(spec)
    job_dir = work / f"{job_id}-1-abcd"
    job_dir.mkdir(parents=True)
    labels = {**labels, LABEL_JOB: job_id, LABEL_ATTEMPT: "1", "pid": "0"}
    write_labels(job_dir, labels)
    return job_dir


async def test_owner_rules_and_a_kept_sandbox_keeps_its_work_dir(
    tmp_path: Path, aredis: aioredis.Redis
) -> None:
    work = tmp_path / "work"
    settings = Settings(redis_url="redis://unused", work_dir=work)
    backend, stuck = FakeBackend(), _StuckBackend()
    await _sandbox_and_dir(backend, work, "gone", _gone_owner())
    await _sandbox_and_dir(backend, work, "live", owner_labels()[LABEL_OWNER])
    await _sandbox_and_dir(backend, work, "elsewhere", "other-boot:1:1:1")
    await _sandbox_and_dir(stuck, work, "stuck", _gone_owner())
    report = await reap_once(aredis, settings, {"fake": backend, "stuck": stuck})
    assert [backend.labels[s][LABEL_JOB] for s in backend.labels] == ["live", "elsewhere"]
    assert len(report.destroyed) == 1
    assert report.failed == ("fake-stuck-1-1",)
    assert report.workspaces == ("gone-1-abcd",)  # the stuck sandbox's directory stays
    assert sorted(p.name for p in work.iterdir()) == [
        "elsewhere-1-abcd",
        "live-1-abcd",
        "stuck-1-abcd",
    ]


def test_owner_labels_survive_only_their_own_process() -> None:
    mine = owner_labels()[LABEL_OWNER]
    boot, namespace, pid, started = mine.split(":")
    assert int(pid) == os.getpid()
    assert owner_state(mine) == "alive"
    assert owner_state(_gone_owner()) == "gone"  # same pid, other start time: reused
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, worker.leases.owner as o; print(json.dumps(o.owner_labels()))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert owner_state(json.loads(child.stdout)[LABEL_OWNER]) == "gone"  # exited and waited for
    assert owner_state(f"another-boot:{namespace}:{pid}:{started}") == "unknown"
    assert owner_state(f"{boot}:1:{pid}:{started}") == "unknown"  # another pid namespace
    assert owner_state(None) == "unknown"
    assert owner_state("garbage") == "unknown"
