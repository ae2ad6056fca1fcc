"""What real agents send, mapped: the updates in ``fixtures/real_tool_updates.json``.

Captured from codex-acp 2.6.0 and claude-agent-acp running a shell command against the
fake model APIs (``ACPW_RECORD_UPDATES=DIR pytest
tests/integration/test_real_agents_fake_models.py -k test_shell``), once as the worker's
client declares itself and once with ``_meta.terminal_output: true`` declared (Zed's
convention, which makes both agents stream the command output through terminal
``_meta``); pytest's temporary workspace path was replaced by ``/workspace``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.events.normalizer import Normalizer
from worker.rpc.oversize import describe

_SHAPES: dict[str, list[dict[str, Any]]] = json.loads(
    (Path(__file__).parent / "fixtures" / "real_tool_updates.json").read_text()
)
_OUT = "fake-shell-42"


def _events(updates: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    n = Normalizer(workspace_root="/workspace", text_limit=1024)
    n.bind("s1")
    return [
        (event.TYPE, event.wire())
        for update in updates
        for event in n.session_update({"sessionId": "s1", "update": update})
    ]


def _tool_events(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for type_, data in events if type_ in {"tool.updated", "tool.completed"}]


def _outputs(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [data["output"]["text"] for data in _tool_events(events) if "output" in data]


def _unmapped(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for type_, data in events if type_ == "provider.unmapped"]


@pytest.mark.parametrize(
    "shape",
    ["codex-acp shell", "codex-acp shell, client declares _meta.terminal_output"],
)
def test_codex_terminal_meta_output_becomes_tool_output(shape: str) -> None:
    events = _events(_SHAPES[shape])
    [completed] = [data for type_, data in events if type_ == "tool.completed"]
    assert completed["output"] == {"text": _OUT + "\n", "truncated": False, "bytes": 14}
    assert completed["exit_code"] == 0
    # Every key of the update's _meta was mapped: nothing of it is reported unmapped.
    assert [u["kind"] for u in _unmapped(events)] == ["tool_call"]


def test_codex_tool_call_meta_still_reported() -> None:
    """The ``tool_call``'s own extras (``terminal_info``, ``name``, a ``terminal``
    content block) are not mapped by this change and stay ``provider.unmapped``."""
    [unmapped] = _unmapped(_events(_SHAPES["codex-acp shell"]))
    assert unmapped["partial"] is True
    assert set(json.loads(unmapped["raw"]["text"])) == {"_meta", "content", "name"}


def test_message_id_on_chunks_is_known() -> None:
    for shape in ("codex-acp shell", "claude-agent-acp shell"):
        chunks = [u for u in _SHAPES[shape] if u["sessionUpdate"] == "agent_message_chunk"]
        assert chunks
        assert all("messageId" in u for u in chunks)
        events = _events(chunks)
        assert {type_ for type_, _ in events} == {"message.delta"}


def test_claude_output_shown_once_when_sent_both_ways() -> None:
    """claude-agent-acp streams the output in ``_meta.terminal_output``, then completes
    the tool with the same text as ``rawOutput``: it is shown once."""
    events = _events(_SHAPES["claude-agent-acp shell, client declares _meta.terminal_output"])
    assert _outputs(events) == [_OUT]
    [completed] = [data for type_, data in events if type_ == "tool.completed"]
    assert "output" not in completed
    assert completed["exit_code"] == 0
    # claudeCode's own _meta stays reported; the terminal keys do not.
    reported = " ".join(u["raw"]["text"] for u in _unmapped(events))
    assert "claudeCode" in reported
    assert "terminal_output" not in reported
    assert "terminal_exit" not in reported


def test_claude_content_output_unchanged() -> None:
    """Without terminal ``_meta`` the output is the content text, as before."""
    events = _events(_SHAPES["claude-agent-acp shell"])
    assert _outputs(events)[-1] == f"```console\n{_OUT}\n```"


def _tool_update(**fields: Any) -> dict[str, Any]:
    return {"sessionUpdate": "tool_call_update", "toolCallId": "t1", **fields}


def test_terminal_output_deltas_are_chunks_and_bounded() -> None:
    n = Normalizer(workspace_root="/workspace", text_limit=8)
    datas = []
    for update in (
        _tool_update(status="in_progress", _meta={"terminal_output_delta": {"data": "ab"}}),
        _tool_update(_meta={"terminal_output_delta": {"data": "0123456789"}}),
        _tool_update(status="completed", rawOutput={"exit_code": 3}),
    ):
        datas += [e.wire() for e in n.session_update({"sessionId": "s", "update": update})]
    assert [d.get("output") for d in datas] == [
        {"text": "ab", "truncated": False, "bytes": 2},
        {"text": "01234567", "truncated": True, "bytes": 10},
        None,  # the rawOutput is not output once the terminal streamed it
    ]
    assert datas[-1]["exit_code"] == 3


@pytest.mark.parametrize(
    ("raw_output", "meta", "code"),
    [
        ({"exitCode": 1}, None, 1),
        ({"exit_code": 2}, None, 2),
        ({"exit_code": True}, None, None),
        (None, {"terminal_exit": {"exit_code": 4, "signal": None}}, 4),
        ({"exit_code": 5}, {"terminal_exit": {"exit_code": 6, "signal": None}}, 5),
        (None, {"terminal_exit": {"exit_code": None, "signal": None}}, None),
    ],
)
def test_exit_code_spellings(raw_output: Any, meta: Any, code: int | None) -> None:
    fields: dict[str, Any] = {"status": "completed"}
    if raw_output is not None:
        fields["rawOutput"] = raw_output
    if meta is not None:
        fields["_meta"] = meta
    [event] = _events([_tool_update(**fields)])
    assert event[1].get("exit_code") == code


def test_unmapped_meta_keys_are_kept() -> None:
    meta = {
        "terminal_output_delta": {"data": "x"},
        "terminal_output": {"data": "y"},  # a second output key: kept, not shown twice
        "terminal_exit": {"exit_code": None, "signal": "SIGKILL"},
        "terminal_info": {"cwd": "/workspace", "terminal_id": "t1"},
    }
    events = _events([_tool_update(status="failed", _meta=meta)])
    assert _outputs(events) == ["x"]
    [unmapped] = _unmapped(events)
    assert unmapped["partial"] is True
    assert json.loads(unmapped["raw"]["text"]) == {
        "_meta": {key: meta[key] for key in ("terminal_output", "terminal_exit", "terminal_info")}
    }
    [odd] = _unmapped(_events([_tool_update(_meta="odd")]))
    assert json.loads(odd["raw"]["text"]) == {"_meta": "odd"}


def test_oversize_line_previews_terminal_output() -> None:
    update = _tool_update(
        status="completed", _meta={"terminal_output_delta": {"data": "z" * 40_000}}
    )
    line = json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s1", "update": update},
        }
    ).encode()
    described = describe(line[:16_384], size=len(line), limit=16_000, complete=True)
    assert described.output_preview is not None
    assert set(described.output_preview) == {"z"}
    n = Normalizer(workspace_root="/workspace", text_limit=1024)
    [event] = n.oversize_update(described)
    assert event.TYPE == "tool.completed"
    assert event.wire()["output"]["truncated"] is True


def _oversize_line(update: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s1", "update": update},
        }
    ).encode()


def test_an_oversize_cursor_shell_update_keeps_the_stdout_its_first_bytes_held() -> None:
    """Cursor's shell puts its output in ``rawOutput`` ``{exitCode, stdout, stderr}``
    (CURSOR_ACP_FACTS.md, Tools): an update too large to read keeps, as its output, the
    start of that ``rawOutput`` as a whole update's output would show it (JSON), as far as
    the line's first 16 KiB reach; never an empty text."""
    stdout = "total 42\n" + 'drwxr-xr-x 2 root root 4096 café "q" \x1b[0m\n' * 400_000
    raw = {"exitCode": 0, "stdout": stdout, "stderr": ""}
    update = _tool_update(status="completed", rawOutput=raw)
    line = _oversize_line(update)
    described = describe(line[:16_384], size=len(line), limit=8 * 1024 * 1024, complete=True)
    n = Normalizer(workspace_root="/workspace", text_limit=16_384)
    n.bind("s1")
    [event] = n.oversize_update(described)
    assert event.TYPE == "tool.completed"
    output = event.wire()["output"]
    assert (output["truncated"], output["bytes"]) == (True, -1)
    whole = json.dumps(raw, ensure_ascii=False)  # what a whole update's output shows
    assert whole.startswith(output["text"])
    assert output["text"].startswith('{"exitCode": 0, "stdout": "total 42\\ndrwxr-xr-x')
    assert 15_000 < len(output["text"].encode()) <= 16_384  # the text those bytes held


def test_an_oversize_update_shows_no_raw_output_a_terminal_output_repeats() -> None:
    """A tool whose output came through terminal ``_meta`` shows its ``rawOutput`` in
    no whole update (claude-agent-acp repeats the output there); nor in an oversize one."""
    n = Normalizer(workspace_root="/workspace", text_limit=16_384)
    n.bind("s1")
    meta = {"terminal_output": {"terminal_id": "t", "data": "x"}}
    n.session_update({"sessionId": "s1", "update": _tool_update(status="in_progress", _meta=meta)})
    line = _oversize_line(_tool_update(status="completed", rawOutput={"output": "x" * 40_000}))
    described = describe(line[:16_384], size=len(line), limit=8 * 1024 * 1024, complete=True)
    [event] = n.oversize_update(described)
    assert event.wire()["output"] == {"text": "", "truncated": True, "bytes": -1}
