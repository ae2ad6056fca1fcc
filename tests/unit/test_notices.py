"""Notices and ``job.completed`` are built in one place each, with the keys the control
plane reads: present when the builder has them, absent (never null) when not."""

from __future__ import annotations

from typing import Any

import pytest

from worker.errors import LeaseLost, ResultUploadFailed, SandboxError
from worker.events import notices
from worker.events.completed import job_completed
from worker.events.models import JobCompleted, Notice, WorkspaceChanged
from worker.rpc.oversize import OversizeLine


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


_UPLOAD = ResultUploadFailed("access denied", bucket="b", key="k")


@pytest.mark.parametrize(
    ("notice", "level", "code", "details"),
    [
        (notices.not_launched("cancelled", "turn"), "info", "cancelled_before_launch",
         {"next_phase": "turn"}),
        (notices.not_launched("timed_out", "workspace"), "info", "timed_out_before_launch",
         {"next_phase": "workspace"}),
        (notices.workspace_special_files_skipped([f"p{i}" for i in range(60)]), "warning",
         "workspace_special_files_skipped", {"paths": [f"p{i}" for i in range(50)]}),
        (notices.workspace_disk_unbounded(512), "warning", "workspace_disk_unbounded",
         {"disk_mb": 512}),
        (notices.admission_notes([{"path": ".git", "code": "c", "reason": "r"}] * 60),
         "warning", "admission_notes",
         {"notes": [{"path": ".git", "code": "c", "reason": "r"}] * 50, "total": 60}),
        (notices.network_denied(message="refused", reason="not_allowed",
                                target="example.com:443", seq=3),
         "warning", "network_denied",
         {"reason": "not_allowed", "target": "example.com:443", "seq": 3}),
        (notices.acp_malformed_line("{oops", "not JSON"), "warning", "acp_malformed_line",
         {"preview": "{oops"}),
        (notices.acp_stray_reply(3, duplicate=True, method="session/set_mode"), "warning",
         "acp_stray_reply", {"id": 3, "reason": "duplicate", "method": "session/set_mode"}),
        (notices.acp_stray_reply({"x": "y" * 100}, duplicate=False, method=None), "warning",
         "acp_stray_reply", {"id": '{"x": "' + "y" * 57, "reason": "unknown_id"}),
        (notices.sandbox_not_destroyed("sb-1"), "error", "sandbox_not_destroyed",
         {"sandbox_id": "sb-1"}),
        (notices.oom_killed(64), "error", "oom_killed",
         {"limit": "limits.memory_mb", "memory_mb": 64}),
        (notices.results_skipped_lease_lost(["capture", "bundle_upload"]), "warning",
         "results_skipped_lease_lost", {"skipped": ["capture", "bundle_upload"]}),
        (notices.workspace_kept("/w/j", "2026-01-01T00:00:00.000Z"), "info", "workspace_kept",
         {"path": "/w/j", "until": "2026-01-01T00:00:00.000Z"}),
        (notices.capture_failed(PermissionError(13, "Permission denied", "/w/x")), "error",
         "capture_failed", {"path": "/w/x"}),
        (notices.capture_failed(ValueError("agent text")), "error", "capture_failed",
         {"path": ""}),
        (notices.result_upload_failed(_UPLOAD), "error", "result_upload_failed",
         {"bucket": "b", "key": "k"}),
        (notices.patch_incomplete(reasons={"patch_full": 2, "too_large": 1}, file_bytes=10,
                                  patch_bytes=20, time_s=1.5),
         "warning", "patch_incomplete",
         {"omitted_total": 3, "reasons": {"patch_full": 2, "too_large": 1}, "file_bytes": 10,
          "patch_bytes": 20, "time_s": 1.5}),
        (notices.session_not_saved("s1", reason="too_large", why="it holds too much"),
         "warning", "session_not_saved", {"session_id": "s1", "reason": "too_large"}),
        (notices.session_entries_skipped("s1", count=2, entries=[{"path": "l", "kind": "symlink"}]),
         "warning", "session_entries_skipped",
         {"session_id": "s1", "count": 2, "entries": [{"path": "l", "kind": "symlink"}]}),
    ],
)  # fmt: skip
def test_the_job_s_notices_keep_their_level_code_and_details(
    notice: Notice, level: str, code: str, details: dict[str, Any]
) -> None:
    assert (notice.level, notice.code, notice.details) == (level, code, details)
    assert notice.message
    assert list(notice.wire()) == ["level", "code", "message", "details"]  # the wire order


def test_the_job_s_notice_messages_say_what_happened() -> None:
    assert notices.not_launched("timed_out", "turn").message == (
        "the job was out of time (limits.timeout_s) before turn; its agent was never started"
    )
    assert notices.network_denied(message="m", reason="r", target="t", seq=1).message == "m"
    assert (
        "Permission denied"
        in notices.capture_failed(PermissionError(13, "Permission denied")).message
    )
    assert "agent text" not in notices.capture_failed(ValueError("agent text")).message
    assert notices.result_upload_failed(_UPLOAD).message.endswith(": access denied")
    duplicate = notices.acp_stray_reply(3, duplicate=True, method="session/set_mode")
    assert duplicate.message == (
        "the agent answered request 3 (session/set_mode) again; the repeated reply was skipped"
    )
    unknown = notices.acp_stray_reply(99, duplicate=False, method=None)
    assert unknown.message == "the agent answered id 99, which the worker never sent; skipped"
    full = notices.patch_incomplete(
        reasons={"patch_full": 2}, file_bytes=1, patch_bytes=1, time_s=1
    )
    assert full.message.startswith("the patch leaves out 2 changed file(s) (2 patch_full)")
    late = notices.patch_incomplete(
        reasons={"time_budget": 1}, file_bytes=1, patch_bytes=1, time_s=0.5
    )
    assert late.message.startswith("change capture ran out of its 0.5 s budget: ")


def test_workspace_changed_goes_out_in_the_order_of_its_fields() -> None:
    changed = WorkspaceChanged(
        base={"kind": "local"}, paths=[], patch=None, truncated=False, total=0,
        counts={"added": 0},
    )  # fmt: skip
    assert list(changed.wire()) == ["counts", "total", "truncated", "paths", "patch", "base"]


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


def test_a_skipped_line_names_what_its_first_bytes_told_and_what_was_lost() -> None:
    tool = OversizeLine(
        size=9_000_000,
        limit=8_388_608,
        complete=True,
        kind="notification",
        method="session/update",
        update={"sessionUpdate": "tool_call_update", "toolCallId": "t" * 300},
    )
    notice = notices.acp_line_skipped(tool, tool_event=True)
    assert (notice.level, notice.code) == ("warning", "acp_line_skipped")
    assert notice.details == {
        "bytes": 9_000_000,
        "limit": 8_388_608,
        "complete": True,
        "kind": "notification",
        "method": "session/update",
        "update": "tool_call_update",
        "tool_call_id": "t" * 256,
        "tool_event": True,
    }
    assert "output cut" in notice.message
    unreadable = OversizeLine(size=9_000_001, limit=8_388_608, complete=False)
    notice = notices.acp_line_skipped(unreadable, tool_event=False)
    assert notice.details == {
        "bytes": 9_000_001,
        "limit": 8_388_608,
        "complete": False,
        "kind": "unknown",
        "tool_event": False,
    }  # absent, never null: nothing was readable
    assert "stream ended before its newline" in notice.message
    assert "its content is lost" in notice.message
