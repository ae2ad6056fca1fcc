"""Notices and ``job.completed`` are built in one place each, with the keys the control
plane reads: present when the builder has them, absent (never null) when not."""

from __future__ import annotations

from typing import Any

import pytest

from worker.errors import LeaseLost, ResultUploadFailed, SandboxError
from worker.events import notices
from worker.events.completed import job_completed
from worker.events.models import JobCompleted, Notice


@pytest.mark.parametrize(
    ("notice", "code", "details"),
    [
        (
            notices.event_too_large("tool.updated", 300, 200),
            "event_too_large",
            {"type": "tool.updated", "bytes": 300, "limit": 200},
        ),
        (
            notices.subagent_update_refused("s" * 300, "plan", "unknown_session"),
            "subagent_update_refused",
            {"session_id": "s" * 256, "kind": "plan", "reason": "unknown_session"},
        ),
        (notices.path_outside_workspace("/etc/x"), "path_outside_workspace", {"path": "/etc/x"}),
        (
            notices.artifact_refused("a.png", "generated_image", "symlink"),
            "artifact_refused",
            {"path": "a.png", "kind": "generated_image", "reason": "symlink"},
        ),
        (
            notices.interaction_refused("cursor/create_plan", "too big", "too_large"),
            "interaction_refused",
            {"method": "cursor/create_plan", "reason": "too_large"},
        ),
        (
            notices.permission_refused(None, "t1", "child_settled"),
            "permission_refused",
            {"session_id": "None", "tool_call_id": "t1", "reason": "child_settled"},
        ),
        (notices.interaction_unavailable("plan"), "interaction_unavailable", {"kind": "plan"}),
        (
            notices.interaction_outside_turn("question"),
            "interaction_outside_turn",
            {"kind": "question"},
        ),
        (
            notices.interaction_too_large("plan", 300_000, 200_000),
            "interaction_too_large",
            {"kind": "plan"},
        ),
    ],
)  # fmt: skip
def test_each_notice_has_its_code_and_details(
    notice: Notice, code: str, details: dict[str, Any]
) -> None:
    assert notice.TYPE == "notice"
    assert notice.level == "warning"
    assert (notice.code, notice.details) == (code, details)
    assert notice.message
    assert set(notice.wire()) == {"level", "code", "message", "details"}


def test_interaction_unavailable_says_the_cause_when_there_is_one() -> None:
    assert "no Redis" in notices.interaction_unavailable("plan").message
    assert notices.interaction_unavailable("plan", cause="lease lost").message == "lease lost"


def test_a_settled_job_names_only_what_its_settler_has() -> None:
    lost = LeaseLost("reaped", job_id="j")
    done = job_completed(status="lost", error=lost, duration_ms=12.5, timings_ms={})
    assert done.TYPE == "job.completed"
    assert done.wire() == {
        "status": "lost",
        "stop_reason": None,
        "error": lost.to_dict(),
        "duration_ms": 12.5,
        "timings_ms": {},
    }
    short = job_completed(status="failed", error=lost, duration_ms=0.0)
    assert set(short.wire()) == {"status", "stop_reason", "error", "duration_ms"}


def test_the_job_s_own_settling_carries_result_and_step_errors() -> None:
    upload = ResultUploadFailed("no bucket", bucket="b")
    teardown = SandboxError("stuck", step="destroy")
    done = job_completed(
        status="failed",
        stop_reason="end_turn",
        error=teardown,
        duration_ms=3.25,
        timings_ms={"turn": 1.5},
        result=None,
        result_error=upload,
        teardown_error=teardown,
    )
    wire = done.wire()
    assert wire["result"] is None  # present, null: the bundle is not there
    assert wire["result_error"] == upload.to_dict()
    assert wire["teardown_error"] == teardown.to_dict()
    assert wire["timings_ms"] == {"turn": 1.5}
    assert isinstance(wire["duration_ms"], float)
    assert JobCompleted.model_validate(wire).wire() == wire
    ok = job_completed(status="succeeded", error=None, duration_ms=1.0, result=None)
    assert set(ok.wire()) == {"status", "stop_reason", "error", "duration_ms", "result"}
