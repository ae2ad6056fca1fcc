"""session/update → canonical events: every kind mapped, nothing dropped, paths contained."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from worker.events.normalizer import Normalizer
from worker.rpc.oversize import OversizeLine


def _normalize(n: Normalizer, params: Any) -> list[tuple[str, dict[str, Any]]]:
    """The events of one update as ``(type, data as sent)``: what these tests compare."""
    return [(event.TYPE, event.wire()) for event in n.session_update(params)]


def _update(update_kind: str, /, **fields: Any) -> dict[str, Any]:
    return {"sessionId": "s1", "update": {"sessionUpdate": update_kind, **fields}}


def _norm(limit: int = 1024) -> Normalizer:
    return Normalizer(workspace_root="/workspace", text_limit=limit)


def test_message_and_thought_chunks() -> None:
    n = _norm()
    [(t1, d1)] = _normalize(
        n, _update("agent_message_chunk", content={"type": "text", "text": "Hi"})
    )
    [(t2, d2)] = _normalize(
        n, _update("agent_thought_chunk", content={"type": "text", "text": "hm"})
    )
    assert (t1, d1["role"], d1["text"]) == ("message.delta", "assistant", "Hi")
    assert (t2, d2["role"], d2["text"]) == ("message.delta", "thought", "hm")


def test_non_text_chunk_keeps_the_block() -> None:
    block = {"type": "image", "mimeType": "image/png", "data": "AAAA"}
    [(_, data)] = _normalize(_norm(), _update("agent_message_chunk", content=block))
    assert data["content"] == block


def test_tool_lifecycle_with_bounded_output_and_diff() -> None:
    n = _norm(limit=10)
    started = _normalize(
        n,
        _update(
            "tool_call",
            toolCallId="call-1\nfc_1",
            title="Edit File",
            kind="edit",
            status="pending",
            rawInput={"path": "/workspace/a.py"},
            locations=[{"path": "/workspace/a.py", "line": 3}],
        ),
    )
    assert started[0][0] == "tool.started"
    assert started[0][1]["tool_call_id"] == "call-1\nfc_1"
    assert started[0][1]["locations"] == [{"path": "a.py", "line": 3}]
    assert started[0][1]["raw_input"]["truncated"] is True
    [(type_, data)] = _normalize(
        n,
        _update(
            "tool_call_update",
            toolCallId="call-1\nfc_1",
            status="completed",
            rawOutput={"exitCode": 0, "stdout": "0123456789abcdef"},
            content=[{"type": "diff", "path": "/workspace/a.py", "oldText": "x", "newText": "y"}],
        ),
    )
    assert type_ == "tool.completed"
    assert data["output"]["truncated"] is True
    assert data["output"]["bytes"] > 10
    assert data["diffs"] == [
        {
            "path": "a.py",
            "old_text": {"text": "x", "truncated": False, "bytes": 1},
            "new_text": {"text": "y", "truncated": False, "bytes": 1},
        }
    ]


def test_in_progress_update_is_not_terminal() -> None:
    [(type_, data)] = _normalize(
        _norm(), _update("tool_call_update", toolCallId="t", status="in_progress")
    )
    assert type_ == "tool.updated"
    assert data["status"] == "in_progress"


def test_locations_outside_workspace_are_dropped_with_notice() -> None:
    out = _normalize(
        _norm(),
        _update(
            "tool_call",
            toolCallId="t",
            title="Read",
            kind="read",
            locations=[{"path": "/etc/passwd"}, {"path": "../up"}, {"path": "/workspace/ok"}],
        ),
    )
    assert out[0][1]["locations"] == [{"path": "ok", "line": None}]
    notices = [d for t, d in out if t == "notice"]
    assert [n["details"]["path"] for n in notices] == ["/etc/passwd", "../up"]


def test_prefix_sibling_is_outside() -> None:
    out = _normalize(
        _norm(), _update("tool_call", toolCallId="t", locations=[{"path": "/workspace-evil/x"}])
    )
    assert out[0][1]["locations"] == []


def test_plan_revisions_increase() -> None:
    n = _norm()
    entries = [{"content": "step", "priority": "medium", "status": "pending"}]
    revs = [_normalize(n, _update("plan", entries=entries))[0][1]["revision"] for _ in range(3)]
    assert revs == [1, 2, 3]


def test_unknown_kind_is_kept_raw() -> None:
    [(type_, data)] = _normalize(_norm(), _update("brand_new_kind", foo=1))
    assert type_ == "provider.unmapped"
    assert data["kind"] == "brand_new_kind"
    assert '"foo": 1' in data["raw"]["text"]


def test_malformed_known_kind_is_kept_raw() -> None:
    [(type_, data)] = _normalize(_norm(), _update("agent_message_chunk"))
    assert type_ == "provider.unmapped"
    assert data["kind"] == "agent_message_chunk"


def test_session_metadata_kinds() -> None:
    n = _norm()
    assert _normalize(n, _update("session_info_update", title="T"))[0] == (
        "session.titled",
        {"title": "T"},
    )
    assert _normalize(n, _update("current_mode_update", currentModeId="plan"))[0] == (
        "mode.changed",
        {"mode": "plan"},
    )
    cmds = [{"name": "create-rule", "description": "x"}]
    assert _normalize(n, _update("available_commands_update", availableCommands=cmds))[0] == (
        "commands.available",
        {"commands": cmds},
    )


def test_usage_only_when_the_agent_sends_it() -> None:
    n = _norm()
    assert n.usage_seen is False
    [(type_, data)] = _normalize(n, _update("usage_update", used=10, size=100))
    assert type_ == "usage.reported"
    assert data["available"] is True
    assert n.usage_seen is True


def test_an_oversize_tool_update_closes_its_tool_with_the_output_cut() -> None:
    n = _norm(limit=64)
    n.bind("s1")
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"}
    line = OversizeLine(
        size=9_000_000,
        limit=8_388_608,
        complete=True,
        kind="notification",
        method="session/update",
        session_id="s1",
        update=update,
        output_preview="x" * 100,
    )
    [event] = n.oversize_update(line)
    assert event.TYPE == "tool.completed"
    assert event.wire()["output"] == {"text": "x" * 64, "truncated": True, "bytes": -1}
    assert event.wire()["status"] == "failed"
    # No preview (the output came after the cut): still marked cut.
    no_text = replace(line, output_preview=None, update={**update, "status": "in_progress"})
    [event] = n.oversize_update(no_text)
    assert event.TYPE == "tool.updated"
    assert event.wire()["output"] == {"text": "", "truncated": True, "bytes": -1}


def test_only_a_tool_update_becomes_an_event_from_an_oversize_line() -> None:
    n = _norm()
    n.bind("s1")
    chunk = OversizeLine(
        size=9_000_000,
        limit=8_388_608,
        complete=True,
        kind="notification",
        method="session/update",
        session_id="s1",
        update={"sessionUpdate": "agent_message_chunk"},
    )
    assert n.oversize_update(chunk) == []
    unreadable = OversizeLine(size=9_000_000, limit=8_388_608, complete=True)
    assert n.oversize_update(unreadable) == []
