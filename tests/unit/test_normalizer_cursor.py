"""Normalizer: Cursor's checklist merge, subagent correlation and attribution, refusals,
replay marking, partial (unknown-field) mapping, config and usage updates."""

from __future__ import annotations

from typing import Any

import pytest

from worker.events.artifacts import Verdict
from worker.events.normalizer import Normalizer

ROOT = "root-session"
CHILD = "child-1"
TASK = "call-1\nfc_1"


def _normalize(n: Normalizer, params: Any) -> list[tuple[str, dict[str, Any]]]:
    """The events of one update as ``(type, data as sent)``: what these tests compare."""
    return [(event.TYPE, event.wire()) for event in n.session_update(params)]


def _extension(n: Normalizer, method: str, params: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(event.TYPE, event.wire()) for event in n.extension(method, params)]


def _norm() -> Normalizer:
    n = Normalizer(workspace_root="/workspace", text_limit=1024)
    n.bind(ROOT)
    return n


def _up(update_kind: str, session: str = ROOT, /, **fields: Any) -> dict[str, Any]:
    return {"sessionId": session, "update": {"sessionUpdate": update_kind, **fields}}


def _task_tool(n: Normalizer) -> list[tuple[str, dict[str, Any]]]:
    raw = {
        "_toolName": "task",
        "prompt": "Count files",
        "description": "Count",
        "subagentType": {"unspecified": {}},
    }
    return _normalize(
        n,
        _up(
            "tool_call",
            toolCallId=TASK,
            title="Task: Count",
            kind="other",
            status="pending",
            rawInput=raw,
        ),
    )


def _spawn(n: Normalizer, child: str = CHILD, on: str = ROOT, tool: str = TASK) -> Any:
    meta = {"cursor": {"toolCallId": tool, "agentId": child, "model": "parent-model"}}
    return _normalize(
        n,
        _up(
            "subagent_spawned",
            on,
            subagentSessionId=child,
            name="generalPurpose",
            task="Count files",
            capabilities={},
            _meta=meta,
        ),
    )


def _cursor_task(n: Normalizer) -> Any:
    return _extension(
        n,
        "cursor/task",
        {
            "toolCallId": TASK,
            "description": "Count",
            "prompt": "Count files",
            "subagentType": {"custom": {"name": "counter"}},
            "model": "child-model",
            "agentId": "agent-9",
            "durationMs": 40,
        },
    )


def test_todos_merge_by_id_and_replace_without_merge() -> None:
    n = _norm()
    todos = [{"id": "a", "content": "A", "status": "pending"}, {"id": "b", "content": "B"}]
    [(_, first)] = _extension(n, "cursor/update_todos", {"toolCallId": "t", "todos": todos})
    [(_, merged)] = _extension(
        n,
        "cursor/update_todos",
        {
            "todos": [
                {"id": "a", "status": "cancelled"},
                {"id": "c", "content": "C", "status": "weird"},
            ],
            "merge": True,
        },
    )
    assert (first["revision"], merged["revision"]) == (1, 2)
    assert [(t["id"], t["content"], t["status"], t["native_status"]) for t in merged["todos"]] == [
        ("a", "A", "cancelled", "cancelled"),
        ("b", "B", "pending", "pending"),
        ("c", "C", "unknown", "weird"),
    ]
    [(_, replaced)] = _extension(n, "cursor/update_todos", {"todos": [{"id": "z", "content": "Z"}]})
    assert [t["id"] for t in replaced["todos"]] == ["z"]


@pytest.mark.parametrize("task_first", [True, False])
def test_cursor_task_correlates_with_its_tool_in_either_order(task_first: bool) -> None:
    n = _norm()
    events = _cursor_task(n) + _task_tool(n) if task_first else _task_tool(n)[1:] + _cursor_task(n)
    snapshots = [d for t, d in events if t.startswith("delegation.")]
    assert snapshots[0]["state"] == "running"
    last = snapshots[-1]
    assert (last["model"], last["agent_id"], last["subagent_type"]) == (
        "child-model",
        "agent-9",
        "custom:counter",
    )
    assert last["task"]["text"] == "Count files"
    [(_, done)] = _normalize(
        n,
        _up(
            "tool_call_update",
            toolCallId=TASK,
            status="completed",
            rawOutput={"durationMs": 41, "isBackground": False},
        ),
    )[1:]
    assert (done["state"], done["duration_ms"], done["background"]) == ("completed", 41, False)


def test_child_updates_are_attributed_never_flattened() -> None:
    n = _norm()
    _task_tool(n)
    [(kind, spawned)] = _spawn(n)
    assert (kind, spawned["child_id"], spawned["parent_id"]) == ("delegation.updated", CHILD, ROOT)
    chunk = {"type": "text", "text": "hi"}
    [(t, data)] = _normalize(n, _up("agent_message_chunk", CHILD, content=chunk))
    assert (t, data["child_id"], data["text"]) == ("message.delta", CHILD, "hi")
    [(t, plan)] = _normalize(n, _up("plan", CHILD, entries=[{"content": "x", "status": "pending"}]))
    assert (plan["child_id"], plan["revision"]) == (CHILD, 1)
    [(t, ended)] = _normalize(
        n, _up("subagent_state_update", subagentSessionId=CHILD, state="disconnected")
    )
    assert (t, ended["state"], ended["reason"]) == (
        "delegation.completed",
        "failed",
        "disconnected",
    )


@pytest.mark.parametrize(
    ("setup", "update", "reason"),
    [
        (
            lambda n: None,
            _up("agent_message_chunk", "nobody", content={"type": "text", "text": "x"}),
            "unknown_session",
        ),
        (_spawn, _up("subagent_spawned", subagentSessionId=CHILD), "duplicate_spawn"),
        (
            _spawn,
            _up(
                "subagent_spawned",
                CHILD,
                subagentSessionId="c2",
                _meta={"cursor": {"toolCallId": TASK}},
            ),
            "task_already_has_a_child",
        ),
        (
            lambda n: (_task_tool(n), _spawn(n, child="other", tool="t2")),
            _up(
                "subagent_spawned",
                "other",
                subagentSessionId="c3",
                _meta={"cursor": {"toolCallId": TASK}},
            ),
            "foreign_parent",
        ),
        (
            lambda n: None,
            _up("subagent_state_update", subagentSessionId="x", state="completed"),
            "unknown_child",
        ),
        (
            lambda n: (_spawn(n), setattr(n, "settled", True)),
            _up("agent_message_chunk", CHILD, content={"type": "text", "text": "late"}),
            "turn_settled",
        ),
    ],
)
def test_refused_child_updates_become_notices(setup: Any, update: Any, reason: str) -> None:
    n = _norm()
    setup(n)
    [(kind, data)] = _normalize(n, update)
    assert (kind, data["code"], data["details"]["reason"]) == (
        "notice",
        "subagent_update_refused",
        reason,
    )


def test_replay_marks_every_event() -> None:
    n = _norm()
    n.replay = True
    out = _normalize(n, _up("user_message_chunk", content={"type": "text", "text": "hi"}))
    out += _normalize(n, _up("tool_call", toolCallId="replay-0-0", title="Read", kind="read"))
    assert [d["replay"] for _, d in out] == [True, True]


def test_unknown_fields_are_kept_as_partial_unmapped() -> None:
    out = _normalize(
        _norm(),
        _up(
            "tool_call_update",
            toolCallId="t",
            status="completed",
            rawOutput={"exitCode": 2},
            futureField={"x": 1},
        ),
    )
    assert out[0][1]["exit_code"] == 2
    [extra] = [d for k, d in out if k == "provider.unmapped"]
    assert (extra["kind"], extra["partial"]) == ("tool_call_update", True)
    assert '"futureField"' in extra["raw"]["text"]


def test_config_and_usage_updates() -> None:
    n = _norm()
    [(kind, config)] = _normalize(n, _up("config_option_update", configOptions=[{"id": "model"}]))
    assert (kind, config["config_options"]) == ("config.updated", [{"id": "model"}])
    out = _normalize(n, _up("usage_update", used=10, size="big"))
    assert out[0] == ("usage.reported", {"available": True, "source": "agent", "used": 10})
    assert out[1][1]["partial"] is True  # the malformed size is kept, not guessed
    assert n.usage_seen


def test_raw_input_redacts_secret_looking_keys() -> None:
    out = _normalize(
        _norm(),
        _up(
            "tool_call",
            toolCallId="t",
            rawInput={"url": "u", "headers": {"Authorization": "x"}, "api_key": "k"},
        ),
    )
    text = out[0][1]["raw_input"]["text"]
    assert '"Authorization": "[REDACTED]"' in text
    assert '"api_key": "[REDACTED]"' in text


def test_generated_images_go_through_the_containment_check() -> None:
    checked: list[str] = []

    def check(path: str) -> Verdict:
        checked.append(path)
        return Verdict("img.png", 3) if path == "/workspace/img.png" else Verdict(reason="symlink")

    n = Normalizer(workspace_root="/workspace", artifacts=check)
    out = _extension(
        n,
        "cursor/generate_image",
        {
            "toolCallId": "t",
            "description": "d",
            "filePath": "/workspace/img.png",
            "referenceImagePaths": ["ln.png"],
        },
    )
    assert checked == ["/workspace/img.png", "ln.png"]
    assert out[0] == (
        "artifact.referenced",
        {
            "path": "img.png",
            "kind": "generated_image",
            "registered": False,
            "bytes": 3,
            "tool_call_id": "t",
            "description": "d",
        },
    )
    assert out[1][1]["details"]["reason"] == "symlink"


def test_permission_asks_are_attributed_to_the_child_that_asks() -> None:
    n = _norm()
    _task_tool(n)
    _spawn(n)
    _normalize(n, _up("tool_call", CHILD, toolCallId="child-tool", title="rm", kind="execute"))
    _normalize(n, _up("tool_call", ROOT, toolCallId="root-tool", title="ls", kind="read"))
    assert n.permission_source(CHILD, "x") == (CHILD, None)  # the child's own session
    assert n.permission_source(ROOT, "child-tool") == (CHILD, None)  # parent id, child's tool
    assert n.permission_source(ROOT, "root-tool") == (None, None)
    assert n.permission_source(None, None) == (None, None)
    assert n.permission_source("ghost", "x") == (None, "unknown_session")
    assert n.permission_source({"not": "a string"}, "x") == (None, "unknown_session")
    _normalize(n, _up("subagent_state_update", subagentSessionId=CHILD, state="completed"))
    assert n.permission_source(CHILD, "x") == (CHILD, "child_settled")
    assert n.permission_source(ROOT, "child-tool") == (CHILD, "child_settled")
    assert n.permission_source(ROOT, "root-tool") == (None, None)
