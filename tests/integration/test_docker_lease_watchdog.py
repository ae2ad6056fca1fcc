"""A leased docker sandbox is bounded by its lease without the worker process (issue #13,
item 10): a watchdog on the engine's host kills the container's processes (through its
cgroups) once the lease deadline passes unrenewed, even while the worker's whole process
group is frozen. A real container engine (Podman's Docker API), real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_containment import _host_pids_with, _tree_script
from tests.integration.test_docker_backend import ENV, _spec
from tests.integration.test_lease_watchdog import freeze_mid_turn, heartbeat
from worker.errors import SandboxError
from worker.images.engine import EngineConfig, connect
from worker.sandbox.base import LeaseDeadline, Sandbox
from worker.sandbox.config import DockerConfig
from worker.sandbox.docker import DockerBackend, DockerSandbox
from worker.sandbox.docker.containers import LABEL_SANDBOX

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_image")]


def _backend(engine_config: EngineConfig, lease_dir: Path) -> DockerBackend:
    return DockerBackend(
        DockerConfig(worker_id="w-1"), engine_config=engine_config, lease_dir=lease_dir
    )


def _watchdogs_of(backend: DockerBackend, sandbox_id: str) -> list[int]:
    """Host pids whose command line names the sandbox's deadline file: its watchdogs."""
    return _host_pids_with(str(backend.watchdogs.deadline_file(sandbox_id)))


async def _until(check: Any, seconds: float) -> Any:
    """``check()`` once it is falsy, else its last value after ``seconds``."""
    left = check()
    deadline = time.monotonic() + seconds
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        left = check()
    return left


def _running(engine_config: EngineConfig, sandbox_id: str) -> list[str]:
    """The ids of the sandbox's containers that the engine says are running."""
    api: Any = connect(engine_config).api
    found = api.containers(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})
    return [c["Id"] for c in found if c.get("State") == "running"]


async def _sleeper(box: Sandbox) -> None:
    """A process that sleeps in a new container of ``box``, once it runs."""
    proc = await box.spawn(["/bin/sh", "-c", "echo ready; exec sleep 600"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"


async def test_a_container_whose_lease_is_not_renewed_is_killed(
    engine_config: EngineConfig, tmp_path: Path
) -> None:
    backend = _backend(engine_config, tmp_path / "leases")
    deadline = LeaseDeadline(time.monotonic() + 4.0)
    box = await backend.create(_spec(tmp_path, lease_deadline=deadline))
    try:
        marker = f"marker-{uuid.uuid4().hex}"
        async with heartbeat(deadline):  # renewed until the tree runs, then never again
            proc = await box.spawn(_tree_script(marker), env=ENV)
            assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
            assert await _until(lambda: len(_host_pids_with(marker)) < 3, 10) is False
            assert len(_watchdogs_of(backend, box.sandbox_id)) == 1
        assert await _until(lambda: _host_pids_with(marker), 20) == []  # no renewal: killed
        assert await asyncio.wait_for(proc.wait(), 20) != 0
        assert await _until(lambda: _running(engine_config, box.sandbox_id), 20) == []
        assert await _until(lambda: _watchdogs_of(backend, box.sandbox_id), 10) == []
    finally:
        await backend.destroy(box.sandbox_id)


async def test_a_renewed_lease_keeps_every_container_alive_and_destroy_ends_the_watchdogs(
    engine_config: EngineConfig, tmp_path: Path
) -> None:
    backend = _backend(engine_config, tmp_path / "leases")
    first = time.monotonic() + 4.0
    deadline = LeaseDeadline(first)
    box = await backend.create(_spec(tmp_path, lease_deadline=deadline))
    assert isinstance(box, DockerSandbox)
    markers = [f"marker-{uuid.uuid4().hex}" for _ in range(2)]
    try:
        async with heartbeat(deadline):  # renewed as the lease heartbeat does
            procs = [await box.spawn(_tree_script(m), env=ENV) for m in markers]
            for proc in procs:
                assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
            assert len(_watchdogs_of(backend, box.sandbox_id)) == 2  # one per container
            while time.monotonic() < first + 2.5:  # well past the first deadline
                await asyncio.sleep(0.1)
        assert all(_host_pids_with(m) for m in markers)
        assert all(p.returncode is None for p in procs)
    finally:
        await backend.destroy(box.sandbox_id)
    assert _watchdogs_of(backend, box.sandbox_id) == []  # destroy reaped its own
    assert all(_host_pids_with(m) == [] for m in markers)


async def test_a_destroy_from_another_process_ends_the_watchdog(
    engine_config: EngineConfig, tmp_path: Path
) -> None:
    backend = _backend(engine_config, tmp_path / "leases")
    box = await backend.create(_spec(tmp_path, lease_deadline=LeaseDeadline(time.monotonic() + 60)))
    try:
        await _sleeper(box)
        assert len(_watchdogs_of(backend, box.sandbox_id)) == 1
        reaper = _backend(engine_config, tmp_path / "leases")  # shares the lease dir only
        await reaper.destroy(box.sandbox_id)
        assert await _until(lambda: _watchdogs_of(backend, box.sandbox_id), 10) == []
    finally:
        await backend.destroy(box.sandbox_id)


async def test_a_sandbox_without_a_lease_has_no_watchdog(
    engine_config: EngineConfig, tmp_path: Path
) -> None:
    backend = _backend(engine_config, tmp_path / "leases")
    box = await backend.create(_spec(tmp_path))
    try:
        await _sleeper(box)
        assert _watchdogs_of(backend, box.sandbox_id) == []
    finally:
        await backend.destroy(box.sandbox_id)


async def test_a_container_whose_cgroups_are_not_visible_is_refused_not_left_unbounded(
    engine_config: EngineConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine on another host (or one without a cgroup per container): the spawn fails
    with a clear error rather than run a container no watchdog bounds."""
    from worker.sandbox import cgroups

    monkeypatch.setattr(cgroups, "of_process", lambda _pid: ())
    backend = _backend(engine_config, tmp_path / "leases")
    box = await backend.create(_spec(tmp_path, lease_deadline=LeaseDeadline(time.monotonic() + 60)))
    try:
        with pytest.raises(SandboxError, match="cgroups are not visible"):
            await box.spawn(["/bin/sh", "-c", "echo ready; exec sleep 600"], env=ENV)
    finally:
        await backend.destroy(box.sandbox_id)
    assert _running(engine_config, box.sandbox_id) == []


def test_a_frozen_workers_container_dies_with_its_lease(
    tmp_path: Path, redis_url: str, engine_config: EngineConfig
) -> None:
    """SIGSTOP the worker's whole process group mid-turn (`run --redis` on the docker
    backend): its container stops within a few seconds of the lease TTL while the worker
    is still stopped."""
    frozen = freeze_mid_turn(
        tmp_path,
        redis_url,
        lambda sandbox_id: _running(engine_config, sandbox_id),
        ACPW_BACKEND="docker",
        ACPW_DOCKER_HOST=str(engine_config.docker_host),
        ACPW_IMAGES_DIR=str(engine_config.images_dir),
    )
    assert frozen.left == [], "the container outlived its lease"
    assert frozen.stayed_stopped  # the worker had no part in it
    assert frozen.returncode != 0, frozen.stderr  # its lease is gone: it could not settle
    assert _running(engine_config, frozen.sandbox_id) == []
