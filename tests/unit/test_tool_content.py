"""Nothing a tool returns vanishes: media content kept (inline under a budget, else by
reference), failures in ``rawOutput`` end the tool ``failed`` with the reason, denied
tools that end bare fail too, and subagent tasks are bounded and closed at the end."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from worker.events import delegations
from worker.events.media import MAX_CONTENT_REFS
from worker.events.normalizer import Normalizer

ROOT = "root-session"
LIMIT = 1024
Events = list[tuple[str, dict[str, Any]]]


def _norm() -> Normalizer:
    n = Normalizer(workspace_root="/workspace", text_limit=LIMIT)
    n.bind(ROOT)
    return n


def _completed(n: Normalizer, tool: str = "t1", **fields: Any) -> Events:
    params = {
        "sessionId": ROOT,
        "update": {
            "sessionUpdate": "tool_call_update",
            "toolCallId": tool,
            "status": "completed",
            **fields,
        },
    }
    return [(e.TYPE, e.wire()) for e in n.session_update(params)]


def _content(*inner: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "content", "content": block} for block in inner]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _only(events: Events, type_: str) -> list[dict[str, Any]]:
    return [data for t, data in events if t == type_]


def test_a_small_image_is_kept_inline_with_its_digest() -> None:
    raw = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    events = _completed(
        _norm(), content=_content({"type": "image", "mimeType": "image/png", "data": _b64(raw)})
    )
    [done] = _only(events, "tool.completed")
    assert done["content"] == [
        {
            "type": "image",
            "inline": True,
            "mime_type": "image/png",
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "data": _b64(raw),
        }
    ]
    assert _only(events, "provider.unmapped") == []


def test_above_the_budget_only_a_reference_is_kept() -> None:
    small, big = b"a" * 300, b"b" * 3000  # base64: 400 and 4000 characters
    events = _completed(
        _norm(),
        content=_content(
            {"type": "image", "mimeType": "image/png", "data": _b64(big)},
            {"type": "audio", "mimeType": "audio/wav", "data": _b64(small)},
            {"type": "image", "mimeType": "image/gif", "data": _b64(small)},
            {"type": "image", "mimeType": "image/gif", "data": _b64(small)},
        ),
    )
    [done] = _only(events, "tool.completed")
    kept = done["content"]
    assert [(c["type"], c["inline"]) for c in kept] == [
        ("image", False),  # over the whole budget
        ("audio", True),
        ("image", True),
        ("image", False),  # 400 + 400 + 400 > 1024: the budget ran out
    ]
    assert "data" not in kept[0]
    assert "data" not in kept[3]
    assert kept[0]["bytes"] == 3000
    assert kept[0]["sha256"] == hashlib.sha256(big).hexdigest()
    assert sum(len(c.get("data", "")) for c in kept) <= LIMIT


def test_resources_and_links_are_kept() -> None:
    blob = b"\x00\x01binary"
    text = "x" * 5000
    events = _completed(
        _norm(),
        content=_content(
            {"type": "resource", "resource": {"uri": "file:///workspace/a.txt", "text": "hello"}},
            {
                "type": "resource",
                "resource": {"uri": "mem://b", "mimeType": "application/x", "blob": _b64(blob)},
            },
            {"type": "resource", "resource": {"uri": "file:///workspace/big.txt", "text": text}},
            {
                "type": "resource_link",
                "uri": "file:///workspace/c.md",
                "name": "c.md",
                "size": 12,
                "title": "C",
            },
        ),
    )
    [done] = _only(events, "tool.completed")
    first, second, third, link = done["content"]
    assert first["text"] == {"text": "hello", "truncated": False, "bytes": 5}
    assert (first["inline"], first["sha256"]) == (True, hashlib.sha256(b"hello").hexdigest())
    assert (second["bytes"], second["inline"], second["mime_type"]) == (
        len(blob),
        True,
        "application/x",
    )
    assert third["inline"] is False
    assert third["text"]["truncated"] is True
    assert third["text"]["bytes"] == 5000
    assert link == {
        "type": "resource_link",
        "inline": True,
        "uri": "file:///workspace/c.md",
        "name": "c.md",
        "title": "C",
        "bytes": 12,
    }
    assert _only(events, "provider.unmapped") == []


@pytest.mark.parametrize(
    "inner",
    [
        {"type": "image", "mimeType": "image/png", "data": "not base64!"},
        {"type": "image", "mimeType": "image/png", "data": 12},
        {"type": "image", "mimeType": "image/png"},
        {"type": "audio", "mimeType": "audio/wav", "data": "ï"},
        {"type": "video", "data": "AAAA"},
        {"type": "resource", "resource": {"text": "no uri"}},
        {"type": "resource", "resource": "file:///x"},
        {"type": "resource", "resource": {"uri": "u", "blob": "%%%"}},
        {"type": "resource_link", "name": "no uri"},
        {"no": "type"},
    ],
)
def test_an_unrepresentable_block_is_kept_as_unmapped(inner: dict[str, Any]) -> None:
    events = _completed(_norm(), content=_content(inner))
    [done] = _only(events, "tool.completed")
    assert "content" not in done
    [unmapped] = _only(events, "provider.unmapped")
    assert unmapped["partial"] is True
    assert json.loads(unmapped["raw"]["text"]) == {"content": [{"index": 0, "content": inner}]}


def test_fields_no_canonical_field_holds_are_kept_as_unmapped() -> None:
    image = {
        "type": "image",
        "mimeType": "image/png",
        "data": "AAAA",
        "annotations": {"audience": ["user"]},
    }
    link = {"type": "resource_link", "uri": "u", "name": "n", "size": "big", "_meta": {"k": 1}}
    resource = {"type": "resource", "resource": {"uri": "u", "text": "t", "_meta": {"x": 2}}}
    entries = [
        *_content(image, link, resource),
        {"type": "mystery", "x": 1},
        {"type": "terminal", "terminalId": "t1"},
    ]
    events = _completed(_norm(), content=entries)
    [done] = _only(events, "tool.completed")
    assert [c["type"] for c in done["content"]] == ["image", "resource_link", "resource"]
    assert "bytes" not in done["content"][1]  # "big" is no size
    [unmapped] = _only(events, "provider.unmapped")
    assert json.loads(unmapped["raw"]["text"])["content"] == [
        {"index": 0, "type": "image", "annotations": {"audience": ["user"]}},
        {"index": 1, "type": "resource_link", "_meta": {"k": 1}, "size": "big"},
        {"index": 2, "type": "resource", "resource": {"_meta": {"x": 2}}},
        {"index": 3, "entry": {"type": "mystery", "x": 1}},  # the terminal entry is mapped
    ]


def test_too_many_blocks_spill_into_unmapped() -> None:
    blocks = [
        {"type": "resource_link", "uri": f"u{i}", "name": "n"} for i in range(MAX_CONTENT_REFS + 3)
    ]
    events = _completed(_norm(), content=_content(*blocks))
    [done] = _only(events, "tool.completed")
    assert len(done["content"]) == MAX_CONTENT_REFS
    [unmapped] = _only(events, "provider.unmapped")
    raw = unmapped["raw"]
    assert raw["truncated"] or [e["index"] for e in json.loads(raw["text"])["content"]] == [
        MAX_CONTENT_REFS,
        MAX_CONTENT_REFS + 1,
        MAX_CONTENT_REFS + 2,
    ]


def test_deeply_nested_extras_are_bounded_not_fatal() -> None:
    nested: dict[str, Any] = {}
    for _ in range(5000):
        nested = {"a": nested}
    image = {"type": "image", "mimeType": "image/png", "data": "AAAA", "annotations": nested}
    events = _completed(_norm(), content=_content(image))
    [done] = _only(events, "tool.completed")
    assert done["content"][0]["bytes"] == 3
    [unmapped] = _only(events, "provider.unmapped")
    assert unmapped["raw"] == {
        "text": "<nested too deeply to show>",
        "truncated": True,
        "bytes": -1,
    }


@pytest.mark.parametrize(
    ("raw_output", "failure"),
    [
        (
            {"error": "MCP error -32601: Method not found"},
            ("error", "MCP error -32601: Method not found"),
        ),
        ({"error": {"message": "boom"}}, ("error", '{"message": "boom"}')),
        ({"rejected": True}, ("rejected", "rejected")),
        ({"rejected": "the user said no"}, ("rejected", "the user said no")),
        ({"permissionDenied": True}, ("permission_denied", "permissionDenied")),
        ({"exitCode": 2, "stdout": "", "stderr": "nope"}, ("exit_code", "exit code 2")),
        ({"exit_code": 127}, ("exit_code", "exit code 127")),
        ({"error": "x" * 5000}, ("error", "x" * 1024)),
    ],
)
def test_a_reported_failure_ends_the_tool_failed(raw_output: Any, failure: tuple[str, str]) -> None:
    [done] = _only(_completed(_norm(), rawOutput=raw_output), "tool.completed")
    assert done["status"] == "failed"
    assert (done["failure"]["code"], done["failure"]["message"]) == failure


@pytest.mark.parametrize(
    "raw_output",
    [
        None,
        {"exitCode": 0, "stdout": "ok", "stderr": ""},
        {"error": None},
        {"error": ""},
        {"rejected": False},
        {"permissionDenied": False},
        {"exitCode": True},
        ["error"],
        "error",
    ],
)
def test_no_failure_reported_keeps_completed(raw_output: Any) -> None:
    fields = {} if raw_output is None else {"rawOutput": raw_output}
    [done] = _only(_completed(_norm(), **fields), "tool.completed")
    assert done["status"] == "completed"
    assert "failure" not in done


def test_a_denied_tool_that_ends_bare_failed() -> None:
    n = _norm()
    n.permission_decided("t1", denied=True)
    n.permission_decided("t2", denied=True)
    n.permission_decided("t2", denied=False)  # asked again, allowed
    n.permission_decided("t3", denied=True)
    [denied] = _only(_completed(n, "t1"), "tool.completed")
    assert (denied["status"], denied["failure"]["code"]) == ("failed", "permission_denied")
    [allowed] = _only(_completed(n, "t2"), "tool.completed")
    assert allowed["status"] == "completed"
    [ran] = _only(_completed(n, "t3", rawOutput={"exitCode": 0}), "tool.completed")
    assert ran["status"] == "completed"  # it ran after all: its output says so
    [again] = _only(_completed(n, "t1"), "tool.completed")
    assert again["status"] == "completed"  # forgotten once it completed


def _task_tool(n: Normalizer, tool: str, *, background: bool = False) -> Events:
    start = {
        "sessionId": ROOT,
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": tool,
            "title": "Task: x",
            "kind": "other",
            "status": "pending",
            "rawInput": {"_toolName": "task", "prompt": "p", "description": "d"},
        },
    }
    events = [(e.TYPE, e.wire()) for e in n.session_update(start)]
    if background:
        events += _completed(n, tool, rawOutput={"durationMs": 3, "isBackground": True})
    return events


def test_a_task_tool_that_reports_an_error_fails_its_delegation() -> None:
    n = _norm()
    _task_tool(n, "task-1")
    events = _completed(n, "task-1", rawOutput={"error": "spawn failed"})
    [delegation] = _only(events, "delegation.completed")
    assert (delegation["state"], delegation["reason"]) == ("failed", "tool_failed")


def test_running_delegations_are_closed_at_the_end() -> None:
    n = _norm()
    _task_tool(n, "bg", background=True)
    _task_tool(n, "done")
    _completed(n, "done")
    closed = [(e.TYPE, e.wire()) for e in n.close_delegations()]
    assert [(t, d["tool_call_id"], d["state"], d["reason"]) for t, d in closed] == [
        ("delegation.completed", "bg", "cancelled", "job_ended")
    ]
    assert n.close_delegations() == []


def test_finished_tasks_are_evicted_with_a_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delegations, "MAX_TASKS", 3)
    n = _norm()
    for tool in ("a", "b"):
        _task_tool(n, tool)
        _completed(n, tool)
    _task_tool(n, "c")
    events = _task_tool(n, "d")  # full: "a", the oldest finished, goes
    [notice] = _only(events, "notice")
    assert notice["code"] == "delegation_evicted"
    assert (notice["details"]["tool_call_id"], notice["details"]["state"]) == ("a", "completed")
    assert [d["tool_call_id"] for d in _only(events, "delegation.started")] == ["d"]
    assert not n.delegations.is_task_tool("a")


def test_a_new_task_is_refused_when_every_tracked_task_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delegations, "MAX_TASKS", 2)
    n = _norm()
    _task_tool(n, "a")
    _task_tool(n, "b")
    events = _task_tool(n, "c")
    assert [t for t, _ in events] == ["tool.started", "notice"]  # the tool itself is kept
    assert _only(events, "notice")[0]["details"]["reason"] == "too_many_tasks"
    params = {"toolCallId": "c", "description": "d", "prompt": "p", "model": "m"}
    refused = [(e.TYPE, e.wire()) for e in n.extension("cursor/task", params)]
    assert [t for t, _ in refused] == ["notice", "provider.unmapped"]
    assert json.loads(refused[1][1]["raw"]["text"]) == params  # kept, never dropped
    assert n.delegations.is_task_tool("a")
    assert n.delegations.is_task_tool("b")


def test_a_tool_call_keeps_its_media_and_leaves_the_rest_unmapped() -> None:
    raw = b"GIF89a" + b"\x01" * 10
    image = {"type": "image", "mimeType": "image/gif", "data": _b64(raw)}
    diff = {"type": "diff", "path": "/workspace/a", "oldText": None, "newText": "x"}
    text = {"type": "content", "content": {"type": "text", "text": "about to read"}}
    params = {
        "sessionId": ROOT,
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": "t1",
            "title": "Read",
            "kind": "read",
            "status": "pending",
            "content": [*_content(image), diff, text],
        },
    }
    events = [(e.TYPE, e.wire()) for e in _norm().session_update(params)]
    [started] = _only(events, "tool.started")
    assert [(c["type"], c["bytes"], c["sha256"]) for c in started["content"]] == [
        ("image", len(raw), hashlib.sha256(raw).hexdigest())
    ]
    [unmapped] = _only(events, "provider.unmapped")
    assert (unmapped["kind"], unmapped["partial"]) == ("tool_call", True)
    assert json.loads(unmapped["raw"]["text"]) == {
        "content": [{"index": 1, "entry": diff}, {"index": 2, "entry": text}]
    }
