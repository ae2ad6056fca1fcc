"""The reaper and what ``acp-worker run`` makes: a job without a lease (token ``0``) is
reaped once its process is gone — sandbox, cgroups, staging namespace, loop device and
work directory — and never while the process lives. The same owner label decides for
served jobs of another deployment (another ``acpw.store``): a live owner keeps its
sandbox whatever this Redis's tokens say; a gone owner loses it even when this Redis never
heard of its job; a job of this Redis whose lease is gone is over however alive its
owner. Real bubblewrap, real Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.integration.test_workspace_disk import _loops_under
from tests.procs import finish
from tests.sandbox_owner import chown_to_sandbox
from worker.errors import SandboxError
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_TOKEN, ResourceLimits, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import DEFAULT_STAGE_DIR, LocalBackend, SandboxRecord
from worker.service.reaper import reap_once, reap_pass
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.owner import (
    LABEL_OWNER,
    LABEL_STORE,
    owner_label,
    owner_labels,
    owner_state,
    store_label,
)
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
    backend = LocalBackend(
        LocalConfig.from_settings(_settings(tmp_path, redis_url))
    )  # the host's sandbox records
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
    status = asyncio.run(
        LocalBackend(LocalConfig.from_settings(settings)).status(record.sandbox_id)
    )
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
            "import json, worker.store.owner as o; print(json.dumps(o.owner_labels()))",
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


# --- the owner decides, whatever the tokens say: the real local backend ------------------


class _Host:
    """Sandboxes made by a local backend with its own record store, as another worker
    (another deployment, perhaps) on this host would leave them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.settings = Settings(
            redis_url="redis://unused",
            work_dir=tmp_path / "work",
            results_dir=tmp_path / "results",
        )
        self.backend = LocalBackend(
            LocalConfig(cgroup_parent="acpw-test"),
            state_dir=tmp_path / "state",
            etc_dir=tmp_path / "etc",
        )
        (tmp_path / "ws").mkdir()
        chown_to_sandbox(tmp_path / "ws", self.backend.config)
        (tmp_path / "pack").mkdir()

    async def sandbox(
        self, job_id: str, token: int, owner: str, store: str | None = None
    ) -> tuple[str, Path]:
        """A sandbox running ``sleep`` and its labelled work directory (as the runner
        makes them, ``store`` naming the Redis of its lease); their ids."""
        labels = {LABEL_TOKEN: str(token), LABEL_OWNER: owner}
        if store is not None:
            labels[LABEL_STORE] = store
        spec = SandboxSpec(
            job_id=job_id,
            attempt=1,
            workspace=self.tmp_path / "ws",
            pack_closure=self.tmp_path / "pack",
            limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64),
            labels=labels,
        )
        box = await self.backend.create(spec)
        await box.spawn(["sleep", "300"], env={"PATH": "/usr/bin:/bin"}, cwd="/")
        job_dir = self.settings.work_dir / f"{job_id}-1-abcd"
        job_dir.mkdir(parents=True)
        write_labels(job_dir, {**labels, LABEL_JOB: job_id, LABEL_ATTEMPT: "1"})
        return box.sandbox_id, job_dir

    async def running(self, sandbox_id: str) -> bool:
        status = await self.backend.status(sandbox_id)
        return status is not None and status.running

    async def clean(self) -> None:
        for info in await self.backend.list({}):
            await self.backend.destroy(info.sandbox_id)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[_Host]:
    made = _Host(tmp_path)
    try:
        yield made
    finally:
        await made.clean()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _label_of(proc: subprocess.Popen[bytes]) -> str:
    label = owner_label(proc.pid)
    assert label is not None
    assert owner_state(label) == "alive"
    return label


async def _settled(client: aioredis.Redis, job_id: str) -> int:
    """Run ``job_id`` to ``succeeded`` in this Redis; the token it ran under."""
    lease = await leases.acquire(client, job_id, worker_id="here", ttl=30)
    assert isinstance(lease, leases.Lease)
    sink = FencedStreamSink(client, lease, policy=SinkPolicy())
    emitter = EventEmitter(job_id=job_id, attempt=lease.attempt, sinks=[sink])
    await emitter.emit(
        job_completed(status="succeeded", stop_reason="end_turn", error=None, duration_ms=1.0)
    )
    await emitter.close()
    assert await leases.release(client, lease)
    assert await client.hget(keys.state(job_id), "status") == b"succeeded"
    return lease.token


async def test_a_live_owner_keeps_its_sandbox_whatever_this_redis_says(
    host: _Host, aredis: aioredis.Redis, sleeper: subprocess.Popen[bytes]
) -> None:
    # Another deployment runs `job_id` too: here it settled long ago, under the same
    # token its live sandbox carries. The tokens alone would call that sandbox over.
    job_id = f"hello-{uuid.uuid4().hex[:8]}"
    token = await _settled(aredis, job_id)
    elsewhere = store_label("redis://10.9.8.7:6379/3")
    sandbox_id, job_dir = await host.sandbox(job_id, token, _label_of(sleeper), elsewhere)
    kept = await reap_once(aredis, host.settings, {"local": host.backend})
    assert (kept.lost, kept.destroyed, kept.failed, kept.workspaces) == ((), (), (), ())
    assert await host.running(sandbox_id)
    assert job_dir.is_dir()

    sleeper.kill()  # its owner is gone: now it is over
    sleeper.wait()
    reaped = await reap_once(aredis, host.settings, {"local": host.backend})
    assert reaped.destroyed == (sandbox_id,)
    assert reaped.workspaces == (job_dir.name,)
    assert reaped.lost == ()  # it had settled: nothing more is written
    assert await host.backend.list({}) == []
    assert not job_dir.exists()


async def test_this_redis_reaps_its_own_job_whose_lease_is_gone_however_alive_its_owner(
    host: _Host, aredis: aioredis.Redis, sleeper: subprocess.Popen[bytes]
) -> None:
    # A worker process that lives on (a pool process) but leaked a sandbox of a job that
    # settled: this Redis issued the token, so its lease decides.
    job_id = f"leak-{uuid.uuid4().hex[:8]}"
    token = await _settled(aredis, job_id)
    mine = store_label(host.settings.redis_url)
    sandbox_id, job_dir = await host.sandbox(job_id, token, _label_of(sleeper), mine)
    reaped = await reap_once(aredis, host.settings, {"local": host.backend})
    assert reaped.destroyed == (sandbox_id,)
    assert reaped.workspaces == (job_dir.name,)
    assert await host.backend.list({}) == []


async def test_a_gone_owner_is_reaped_even_when_this_redis_never_knew_its_job(
    host: _Host, aredis: aioredis.Redis, sleeper: subprocess.Popen[bytes]
) -> None:
    owner = _label_of(sleeper)
    sleeper.kill()
    sleeper.wait()
    assert owner_state(owner) == "gone"
    unknown = f"flushed-{uuid.uuid4().hex[:8]}"  # a token, but no state here (flushed)
    orphan, orphan_dir = await host.sandbox(unknown, 7, owner)
    # A served job whose worker died while its lease lives: the sandbox goes now, but
    # the job is settled `lost` only once its lease has expired.
    leased = f"leased-{uuid.uuid4().hex[:8]}"
    lease = await leases.acquire(aredis, leased, worker_id="dead", ttl=30)
    assert isinstance(lease, leases.Lease)
    served, served_dir = await host.sandbox(leased, lease.token, owner)
    report = await reap_once(aredis, host.settings, {"local": host.backend})
    assert sorted(report.destroyed) == sorted([orphan, served])
    assert sorted(report.workspaces) == sorted([orphan_dir.name, served_dir.name])
    assert report.lost == ()
    assert await host.backend.list({}) == []
    assert await aredis.hget(keys.state(leased), "status") == b"running"
    assert await aredis.exists(keys.state(unknown)) == 0  # nothing written for it

    await aredis.delete(keys.lease(leased))  # the lease expires
    await aredis.zadd(keys.LEASES, {leased: 0})
    expired = await reap_once(aredis, host.settings, {"local": host.backend})
    assert expired.lost == (leased,)
    assert await aredis.hget(keys.state(leased), "status") == b"lost"


async def test_a_pass_reaps_sessions_idle_past_their_keep(
    tmp_path: Path, aredis: aioredis.Redis
) -> None:
    sessions = tmp_path / "sessions"
    idle, used = sessions / "cursor" / "idle-session", sessions / "cursor" / "used-session"
    for session in (idle, used):
        session.mkdir(parents=True)
        (session / "history.json").write_text("{}")
    then = time.time() - 3 * 3600
    os.utime(idle, (then, then))
    settings = Settings(
        redis_url="redis://unused",
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        session_dir=sessions,
        session_keep_s=3600,
    )
    report = await reap_once(aredis, settings, {})
    assert report.sessions == ("cursor/idle-session",)
    assert report.to_dict()["sessions"] == ["cursor/idle-session"]
    assert [p.name for p in (sessions / "cursor").iterdir()] == ["used-session"]
