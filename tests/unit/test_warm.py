"""Warm pools' pure parts: the launch identity and its credential binding, the in-place
fill of a slot's workspace, ``sandbox.ready``'s warm fields and the settings."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from worker.acp.client import ClientCapabilities
from worker.errors import SandboxError
from worker.events.models import SandboxReady
from worker.job.identity import identity
from worker.job.network import NetworkPlan
from worker.job.slot import Recipe
from worker.launch import LaunchPlan
from worker.sandbox.base import ResourceLimits
from worker.sandbox.hostfill import move_into
from worker.settings import Settings

KEY = b"k" * 32


def _identity(credentials: dict[str, str], *, key: bytes = KEY, **changes: Any) -> str:
    """The identity of a recipe, with ``changes`` to its fields or to the backend's."""
    env = {"HOME": "/home/agent", **credentials}
    backend: dict[str, Any] = {
        "backend": SimpleNamespace(name="local"),
        "backend_config": '{"type":"local"}',
    }
    fields: dict[str, Any] = {
        "pack_name": "cursor-emulator",
        "provider": "cursor",
        "pack": SimpleNamespace(
            closure=Path("/cache/closure"),
            target=SimpleNamespace(pin=SimpleNamespace(closure=SimpleNamespace(digest="d1"))),
        ),
        "network": NetworkPlan(mode="none"),
        "model": None,
        "limits": ResourceLimits(memory_bytes=512 << 20, cpus=1.0, pids=128),
        "disk_mb": 1024,
        "plan": LaunchPlan(argv=("node", "agent.js"), env=env, dialect="cursor"),
        "capabilities": ClientCapabilities(fs=True, terminal=True),
    }
    for name, value in changes.items():
        (backend if name in backend else fields)[name] = value
    return identity(Recipe(**fields), key=key, credentials=credentials, **backend)


def test_the_binding_separates_credentials_and_hides_them() -> None:
    alpha = _identity({"CURSOR_API_KEY": "alpha-secret"})
    assert alpha == _identity({"CURSOR_API_KEY": "alpha-secret"})
    assert alpha != _identity({"CURSOR_API_KEY": "beta-secret"})
    # The binding is keyed per pool process: another key, another identity.
    assert alpha != _identity({"CURSOR_API_KEY": "alpha-secret"}, key=b"x" * 32)
    assert "alpha-secret" not in alpha


@pytest.mark.parametrize(
    "change",
    [
        {"model": "gpt-5"},
        {"disk_mb": 2048},
        {"network": NetworkPlan(mode="allowlist", allow=("api.example.com:443",))},
        {"limits": ResourceLimits(memory_bytes=1 << 30, cpus=1.0, pids=128)},
        {"capabilities": ClientCapabilities(fs=False, terminal=True)},
        {"backend_config": '{"type":"local","bwrap":"/opt/bwrap"}'},
    ],
)
def test_every_part_of_the_launch_is_in_the_identity(change: dict[str, Any]) -> None:
    credentials = {"CURSOR_API_KEY": "alpha-secret"}
    assert _identity(credentials) != _identity(credentials, **change)


def test_a_changed_launch_environment_is_another_identity() -> None:
    credentials = {"CURSOR_API_KEY": "alpha-secret"}
    plan = LaunchPlan(argv=("node", "agent.js"), env={"X": "1", **credentials}, dialect="cursor")
    assert _identity(credentials) != _identity(credentials, plan=plan)
    assert _identity(credentials, plan=plan) != _identity(
        credentials, plan=replace(plan, argv=("node", "other.js"))
    )


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): (p.read_text() if p.is_file() else "/")
        for p in sorted(root.rglob("*"))
    }


def test_the_fill_merges_in_place_and_keeps_mount_points(tmp_path: Path) -> None:
    staged, workspace = tmp_path / "staged", tmp_path / "workspace"
    (staged / ".cursor" / "rules").mkdir(parents=True)
    (staged / ".cursor" / "rules" / "a.mdc").write_text("rule")
    (staged / ".claude").mkdir()
    (staged / ".claude" / "settings.json").write_text("{}")
    (staged / "src").mkdir()
    (staged / "src" / "main.py").write_text("print(1)")
    (workspace / ".cursor").mkdir(parents=True)  # an anchor made at creation
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "settings.json").touch()  # an empty mask mount point
    anchor = os.stat(workspace / ".cursor").st_ino
    point = os.stat(workspace / ".claude" / "settings.json").st_ino
    move_into(staged, workspace)
    assert _tree(workspace) == {
        ".claude": "/",
        ".claude/settings.json": "{}",
        ".cursor": "/",
        ".cursor/rules": "/",
        ".cursor/rules/a.mdc": "rule",
        "src": "/",
        "src/main.py": "print(1)",
    }
    assert os.stat(workspace / ".cursor").st_ino == anchor
    assert os.stat(workspace / ".claude" / "settings.json").st_ino == point


def test_the_fill_never_follows_a_link_in_the_workspace(tmp_path: Path) -> None:
    staged, workspace, outside = tmp_path / "staged", tmp_path / "workspace", tmp_path / "out"
    (staged / "src").mkdir(parents=True)
    (staged / "src" / "main.py").write_text("print(1)")
    workspace.mkdir()
    outside.mkdir()
    (workspace / "src").symlink_to(outside)  # what an agent could leave before its job
    with pytest.raises(SandboxError, match="collides"):
        move_into(staged, workspace)
    assert list(outside.iterdir()) == []


def test_sandbox_ready_says_warm_only_for_a_warm_slot() -> None:
    cold = SandboxReady(backend="local", sandbox_id="s1")
    assert cold.wire() == {"backend": "local", "sandbox_id": "s1"}
    warm = SandboxReady(backend="local", sandbox_id="s1", warm=True, claim_ms=1.5)
    assert warm.wire() == {"backend": "local", "sandbox_id": "s1", "warm": True, "claim_ms": 1.5}


def test_warm_pool_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().warm_pools == {}
    monkeypatch.setenv("ACPW_WARM_POOLS", '{"cursor": 2, "codex": 0}')
    monkeypatch.setenv("ACPW_WARM_MAX_IDLE_S", "30")
    settings = Settings()
    assert (settings.warm_pools, settings.warm_max_idle_s) == ({"cursor": 2}, 30.0)
    with pytest.raises(ValidationError):
        Settings(warm_pools={"cursor": 17})
    with pytest.raises(ValidationError):
        Settings(warm_pools={"cursor": -1})


def test_the_process_loop_is_one_thread_that_watches_its_children() -> None:
    """Every delivery of a pool process runs on one long-lived loop in a daemon thread
    (``tasks.process_loop``); asyncio's child watcher there sees a subprocess end."""
    import asyncio

    import tasks

    async def spawn() -> tuple[int, bool]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
        code = await asyncio.wait_for(proc.wait(), 10)
        return code, threading.current_thread() is threading.main_thread()

    loop = tasks.process_loop()
    assert tasks.process_loop() is loop
    code, on_main = asyncio.run_coroutine_threadsafe(spawn(), loop).result(timeout=20)
    assert (code, on_main) == (3, False)


def test_the_soft_time_limit_still_stops_a_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery raises ``SoftTimeLimitExceeded`` from its signal handler in the main thread,
    which waits on the delivery running on the process loop: the task returns
    ``time_limit`` and the delivery is cancelled on its loop (its teardown runs there)."""
    import asyncio
    import signal

    from celery.exceptions import SoftTimeLimitExceeded

    import tasks

    cancelled = threading.Event()

    async def forever(delivery: object, on_settled: object = None) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def soft_limit(*_: object) -> None:
        raise SoftTimeLimitExceeded

    monkeypatch.setattr(tasks, "_deliver", forever)
    previous = signal.signal(signal.SIGUSR1, soft_limit)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        assert tasks.run_job({"job_id": "j"}) == {"outcome": "time_limit"}
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert cancelled.wait(5)


def test_the_task_returns_once_its_job_settled_and_its_tail_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tasks.run_job`` returns what ``run_delivery`` told ``settled`` while the
    delivery's tail (leftovers, the lease) still runs on the process loop; the process
    waits for that tail on its way out (``_finish_tails``)."""
    import asyncio
    from collections.abc import Callable

    import tasks
    from worker.service.guarded import GuardedResult

    tail_may_end = threading.Event()
    tail_ended = threading.Event()
    result = GuardedResult("j", "ran", 1, "succeeded")

    async def settles_then_tails(
        delivery: object, on_settled: Callable[[GuardedResult], None] | None = None
    ) -> GuardedResult:
        assert on_settled is not None
        on_settled(result)
        while not tail_may_end.is_set():
            await asyncio.sleep(0.01)
        tail_ended.set()
        return result

    monkeypatch.setattr(tasks, "_deliver", settles_then_tails)
    assert tasks.run_job({"job_id": "j"}) == result.to_dict()
    assert not tail_ended.is_set()
    assert tasks._tails  # the delivery still ends on the loop
    tail_may_end.set()
    waiting = asyncio.run_coroutine_threadsafe(tasks._finish_tails(), tasks.process_loop())
    waiting.result(timeout=5)
    assert tail_ended.is_set()
    assert not tasks._tails
