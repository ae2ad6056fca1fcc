"""A leased sandbox is bounded by its lease without the worker process (issue #13, item
10): its watchdog kills it once the lease deadline passes unrenewed, even while the
worker's whole process group is frozen. Real bubblewrap, real cgroups, real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.test_containment import (
    ENV,
    _backend,
    _host_pids_with,
    _spec,
    _tree_script,
    _until_gone,
)
from tests.integration.test_run_job import REPO, _env, _job
from tests.procs import finish
from worker.sandbox.base import LeaseDeadline
from worker.sandbox.local import LocalBackend

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def etc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("etc") / "etc"


@pytest.fixture
def backend(tmp_path: Path, etc_dir: Path) -> LocalBackend:
    return _backend(tmp_path, etc_dir)


def _watchdogs_of(cgroup: Path) -> list[int]:
    """Host pids whose command line names ``cgroup``: its watchdog, nothing else does."""
    return _host_pids_with(str(cgroup))


@contextlib.asynccontextmanager
async def heartbeat(deadline: LeaseDeadline, ahead: float = 3.0) -> AsyncIterator[None]:
    """Renews ``deadline`` to ``ahead`` seconds from now every 0.1 s while the block runs,
    as the lease heartbeat does: containers started under a loaded machine's slow spawns
    are not cut by the initial deadline before the test's own clock starts."""

    async def renew() -> None:
        while True:
            deadline.extend(time.monotonic() + ahead)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(renew())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- the backend --------------------------------------------------------------------------


async def test_a_sandbox_whose_lease_is_not_renewed_is_killed(
    backend: LocalBackend, tmp_path: Path
) -> None:
    deadline = LeaseDeadline(time.monotonic() + 1.0)
    box = await backend.create(_spec(tmp_path, lease_deadline=deadline))
    try:
        marker = f"marker-{uuid.uuid4().hex}"
        async with heartbeat(deadline):  # renewed until the tree runs, then never
            proc = await box.spawn(_tree_script(marker), env=ENV)
            assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"
            assert len(_host_pids_with(marker)) >= 3
        assert await _until_gone(marker, seconds=20) == []  # no renewal: killed
        assert await asyncio.wait_for(proc.wait(), 10) != 0
        status = await backend.status(box.sandbox_id)
        assert status is not None
        assert status.pids == frozenset()
        assert await _until_watchdog_gone(box.cgroups.paths[0]) == []  # its work is done
    finally:
        await backend.destroy(box.sandbox_id)


async def test_a_renewed_lease_keeps_the_sandbox_alive_past_its_first_deadline(
    backend: LocalBackend, tmp_path: Path
) -> None:
    first = time.monotonic() + 1.0
    deadline = LeaseDeadline(first)
    box = await backend.create(_spec(tmp_path, lease_deadline=deadline))
    try:
        marker = f"marker-{uuid.uuid4().hex}"
        async with heartbeat(deadline):  # renewed as the lease heartbeat does
            proc = await box.spawn(_tree_script(marker), env=ENV)
            assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"
            assert len(_watchdogs_of(box.cgroups.paths[0])) == 1
            while time.monotonic() < first + 2.0:  # well past the first deadline
                await asyncio.sleep(0.1)
        assert len(_host_pids_with(marker)) >= 3
        assert proc.returncode is None
    finally:
        await backend.destroy(box.sandbox_id)
    assert _host_pids_with(marker) == []
    assert await _until_watchdog_gone(box.cgroups.paths[0]) == []  # destroy stopped it


async def test_a_destroy_from_another_process_ends_the_watchdog(
    backend: LocalBackend, tmp_path: Path, etc_dir: Path
) -> None:
    box = await backend.create(_spec(tmp_path, lease_deadline=LeaseDeadline(time.monotonic() + 60)))
    try:
        assert len(_watchdogs_of(box.cgroups.paths[0])) == 1
        reaper = _backend(tmp_path, etc_dir)  # shares only the state dir, as a reaper does
        await reaper.destroy(box.sandbox_id)
        assert await _until_watchdog_gone(box.cgroups.paths[0]) == []  # long before 60 s
    finally:
        await backend.destroy(box.sandbox_id)


async def test_a_sandbox_without_a_lease_has_no_watchdog(
    backend: LocalBackend, tmp_path: Path
) -> None:
    box = await backend.create(_spec(tmp_path))
    try:
        assert _watchdogs_of(box.cgroups.paths[0]) == []
    finally:
        await backend.destroy(box.sandbox_id)


async def _until_watchdog_gone(cgroup: Path, seconds: float = 10.0) -> list[int]:
    for _ in range(int(seconds / 0.05)):
        left = _watchdogs_of(cgroup)
        if not left:
            return []
        await asyncio.sleep(0.05)
    return _watchdogs_of(cgroup)


# --- a frozen worker ----------------------------------------------------------------------


def _sandbox_pids(sandbox_id: str) -> set[int]:
    """Host pids in a cgroup of ``sandbox_id``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cgroup = (entry / "cgroup").read_text()
            except OSError:
                continue
            if f"/{sandbox_id}\n" in cgroup or f"/{sandbox_id}/" in cgroup:
                found.add(int(entry.name))
    return found


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


@dataclass(frozen=True, slots=True)
class Frozen:
    """What ``freeze_mid_turn`` saw: the sandbox, what of it outlived the lease while the
    worker was stopped, whether the worker was still stopped then, its exit status and
    stderr once resumed."""

    sandbox_id: str
    left: Collection[object]
    stayed_stopped: bool
    returncode: int
    stderr: str


def freeze_mid_turn(
    tmp_path: Path,
    redis_url: str,
    running: Callable[[str], Collection[object]],
    *,
    ttl: float = 2.0,
    **env: str,
) -> Frozen:
    """`run --redis` a hanging job, SIGSTOP the worker's whole process group once the
    agent speaks, and wait (at most the lease TTL + 15 s) until ``running(sandbox_id)``
    is empty; then let the worker go on and finish."""
    job = _job(tmp_path, "#!scenario\nsay hang-marker\nhang\n")
    full_env = _env(tmp_path, ACPW_LEASE_TTL=str(ttl), ACPW_LEASE_RENEW="0.3", **env)
    argv = [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"]
    proc = subprocess.Popen(
        [*argv, "--redis", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=REPO,
        start_new_session=True,  # its own group, as a service's would be
    )
    assert proc.stdout is not None
    sandbox_id = ""
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event["type"] == "sandbox.ready":
                sandbox_id = event["data"]["sandbox_id"]
            if "hang-marker" in line:
                break
        assert sandbox_id
        assert running(sandbox_id)  # the agent runs
        os.killpg(proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        left = running(sandbox_id)
        while left and time.monotonic() < stopped_at + ttl + 15:
            time.sleep(0.1)
            left = running(sandbox_id)
        stayed_stopped = _stopped(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
    _, stderr = finish(proc, 60)
    return Frozen(sandbox_id, left, stayed_stopped, proc.returncode, stderr)


def test_a_frozen_workers_sandbox_dies_with_its_lease(tmp_path: Path, redis_url: str) -> None:
    """SIGSTOP the worker's whole process group mid-turn: its sandbox is gone within a
    few seconds of the lease TTL while the worker is still stopped."""
    frozen = freeze_mid_turn(tmp_path, redis_url, _sandbox_pids)
    assert frozen.left == set(), "the sandbox outlived its lease"
    assert frozen.stayed_stopped  # the worker had no part in it
    assert frozen.returncode != 0  # its lease is gone: it could not settle the job
    assert list((tmp_path / "work").iterdir()) == []  # and it cleaned up after itself
