"""Image and link prompts, and what tools return, through the worker with the Cursor
emulator (real bubblewrap): blocks sent only when the agent advertises them, links only
to staged workspace files, tool media kept, reported failures ending tools failed,
background delegations closed at job end."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cursor_jobs import check_golden, run_job
from tests.integration.docker_engine import base_image, docker_host, engine_config, job_backend
from tests.integration.test_emulator import Emulator
from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job

__all__ = ["base_image", "docker_host", "engine_config", "job_backend"]

Events = list[dict[str, Any]]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def _of(events: Events, type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _said(events: Events) -> str:
    return "".join(d["text"] for d in _of(events, "message.delta") if d["role"] == "assistant")


def _blocks(script: str, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "#!scenario\n" + script}, *extra]


def _image(raw: bytes = PNG) -> dict[str, Any]:
    return {"type": "image", "mimeType": "image/png", "data": base64.b64encode(raw).decode()}


def test_images_and_links_reach_the_agent(tmp_path: Path, job_backend: dict[str, str]) -> None:
    """On every backend: a linked file is checked through the sandbox's own files."""
    (tmp_path / "ws" / "docs").mkdir(parents=True)
    (tmp_path / "ws" / "docs" / "my notes.md").write_text("notes\n")
    link = {"type": "resource_link", "uri": "docs/my notes.md", "name": "notes"}
    events = run_job(tmp_path, _blocks("say {{blocks}}", _image(), link), env=job_backend)
    assert events[-1]["data"]["status"] == "succeeded"
    assert json.loads(_said(events)) == [
        {"type": "image", "mimeType": "image/png", "bytes": len(PNG)},
        {"type": "resource_link", "uri": "file:///workspace/docs/my%20notes.md", "text": "notes\n"},
    ]


def _packs_without_images(dest: Path) -> Path:
    """A packs folder whose emulator advertises ``promptCapabilities.image: false``."""
    packs = dest / "packs"
    shutil.copytree(
        REPO / "provider_packs" / "cursor-emulator",
        packs / "cursor-emulator",
        ignore=shutil.ignore_patterns("src"),
    )
    path = packs / "cursor-emulator" / "pack.json"
    data = json.loads(path.read_text())
    data["launch"]["env"]["CURSOR_EMULATOR_PROMPT_CAPABILITIES"] = json.dumps({"image": False})
    path.write_text(json.dumps(data))
    return packs


def _run(tmp_path: Path, prompt: Any, env: dict[str, str]) -> tuple[int, Events]:
    job = _job(tmp_path, prompt)
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    events = _events(result.stdout)
    _check_stream(events)
    return result.returncode, events


def test_an_image_is_refused_before_the_session_when_not_advertised(tmp_path: Path) -> None:
    env = _env(tmp_path, ACPW_PACKS_DIR=str(_packs_without_images(tmp_path)))
    code, events = _run(tmp_path, _blocks("say should never run", _image()), env)
    [init] = _of(events, "agent.initialized")
    assert init["agent_capabilities"]["promptCapabilities"]["image"] is False
    done = events[-1]["data"]
    assert (code, done["status"], done["error"]["code"]) == (1, "failed", "unsupported")
    details = done["error"]["details"]
    assert (details["capability"], details["block"]) == ("promptCapabilities.image", 1)
    assert _of(events, "session.started") == []  # failed before any session
    assert _said(events) == ""
    # The same pack takes a text-only prompt: the switch refuses images only.
    (tmp_path / "t").mkdir()
    text_code, text_events = _run(tmp_path / "t", "#!scenario\nsay fine", env)
    assert (text_code, _said(text_events)) == (0, "fine")


def test_a_link_that_leaves_the_workspace_is_refused_before_the_prompt(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "escape.md").symlink_to("/etc/hostname")
    link = {"type": "resource_link", "uri": "file:///workspace/escape.md", "name": "x"}
    events = run_job(tmp_path, _blocks("say should never run", link))
    done = events[-1]["data"]
    assert (done["status"], done["error"]["code"]) == ("failed", "prompt_refused")
    assert done["error"]["details"]["path"] == "escape.md"
    assert done["error"]["details"]["reason"] == "symlink"
    assert _of(events, "session.started")  # checked right before the prompt
    assert _of(events, "session.titled") == []  # the agent never got a prompt
    assert _said(events) == ""


def test_a_missing_linked_file_is_refused(tmp_path: Path) -> None:
    link = {"type": "resource_link", "uri": "nope.md", "name": "x"}
    done = run_job(tmp_path, _blocks("say no", link))[-1]["data"]
    assert done["error"]["code"] == "prompt_refused"
    assert done["error"]["details"] == {"block": 1, "path": "nope.md", "reason": "missing"}


def test_tool_content_and_failures_match_golden(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: tool-content", job_id="golden-tool-content")
    assert events[-1]["data"]["status"] == "succeeded"
    check_golden("tool-content", events, tmp_path)
    completed = _of(events, "tool.completed")
    media = completed[0]["content"]
    assert [m["type"] for m in media] == ["image", "resource_link", "resource", "audio"]
    assert media[0]["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert media[0]["bytes"] == len(PNG)
    [unmapped] = [u for u in _of(events, "provider.unmapped") if u["partial"]]
    assert "not base64 at all" in unmapped["raw"]["text"]  # kept, never dropped
    failures = [(t["status"], (t.get("failure") or {}).get("code")) for t in completed[1:]]
    assert failures == [
        ("failed", "error"),
        ("failed", "rejected"),
        ("failed", "permission_denied"),
        ("failed", "permission_denied"),  # the gated command the policy denied
    ]


def test_an_allowed_gated_command_completes(tmp_path: Path) -> None:
    events = run_job(tmp_path, "#!scenario\nexec-gated true", permissions={"policy": "allow_all"})
    [done] = _of(events, "tool.completed")
    assert (done["status"], "failure" in done) == ("completed", False)


def test_tool_media_over_the_budget_is_kept_by_reference(tmp_path: Path) -> None:
    big = PNG + bytes(64 * 1024)
    block = {"type": "content", "content": _image(big)}
    script = "tool " + json.dumps({"title": "Screenshot", "content": [block]})
    events = run_job(tmp_path, "#!scenario\n" + script)
    [done] = _of(events, "tool.completed")
    assert done["content"] == [
        {
            "type": "image",
            "inline": False,
            "mime_type": "image/png",
            "bytes": len(big),
            "sha256": hashlib.sha256(big).hexdigest(),
        }
    ]


def test_a_background_delegation_is_closed_at_job_end(tmp_path: Path) -> None:
    task = {
        "title": "Task: watch",
        "kind": "other",
        "rawInput": {"_toolName": "task", "prompt": "watch the logs", "description": "watch"},
        "rawOutput": {"durationMs": 5, "isBackground": True},
    }
    events = run_job(tmp_path, "#!scenario\ntool " + json.dumps(task))
    types = [e["type"] for e in events]
    closed = _of(events, "delegation.completed")
    assert [(d["state"], d["reason"], d["background"]) for d in closed] == [
        ("cancelled", "job_ended", True)
    ]
    assert types.index("delegation.completed") > types.index("tool.completed")
    assert events[-1]["data"]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("caps", "block", "accepted"),
    [
        ({}, _image(), True),
        ({"image": False}, _image(), False),
        ({}, {"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="}, False),
        ({"audio": True}, {"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="}, True),
    ],
)
def test_the_emulator_takes_only_what_it_advertises(
    tmp_path: Path, caps: dict[str, bool], block: dict[str, Any], accepted: bool
) -> None:
    emu = Emulator(tmp_path, extra_env={"CURSOR_EMULATOR_PROMPT_CAPABILITIES": json.dumps(caps)})
    try:
        sid = emu.start_session()
        reply = emu.call(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}, block]}
        )
    finally:
        emu.close()
    if accepted:
        assert reply["result"] == {"stopReason": "end_turn"}
    else:
        assert reply["error"]["code"] == -32602
        assert reply["error"]["data"][0]["path"] == ["1"]
