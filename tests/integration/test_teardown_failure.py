"""A teardown that fails still settles the job: real Redis-free runs in process with real
bubblewrap (the local backend) and the Cursor emulator pack.

When the sandbox cannot be destroyed the job still gets exactly one ``job.completed``
(``failed`` with that error if its turn had succeeded; its own status otherwise, the
teardown error beside it), and what could still be written to is left for the reaper:
no capture, the job's directory kept. Each test destroys the real sandbox afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import worker.workspace.prepare
from tests.integration.test_cancel import _job, _left_behind, _notices, _settings, _types
from tests.integration.test_deadline import _SilentAgent
from worker.errors import EXIT_FAILED, EXIT_TIMED_OUT, SandboxError
from worker.events.sinks import MemorySink
from worker.job import JobOutcome, run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import LABEL_JOB, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend, LocalSandbox
from worker.workspace.stage import remove_staged

pytestmark = pytest.mark.integration


class _Undestroyable(LocalBackend):
    """The real backend, whose quiesce and destroy fail the way a process that does not
    die does."""

    async def quiesce(self, sandbox_id: str) -> None:
        raise SandboxError("sandbox processes survived destroy", sandbox_id=sandbox_id)

    async def destroy(self, sandbox_id: str) -> None:
        raise SandboxError("sandbox processes survived destroy", sandbox_id=sandbox_id)


class _UndestroyableSilent(_Undestroyable):
    """Also launches an agent that never answers; its destroy fails with a bug."""

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        box = await super().create(spec)
        box.__class__ = _SilentAgent
        return box

    async def quiesce(self, sandbox_id: str) -> None:
        raise RuntimeError("a bug quoting the agent: s3cr3t")

    async def destroy(self, sandbox_id: str) -> None:
        raise RuntimeError("a bug quoting the agent: s3cr3t")


@pytest.fixture
def cleanup(tmp_path: Path) -> Iterator[list[str]]:
    """Destroy what the failed teardown of the job ids appended left, as the reaper would:
    the sandbox (this host's sandboxes share one state directory: by label), then the
    work directory."""
    job_ids: list[str] = []
    yield job_ids
    backend = LocalBackend(LocalConfig.from_settings(_settings(tmp_path)))
    for job_id in job_ids:
        for info in asyncio.run(backend.list({LABEL_JOB: job_id})):
            asyncio.run(backend.destroy(info.sandbox_id))
    work = tmp_path / "work"
    for path in work.iterdir() if work.exists() else []:
        remove_staged(path)
    for job_id in job_ids:
        assert _left_behind(tmp_path, job_id) == {"sandboxes": [], "work": [], "held": []}


def _run(
    tmp_path: Path,
    backend: type[LocalBackend],
    cleanup: list[str],
    *,
    prompt: str,
    timeout_s: float = 60,
) -> tuple[JobOutcome, list[dict[str, Any]]]:
    job = _job(tmp_path, prompt)
    cleanup.append(job["job_id"])
    job["limits"]["timeout_s"] = timeout_s
    settings = _settings(tmp_path)
    memory = MemorySink()
    outcome = asyncio.run(
        run_job(
            parse_job(job),
            settings=settings,
            backend=backend(LocalConfig.from_settings(settings)),
            sinks=[memory],
            environ={},
            cancel=asyncio.Event(),
        )
    )
    return outcome, [dict(e) for e in memory.events]


def test_a_sandbox_that_survives_destroy_fails_a_succeeded_job(
    tmp_path: Path, cleanup: list[str]
) -> None:
    prompt = "#!scenario\nwrite new.txt hi\n"
    outcome, events = _run(tmp_path, _Undestroyable, cleanup, prompt=prompt)
    job_id = events[0]["job_id"]
    assert _types(events).count("job.completed") == 1
    done = events[-1]
    assert done["type"] == "job.completed"
    assert (outcome.status, outcome.exit_code) == ("failed", EXIT_FAILED)
    data = done["data"]
    assert (data["status"], data["stop_reason"]) == ("failed", "end_turn")
    assert data["error"]["code"] == "sandbox_failed"
    assert data["error"]["message"] == "sandbox processes survived destroy"
    assert data["teardown_error"] == data["error"]
    assert "teardown" in data["timings_ms"]
    [notice] = _notices(events, "sandbox_not_destroyed")
    sandbox_id = notice["details"]["sandbox_id"]
    assert "usage.reported" in _types(events)
    # The sandbox may still write to the workspace: nothing captured, nothing removed.
    assert "workspace.changed" not in _types(events)
    left = _left_behind(tmp_path, job_id)
    assert [s.sandbox_id for s in left["sandboxes"]] == [sandbox_id]
    assert left["work"] != []
    assert left["held"] == []  # the pack closure's lock is released all the same


def test_a_timed_out_job_keeps_its_status_and_reports_the_teardown_error(
    tmp_path: Path, cleanup: list[str]
) -> None:
    outcome, events = _run(
        tmp_path, _UndestroyableSilent, cleanup, prompt="scenario: hello", timeout_s=3
    )
    assert _types(events).count("job.completed") == 1
    assert (outcome.status, outcome.exit_code) == ("timed_out", EXIT_TIMED_OUT)
    data = events[-1]["data"]
    assert (data["status"], data["error"]) == ("timed_out", None)
    error = data["teardown_error"]
    assert error["code"] == "sandbox_failed"
    assert error["details"] == {"step": "sandbox_destroy"}
    assert "RuntimeError" in error["message"]
    assert "s3cr3t" not in repr(events)  # an unexpected exception's text is not quoted
    assert len(_notices(events, "sandbox_not_destroyed")) == 1


def test_a_work_dir_another_remover_takes_during_the_teardown_is_removed_without_error(
    tmp_path: Path,
    cleanup: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reaper removes the job's work directory while the teardown's own removal walks
    it (a host that resumes after its attempt was settled ``lost``): right after the
    teardown's first unlink there, the reaper's removal (``remove_staged``, as
    ``worker.service.reaper`` calls it) takes the whole directory. Someone else's removal
    is success: no error logged, no ``teardown_error``, nothing left."""
    work = tmp_path / "work"
    real_unlink = os.unlink
    removing: list[Path] = []

    def teardown_removal(path: Path) -> None:  # the teardown's removal of the job dir
        removing.append(path)
        remove_staged(path)

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        real_unlink(path, dir_fd=dir_fd)
        if removing and dir_fd is not None:
            monkeypatch.setattr(os, "unlink", real_unlink)  # once: the reaper's turn
            remove_staged(removing[0])

    monkeypatch.setattr(worker.workspace.prepare, "remove_staged", teardown_removal)
    monkeypatch.setattr(os, "unlink", unlink)
    with caplog.at_level(logging.INFO):
        outcome, events = _run(tmp_path, LocalBackend, cleanup, prompt="scenario: hello")
    assert os.unlink is real_unlink  # the race did happen
    assert (outcome.status, outcome.exit_code) == ("succeeded", 0), events[-1]
    assert "teardown_error" not in events[-1]["data"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert list(work.iterdir()) == []
