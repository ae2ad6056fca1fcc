"""Cursor emulator scenarios end to end: golden event streams, subagents, checklists,
artifacts, unmapped fields, permission policies, fs/terminal, models, session resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cursor_jobs import check_golden, run_job
from tests.integration.docker_engine import base_image, docker_host, engine_config, job_backend

__all__ = ["base_image", "docker_host", "engine_config", "job_backend"]

Events = list[dict[str, Any]]


def _of(events: Events, type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _text(events: Events, *, child: str | None = None, role: str = "assistant") -> str:
    return "".join(
        d["text"]
        for d in _of(events, "message.delta")
        if d["role"] == role and d.get("child_id") == child
    )


@pytest.mark.parametrize("name", ["subagents", "todos", "artifacts", "unmapped", "tour"])
def test_scenario_matches_golden(tmp_path: Path, name: str) -> None:
    events = run_job(tmp_path, f"scenario: {name}", job_id=f"golden-{name}")
    assert events[-1]["data"]["status"] == "succeeded"
    check_golden(name, events, tmp_path)


def test_subagents_are_attributed_and_correlated(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: subagents")
    first = "11111111-1111-4111-8111-111111111111"
    assert _text(events, child=first) == "There are 2 files."
    assert "There are 2 files." not in _text(events)  # never flattened into the parent
    assert _text(events, child=first, role="thought") == "Listing the workspace."
    child_tools = [d for d in _of(events, "tool.completed") if d.get("child_id") == first]
    assert [t["tool_call_id"] for t in child_tools] == ["child-tool-1"]
    assert [p["child_id"] for p in _of(events, "plan.updated")] == [first]
    by_child = _latest_delegations(events)
    assert by_child[first]["model"] == "gpt-5.4-mini-medium"  # cursor/task wins over _meta
    assert by_child[first]["state"] == "completed"
    assert by_child[first]["duration_ms"] == 1234
    background = by_child["22222222-2222-4222-8222-222222222222"]
    assert background["background"] is True
    assert background["subagent_type"] == "custom:watcher"
    flaky = by_child["33333333-3333-4333-8333-333333333333"]
    assert (flaky["state"], flaky["reason"]) == ("failed", "disconnected")
    refused = [n["details"]["reason"] for n in _of(events, "notice")]
    assert refused == ["unknown_session", "child_settled"]


def test_subagent_permission_asks_are_attributed_to_the_child(tmp_path: Path) -> None:
    events = run_job(
        tmp_path, "scenario: subagent-permissions", permissions={"policy": "allow_reads"}
    )
    child = "55555555-5555-4555-8555-555555555555"
    decided = [
        (d["title"], d["decision"], d.get("child_id")) for d in _of(events, "permission.decided")
    ]
    assert decided == [
        ("Read README.md", "allowed", child),  # on the child's own session id
        ("`rm -rf build`", "denied", child),  # parent session id, the child's tool id
        ("`ls late`", "denied", child),  # the child had finished: refused unasked
        ("`ls ghost`", "denied", None),  # nobody spawned it: refused unasked
        ("`ls own`", "allowed", None),  # the parent's own ask
    ]
    refused = [n["details"] for n in _of(events, "notice") if n["code"] == "permission_refused"]
    assert [(n["session_id"], n["reason"]) for n in refused] == [
        (child, "child_settled"),
        ("66666666-6666-4666-8666-666666666666", "unknown_session"),
    ]
    assert events[-1]["data"]["status"] == "succeeded"


def _latest_delegations(events: Events) -> dict[str | None, dict[str, Any]]:
    """The last snapshot of every delegation, by child id."""
    latest = {
        e["data"]["tool_call_id"]: e["data"] for e in events if e["type"].startswith("delegation.")
    }
    return {d["child_id"]: d for d in latest.values()}


def test_todos_merge_by_native_id(tmp_path: Path) -> None:
    todos = _of(run_job(tmp_path, "scenario: todos"), "todos.updated")
    assert [t["revision"] for t in todos] == [1, 2, 3, 4]
    assert [(i["id"], i["status"]) for i in todos[2]["todos"]] == [
        ("inspect", "completed"),
        ("change", "cancelled"),
        ("test", "pending"),
    ]
    assert todos[2]["todos"][0]["content"] == "Inspect the code"  # kept across the merge
    assert [i["id"] for i in todos[3]["todos"]] == ["ship"]  # merge: false replaces


def test_artifacts_only_regular_files_inside_the_workspace(
    tmp_path: Path, job_backend: dict[str, str]
) -> None:
    """The same artifacts and refusals on every backend, through its own file access."""
    events = run_job(tmp_path, "scenario: artifacts", env=job_backend)
    assert events[-1]["data"]["status"] == "succeeded"
    found = [
        (a["kind"], a["path"], a["registered"], a["bytes"])
        for a in _of(events, "artifact.referenced")
    ]
    size = len(b"not really a png")  # what the scenario wrote
    assert found == [
        ("generated_image", "images/badge.png", False, size),
        ("reference_image", "images/badge.png", False, size),
        ("tool_resource", "images/badge.png", False, size),
    ]
    reasons = [n["details"]["reason"] for n in _of(events, "notice")]
    assert reasons == [
        "outside_workspace",
        "traversal",
        "symlink",
        "symlink",
        "missing",
        "not_regular_file",
        "outside_workspace",
    ]


def test_unknown_kinds_and_fields_are_kept(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: unmapped")
    unmapped = _of(events, "provider.unmapped")
    assert [(u["kind"], u.get("partial", False)) for u in unmapped] == [
        ("hologram_update", False),
        ("agent_message_chunk", True),
    ]
    # messageId is a known chunk field (it only groups chunks); the unknown _meta is kept.
    assert json.loads(unmapped[1]["raw"]["text"]) == {"_meta": {"cursor": {"x": 1}}}
    assert _of(events, "config.updated")[0]["config_options"][0]["id"] == "mode"
    assert _of(events, "usage.reported") == [
        {
            "available": True,
            "source": "agent",
            "used": 1200,
            "size": 200000,
            "cost": {"amount": 0.01, "currency": "USD"},
        }
    ]
    [started] = _of(events, "tool.started")
    assert "sk-not-a-real-key" not in started["raw_input"]["text"]
    assert _of(events, "tool.completed")[0]["exit_code"] == 1
    # An entitlement refusal is plain text: kept as text, the turn still ends normally.
    assert _text(events).endswith("\n\nError: Upgrade your plan to continue.")
    assert events[-1]["data"]["status"] == "succeeded"


def test_an_offered_mode_is_set(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: hello", mode="ask")
    assert _of(events, "mode.changed")[0] == {"mode": "ask"}
    assert _of(events, "job.completed")[0]["status"] == "succeeded"


def test_a_mode_the_agent_does_not_offer_fails_the_job_before_set_mode(tmp_path: Path) -> None:
    """``code`` is a legacy alias the emulator would accept on ``session/set_mode``; it
    is not among the modes its ``session/new`` offers, so the job never sends it."""
    events = run_job(tmp_path, "scenario: hello", mode="code")
    [completed] = _of(events, "job.completed")
    assert completed["status"] == "failed"
    assert completed["error"]["code"] == "model_unavailable"
    assert completed["error"]["details"] == {"mode": "code", "available": ["agent", "plan", "ask"]}
    assert "agent, plan, ask" in completed["error"]["message"]
    assert _of(events, "mode.changed") == []
    assert _of(events, "message.delta") == []
