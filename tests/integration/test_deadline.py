"""``limits.timeout_s`` bounds the whole job, not only the turn: real Redis-free runs in
process with real bubblewrap (the local backend) and the Cursor emulator pack.

A deadline that passes during preparation stops the job at the next phase boundary, and
an agent that never answers while the session opens is cut at the deadline; both settle
``timed_out`` and leave nothing behind. So does a sink that fails during teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cancel import _job, _left_behind, _notices, _settings, _types
from worker.errors import EXIT_CANCELLED, EXIT_TIMED_OUT, SinkUnavailable
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend, LocalProcess, LocalSandbox

pytestmark = pytest.mark.integration

PREPARATION = {"credentials", "pack_verify", "workspace", "sandbox_create", "agent_spawn"}


class _SilentAgent(LocalSandbox):
    """The real sandbox, but the agent it launches is a process that never answers."""

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], **kw: Any
    ) -> LocalProcess:
        return await super().spawn(["/bin/sleep", "600"], env=env, **kw)


class _SilentBackend(LocalBackend):
    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        box = await super().create(spec)
        box.__class__ = _SilentAgent
        return box


def _run(tmp_path: Path, timeout_s: float, backend: type[LocalBackend]) -> tuple[Any, list[Any]]:
    job = _job(tmp_path)
    job["limits"]["timeout_s"] = timeout_s
    spec = parse_job(job)
    settings = _settings(tmp_path)
    memory = MemorySink()
    outcome = asyncio.run(
        run_job(
            spec,
            settings=settings,
            backend=backend(LocalConfig.from_settings(settings)),
            sinks=[memory],
            environ={},
            cancel=asyncio.Event(),
        )
    )
    return outcome, [dict(e) for e in memory.events]


def test_a_deadline_passed_in_preparation_stops_before_the_launch(tmp_path: Path) -> None:
    outcome, events = _run(tmp_path, 0.001, LocalBackend)
    assert (outcome.status, outcome.exit_code) == ("timed_out", EXIT_TIMED_OUT)
    assert "agent.initialized" not in _types(events)
    [notice] = _notices(events, "timed_out_before_launch")
    assert notice["details"]["next_phase"] in PREPARATION
    done = events[-1]["data"]
    assert (done["status"], done["error"]) == ("timed_out", None)
    assert _left_behind(tmp_path, events[0]["job_id"]) == {"sandboxes": [], "work": [], "held": []}


def test_an_agent_silent_while_the_session_opens_is_cut_at_the_deadline(tmp_path: Path) -> None:
    # 3 s is ample for preparation here and far below the 60 s ACP request timeout.
    outcome, events = _run(tmp_path, 3, _SilentBackend)
    assert (outcome.status, outcome.exit_code) == ("timed_out", EXIT_TIMED_OUT)
    assert _notices(events, "timed_out_before_launch") == []
    assert "agent.initialized" not in _types(events)
    timings = events[-1]["data"]["timings_ms"]
    assert "agent_spawn" in timings
    # initialize was reached and waited on until the deadline: its time is its own.
    assert list(timings)[-3:] == ["initialize", "teardown", "capture"]
    assert _left_behind(tmp_path, events[0]["job_id"]) == {"sandboxes": [], "work": [], "held": []}


class _FailsOn:
    """A sink that fails like an unreachable stream, at the first event of one type."""

    def __init__(self, type_: str) -> None:
        self.type_ = type_

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        if event["type"] == self.type_:
            raise SinkUnavailable("the stream went away", key="test")

    async def close(self) -> None:
        return None


def test_a_sink_failing_in_teardown_still_leaves_nothing_behind(tmp_path: Path) -> None:
    spec = parse_job(_job(tmp_path, "#!scenario\nwrite new.txt hello\n"))
    settings = _settings(tmp_path)
    memory = MemorySink()
    with pytest.raises(SinkUnavailable):
        asyncio.run(
            run_job(
                spec,
                settings=settings,
                backend=LocalBackend(LocalConfig.from_settings(settings)),
                sinks=[memory, _FailsOn("workspace.changed")],
                environ={},
                cancel=asyncio.Event(),
            )
        )
    types = _types([dict(e) for e in memory.events])
    assert "workspace.changed" in types  # the other sink got it
    assert types.count("job.completed") == 1
    assert _left_behind(tmp_path, spec.job_id) == {"sandboxes": [], "work": [], "held": []}


def test_a_cancel_while_the_session_opens_is_not_kept_waiting(tmp_path: Path) -> None:
    job = _job(tmp_path)
    job["limits"]["timeout_s"] = 30  # far beyond the cancel below
    spec = parse_job(job)
    settings = _settings(tmp_path)
    memory = MemorySink()

    async def run() -> Any:
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(2.0, cancel.set)  # initialize is unanswered
        return await run_job(
            spec,
            settings=settings,
            backend=_SilentBackend(LocalConfig.from_settings(settings)),
            sinks=[memory],
            environ={},
            cancel=cancel,
        )

    outcome = asyncio.run(run())
    events = [dict(e) for e in memory.events]
    assert (outcome.status, outcome.exit_code) == ("cancelled", EXIT_CANCELLED)
    assert "agent.initialized" not in _types(events)
    assert "agent_spawn" in events[-1]["data"]["timings_ms"]
    assert _left_behind(tmp_path, events[0]["job_id"]) == {"sandboxes": [], "work": [], "held": []}
