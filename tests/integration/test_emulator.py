"""Wire behaviour of the Cursor emulator pack, driven as a real subprocess.

The emulator is what integration tests treat as "Cursor", so these tests pin the quirks
from docs/CURSOR_ACP_FACTS.md that the worker must cope with.
"""

from __future__ import annotations

import hashlib
import json
import queue
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "provider_packs" / "cursor-emulator"
SCRIPT = PACK / "src" / "cursor_emulator.py"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
ARGS = ["--disable-project-configs", "--disable-auto-update", "acp"]
TIMEOUT = 5.0

pytestmark = pytest.mark.timeout(30)


class Emulator:
    """A running emulator with a reader thread; every stdout line is kept in order."""

    def __init__(
        self,
        cwd: Path,
        *,
        api_key: bool = True,
        extra_env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(cwd / ".home"),
            "CURSOR_EMULATOR_COMMANDS_DELAY": "0.01",
            "CURSOR_EMULATOR_CHUNK_DELAY": "0",
        }
        if api_key:
            env["CURSOR_API_KEY"] = "test-key"
        env.update(extra_env or {})
        self.cwd = cwd
        self.proc = subprocess.Popen(
            [PYTHON, str(SCRIPT), *(ARGS if args is None else args)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._next_id = 100
        self.stderr = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj: Any) -> None:
        self.send_raw(json.dumps(obj).encode())

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> int:
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        return self._next_id

    def next_message(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise EOFError("emulator closed stdout")
        msg = json.loads(line)
        self.seen.append(msg)
        return msg

    def until_response(
        self, rid: int, timeout: float = TIMEOUT
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Messages up to and including the response to `rid`."""
        before: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.next_message(max(0.01, deadline - time.monotonic()))
            if msg.get("id") == rid and "method" not in msg:
                return msg, before
            before.append(msg)

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        msg, _ = self.until_response(self.request(method, params))
        return msg

    def until(
        self, predicate: Any, timeout: float = TIMEOUT
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        before: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.next_message(max(0.01, deadline - time.monotonic()))
            if predicate(msg):
                return msg, before
            before.append(msg)

    def reply(self, msg: dict[str, Any], result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    def start_session(self, init_caps: dict[str, Any] | None = None) -> str:
        init = self.call(
            "initialize", {"protocolVersion": 1, "clientCapabilities": init_caps or {}}
        )
        assert "result" in init
        new = self.call("session/new", {"cwd": str(self.cwd), "mcpServers": []})
        sid = new["result"]["sessionId"]
        # Drain the delayed available_commands_update so tests see only their own traffic.
        self.until(
            lambda m: (
                m.get("params", {}).get("update", {}).get("sessionUpdate")
                == "available_commands_update"
            )
        )
        return sid

    def prompt(self, sid: str, text: str) -> int:
        return self.request(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        )

    def close(self) -> int:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stderr is not None
        if not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        self._reader.join(timeout=TIMEOUT)
        return self.proc.returncode


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def emu(workspace: Path) -> Iterator[Emulator]:
    e = Emulator(workspace)
    yield e
    e.close()


def updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    return [u["sessionUpdate"] for u in updates(messages)]


def collapse(seq: list[str]) -> list[str]:
    out: list[str] = []
    for item in seq:
        if not out or out[-1] != item:
            out.append(item)
    return out


def drain(emu: Emulator) -> None:
    while True:
        emu.next_message()


def is_request(msg: dict[str, Any]) -> bool:
    return "method" in msg and "id" in msg


# --- launch and handshake -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["acp"],
        ["--disable-auto-update", "--disable-project-configs", "acp"],
        [*ARGS, "--force"],
    ],
)
def test_refuses_unexpected_arguments(workspace: Path, args: list[str]) -> None:
    e = Emulator(workspace, args=args)
    e.proc.wait(timeout=TIMEOUT)
    assert e.close() == 2
    assert b"--disable-project-configs --disable-auto-update acp" in e.stderr
    assert e.lines.get(timeout=TIMEOUT) is None  # nothing at all on stdout


def test_initialize_result_is_exactly_cursors(emu: Emulator) -> None:
    msg = emu.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert msg["result"] == {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "mcpCapabilities": {"http": True, "sse": True},
            "promptCapabilities": {"audio": False, "embeddedContext": False, "image": True},
            "sessionCapabilities": {"list": {}},
        },
        "authMethods": [
            {
                "id": "cursor_login",
                "name": "Cursor Login",
                "description": "Authenticate using existing Cursor login credentials. "
                "Run 'agent login' first if not logged in.",
            }
        ],
    }


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        ({"_meta": {"subagents": True}}, True),
        ({"_meta": {"subagents": {}}}, True),  # {} is truthy in JS, and was seen on the wire
        ({"_meta": {"subagents": False}}, False),
        ({"subagents": True}, False),
    ],
)
def test_subagents_capability_only_from_meta(
    emu: Emulator, caps: dict[str, Any], expected: bool
) -> None:
    msg = emu.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    has = "subagents" in msg["result"]["agentCapabilities"]["sessionCapabilities"]
    assert has is expected


# --- sessions -------------------------------------------------------------------------------


def test_session_new_without_credentials_is_auth_required(workspace: Path) -> None:
    e = Emulator(workspace, api_key=False)
    try:
        e.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        msg = e.call("session/new", {"cwd": str(workspace), "mcpServers": []})
        assert msg["error"] == {"code": -32000, "message": "Authentication required"}
        assert e.call("session/list", {})["error"]["code"] == -32000
        # fork/resume still say method-not-found when unauthenticated (docs/CURSOR_ACP_FACTS.md §1).
        assert e.call("session/resume", {})["error"]["code"] == -32601
    finally:
        e.close()


def test_auth_token_also_authenticates(workspace: Path) -> None:
    e = Emulator(workspace, api_key=False, extra_env={"CURSOR_AUTH_TOKEN": "tok"})
    try:
        assert uuid.UUID(e.start_session()).version == 4
    finally:
        e.close()


def test_session_new_shape_then_commands_pushed(emu: Emulator) -> None:
    emu.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    msg = emu.call("session/new", {"cwd": str(emu.cwd), "mcpServers": []})
    result = msg["result"]
    assert set(result) == {"sessionId", "modes", "models", "configOptions"}
    assert uuid.UUID(result["sessionId"]).version == 4
    assert result["modes"]["currentModeId"] == "agent"
    assert [m["id"] for m in result["modes"]["availableModes"]] == ["agent", "plan", "ask"]
    models = result["models"]
    assert models["currentModelId"] == "default[]"
    assert models["availableModels"][0] == {"modelId": "default[]", "name": "Auto"}
    assert any("[" in m["modelId"] and "=" in m["modelId"] for m in models["availableModels"][1:])
    assert [(o["id"], o["category"], o["type"]) for o in result["configOptions"]] == [
        ("mode", "mode", "select"),
        ("model", "model", "select"),
    ]
    pushed = emu.next_message()
    assert pushed["method"] == "session/update"
    assert pushed["params"]["sessionId"] == result["sessionId"]
    assert pushed["params"]["update"]["sessionUpdate"] == "available_commands_update"
    assert {"name", "description"} <= set(pushed["params"]["update"]["availableCommands"][0])


@pytest.mark.parametrize("method", ["session/fork", "session/resume", "session/close", "bogus/x"])
def test_unsupported_methods_are_method_not_found(emu: Emulator, method: str) -> None:
    emu.start_session()
    msg = emu.call(method, {"sessionId": "x"})
    assert msg["error"]["code"] == -32601
    assert msg["error"]["message"] == f'"Method not found": {method}'


def test_malformed_lines_get_no_reply_and_no_stderr(emu: Emulator) -> None:
    for bad in (b"not json", b'{"jsonrpc":', b"[1,2]", b"\xff\xfe", b"42", b"{}"):
        emu.send_raw(bad)
    rid = emu.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    # The very next line is the answer to the valid request: the junk got nothing.
    assert emu.next_message()["id"] == rid
    assert emu.close() == 0
    assert emu.stderr == b""


def test_set_mode_emits_update_before_result(emu: Emulator) -> None:
    sid = emu.start_session()
    msg, before = emu.until_response(
        emu.request("session/set_mode", {"sessionId": sid, "modeId": "plan"})
    )
    assert msg["result"] == {}
    assert updates(before) == [{"sessionUpdate": "current_mode_update", "currentModeId": "plan"}]
    bad = emu.call("session/set_mode", {"sessionId": sid, "modeId": "yolo"})
    assert bad["error"] == {
        "code": -32603,
        "message": "Internal error",
        "data": {"details": "Invalid mode ID: yolo. Valid modes: agent, plan, ask"},
    }


def test_config_options_and_models(emu: Emulator) -> None:
    sid = emu.start_session()
    luna = "gpt-5.6-luna[context=272k,reasoning=medium,fast=false]"
    msg = emu.call(
        "session/set_config_option", {"sessionId": sid, "configId": "model", "value": luna}
    )
    by_id = {o["id"]: o for o in msg["result"]["configOptions"]}
    assert by_id["model"]["currentValue"] == luna
    assert emu.call("session/set_model", {"sessionId": sid, "modelId": "default[]"})["result"] == {}
    # A composed id that is not listed is rejected, though each parameter is valid.
    bad = emu.call("session/set_model", {"sessionId": sid, "modelId": "gpt-5.6-luna[context=1m]"})
    assert bad["error"]["code"] == -32602
    assert bad["error"]["data"]["message"] == "Invalid model value: gpt-5.6-luna[context=1m]"


def test_parameterized_picker_uses_base_ids(emu: Emulator) -> None:
    emu.start_session({"_meta": {"parameterizedModelPicker": True}})
    new = emu.call("session/new", {"cwd": str(emu.cwd), "mcpServers": []})["result"]
    assert new["models"]["currentModelId"] == "default"
    sid = new["sessionId"]
    msg = emu.call(
        "session/set_config_option", {"sessionId": sid, "configId": "model", "value": "grok-4.6"}
    )
    opts = {o["id"]: o for o in msg["result"]["configOptions"]}
    assert opts["fast"]["currentValue"] == "true"
    assert opts["effort"]["category"] == "thought_level"
    msg = emu.call(
        "session/set_config_option", {"sessionId": sid, "configId": "fast", "value": "false"}
    )
    assert {o["id"]: o for o in msg["result"]["configOptions"]}["fast"]["currentValue"] == "false"


# --- prompts and scenarios ------------------------------------------------------------------


def test_hello_scenario_update_sequence(emu: Emulator) -> None:
    sid = emu.start_session()
    msg, before = emu.until_response(emu.prompt(sid, "scenario: hello"))
    assert msg["result"] == {"stopReason": "end_turn"}
    assert all(m["params"]["sessionId"] == sid for m in before)
    assert collapse(kinds(before)) == [
        "session_info_update",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "agent_message_chunk",
    ]
    ups = updates(before)
    assert ups[0]["title"]
    chunks = [u["content"]["text"] for u in ups if u["sessionUpdate"] == "agent_message_chunk"]
    assert len(chunks) > 3  # token-ish streaming, not one blob
    assert "".join(chunks).startswith("Hello!")
    tool = next(u for u in ups if u["sessionUpdate"] == "tool_call")
    assert (tool["status"], tool["kind"]) == ("pending", "read")
    assert tool["locations"][0]["path"] == "README.md"
    statuses = [u["status"] for u in ups if u["sessionUpdate"] == "tool_call_update"]
    assert statuses == ["in_progress", "completed"]
    assert "\n" in tool["toolCallId"]
    assert not any(k in ("usage_update", "user_message_chunk") for k in kinds(before))


def test_default_scenario_echoes_prompt(emu: Emulator) -> None:
    sid = emu.start_session()
    msg, before = emu.until_response(emu.prompt(sid, "make it blue"))
    assert msg["result"] == {"stopReason": "end_turn"}
    text = "".join(
        u["content"]["text"] for u in updates(before) if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert "make it blue" in text


def test_tour_requests_have_ids_from_zero_and_no_session_id(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, "scenario: tour")
    requests: list[dict[str, Any]] = []
    answers = {
        "cursor/ask_question": {
            "outcome": {
                "outcome": "answered",
                "answers": [{"questionId": "colour", "selectedOptionIds": ["blue"]}],
            }
        },
        "cursor/create_plan": {"outcome": {"outcome": "accepted"}},
        "session/request_permission": {
            "outcome": {"outcome": "selected", "optionId": "reject-once"}
        },
    }
    while True:
        msg = emu.next_message()
        if msg.get("id") == rid and "method" not in msg:
            break
        if is_request(msg):
            requests.append(msg)
            emu.reply(msg, answers.get(msg["method"], {}))
    assert msg["result"] == {"stopReason": "end_turn"}
    assert [r["id"] for r in requests] == list(range(len(requests)))
    assert [r["method"] for r in requests] == [
        "cursor/ask_question",
        "cursor/create_plan",
        "cursor/update_todos",
        "session/request_permission",
        "cursor/task",
        "cursor/generate_image",
    ]
    for r in requests:
        if r["method"].startswith("cursor/"):
            assert "sessionId" not in r["params"]
            assert "\n" in r["params"]["toolCallId"]
    perm = requests[3]["params"]
    assert perm["sessionId"] == sid
    assert [o["optionId"] for o in perm["options"]] == ["allow-once", "allow-always", "reject-once"]
    ups = updates(emu.seen)
    text = "".join(u["content"]["text"] for u in ups if u["sessionUpdate"] == "agent_message_chunk")
    assert "You picked: blue." in text
    assert "Plan outcome: accepted." in text
    assert "Permission outcome: reject-once." in text
    assert any(u["sessionUpdate"] == "plan" for u in ups)
    diffs = [
        c
        for u in ups
        if u["sessionUpdate"] == "tool_call_update"
        for c in u.get("content") or []
        if c.get("type") == "diff"
    ]
    assert diffs
    assert {"path", "oldText", "newText"} <= set(diffs[0])


def test_non_blocking_extension_requests_do_not_wait(emu: Emulator) -> None:
    sid = emu.start_session()
    script = '#!scenario\nupdate-todos\ntask {"description": "d"}\ngenerate-image\nsay done'
    msg, before = emu.until_response(emu.prompt(sid, script))  # never answered
    assert msg["result"] == {"stopReason": "end_turn"}
    assert [m["method"] for m in before if is_request(m)] == [
        "cursor/update_todos",
        "cursor/task",
        "cursor/generate_image",
    ]


def test_create_plan_method_not_found_is_auto_accepted(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, '#!scenario\ncreate-plan {"name": "X"}\nsay plan={{plan}}')
    req, _ = emu.until(is_request)
    emu.send(
        {
            "jsonrpc": "2.0",
            "id": req["id"],
            "error": {"code": -32601, "message": "Method not found"},
        }
    )
    msg, before = emu.until_response(rid)
    assert msg["result"] == {"stopReason": "end_turn"}
    texts = [
        c["content"]["text"]
        for u in updates(before)
        for c in u.get("content") or []
        if isinstance(c, dict) and c.get("type") == "content"
    ]
    assert any(t.startswith("Plan saved to file:///~/.cursor/plans/x-") for t in texts)
    assert "plan=accepted" in "".join(
        u["content"]["text"] for u in updates(before) if u["sessionUpdate"] == "agent_message_chunk"
    )


def test_cancel_returns_cancelled_quickly(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, "scenario: hang")
    emu.until(
        lambda m: (
            m.get("params", {}).get("update", {}).get("sessionUpdate") == "agent_message_chunk"
        )
    )
    time.sleep(0.05)
    started = time.monotonic()
    emu.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
    msg, _ = emu.until_response(rid)
    assert msg["result"] == {"stopReason": "cancelled"}
    assert time.monotonic() - started < 0.5


def test_cancel_abandons_pending_permission(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, "#!scenario\npermission\nsay never")
    emu.until(is_request)
    emu.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
    msg, before = emu.until_response(rid)
    assert msg["result"] == {"stopReason": "cancelled"}
    assert "agent_message_chunk" not in kinds(before)


def test_second_prompt_cancels_first(emu: Emulator) -> None:
    sid = emu.start_session()
    first = emu.prompt(sid, "scenario: hang")
    emu.until(
        lambda m: (
            m.get("params", {}).get("update", {}).get("sessionUpdate") == "agent_message_chunk"
        )
    )
    second = emu.prompt(sid, "#!scenario\nsay second turn")
    msg, _ = emu.until_response(first)
    assert msg["result"] == {"stopReason": "cancelled"}
    msg, before = emu.until_response(second)
    assert msg["result"] == {"stopReason": "end_turn"}
    assert "second" in "".join(
        u["content"]["text"] for u in updates(before) if u["sessionUpdate"] == "agent_message_chunk"
    )


def test_exec_reports_raw_output_and_uses_dev_null_stdin(emu: Emulator) -> None:
    sid = emu.start_session()
    msg, before = emu.until_response(
        emu.prompt(
            sid, "#!scenario\nexec cat; echo out; echo err >&2; exit 3\nsay code={{exitCode}}"
        )
    )
    assert msg["result"] == {"stopReason": "end_turn"}
    done = [u for u in updates(before) if u.get("status") == "completed"]
    assert done[-1]["rawOutput"] == {"exitCode": 3, "stdout": "out\n", "stderr": "err\n"}
    start = next(u for u in updates(before) if u["sessionUpdate"] == "tool_call")
    assert start["kind"] == "execute"
    assert start["title"].startswith("`cat;")


def test_exec_gated_rejection_completes_bare(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, "#!scenario\nexec-gated touch gated.txt")
    req, _ = emu.until(is_request)
    assert req["method"] == "session/request_permission"
    assert req["params"]["toolCall"]["content"][0]["content"]["text"] == "Not in allowlist: touch"
    emu.reply(req, {"outcome": {"outcome": "cancelled"}})
    msg, before = emu.until_response(rid)
    assert msg["result"] == {"stopReason": "end_turn"}
    last = updates(before)[-1]
    assert last == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": req["params"]["toolCall"]["toolCallId"],
        "status": "completed",
    }
    assert not (emu.cwd / "gated.txt").exists()


def test_write_verb_writes_and_reports_diff(emu: Emulator) -> None:
    (emu.cwd / "a.txt").write_text("old\n")
    sid = emu.start_session()
    msg, before = emu.until_response(emu.prompt(sid, '#!scenario\nwrite a.txt "new\\n"'))
    assert msg["result"] == {"stopReason": "end_turn"}
    assert (emu.cwd / "a.txt").read_text() == "new\n"
    diff = updates(before)[-1]["content"][0]
    assert (diff["type"], diff["oldText"], diff["newText"]) == ("diff", "old\n", "new\n")


def test_stop_error_text_raw_update_and_garbage(emu: Emulator) -> None:
    sid = emu.start_session()
    script = (
        "#!scenario\nerror-text quota exceeded\ngarbage not-json\n"
        'update {"sessionUpdate": "mystery_kind", "extra": 1}\nstop max_tokens\nsay never'
    )
    rid = emu.prompt(sid, script)
    seen: list[bytes] = []
    while True:
        line = emu.lines.get(timeout=TIMEOUT)
        assert line is not None
        seen.append(line)
        if line.startswith(b'{"jsonrpc":"2.0","id":%d' % rid):
            break
    assert b"not-json\n" in seen
    parsed = [json.loads(x) for x in seen if x != b"not-json\n"]
    ups = updates(parsed)
    assert {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "\n\nError: quota exceeded"},
    } in ups
    assert {"sessionUpdate": "mystery_kind", "extra": 1} in ups
    assert parsed[-1]["result"] == {"stopReason": "max_tokens"}


def test_bigline_is_one_valid_line_of_the_requested_size(emu: Emulator) -> None:
    sid = emu.start_session()
    rid = emu.prompt(sid, "#!scenario\nbigline 300000")
    line = emu.lines.get(timeout=TIMEOUT)
    while line is not None and len(line) < 1000:
        line = emu.lines.get(timeout=TIMEOUT)  # skip the title update
    assert line is not None
    assert len(line) == 300001  # plus the newline
    assert json.loads(line)["method"] == "session/update"
    emu.until_response(rid)


def test_inline_script_parse_error_is_error_text(emu: Emulator) -> None:
    sid = emu.start_session()
    msg, before = emu.until_response(emu.prompt(sid, "#!scenario\nfly away"))
    assert msg["result"] == {"stopReason": "end_turn"}
    text = "".join(
        u["content"]["text"] for u in updates(before) if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert text.startswith("\n\nError: Scenario error: line 1: unknown verb 'fly'")


def test_crash_exits_mid_turn_with_code(emu: Emulator) -> None:
    sid = emu.start_session()
    emu.prompt(sid, "scenario: crash")
    with pytest.raises(EOFError):
        drain(emu)
    assert emu.close() == 3
    assert not any("result" in m and "stopReason" in (m["result"] or {}) for m in emu.seen)


def test_subagents_stream_on_child_session(workspace: Path) -> None:
    e = Emulator(workspace)
    try:
        sid = e.start_session({"_meta": {"subagents": True}})
        msg, before = e.until_response(e.prompt(sid, '#!scenario\ntask {"childText": "hi"}'))
        assert msg["result"] == {"stopReason": "end_turn"}
        spawned = next(u for u in updates(before) if u["sessionUpdate"] == "subagent_spawned")
        child = spawned["subagentSessionId"]
        assert spawned["_meta"]["cursor"]["agentId"] == child
        assert any(m["params"]["sessionId"] == child for m in before if "params" in m)
        assert any(
            u["sessionUpdate"] == "subagent_state_update" and u["state"] == "completed"
            for u in updates(before)
        )
    finally:
        e.close()


# --- history ---------------------------------------------------------------------------------


def test_load_replays_history_before_result_and_list(emu: Emulator) -> None:
    sid = emu.start_session()
    unprompted = emu.call("session/new", {"cwd": str(emu.cwd), "mcpServers": []})
    emu.until_response(emu.prompt(sid, "scenario: hello"))
    assert (
        emu.call(
            "session/load",
            {"sessionId": unprompted["result"]["sessionId"], "cwd": str(emu.cwd), "mcpServers": []},
        )["error"]["code"]
        == -32602
    )
    listed = emu.call("session/list", {})["result"]["sessions"]
    assert [s["sessionId"] for s in listed] == [sid]
    msg, before = emu.until_response(
        emu.request("session/load", {"sessionId": sid, "cwd": str(emu.cwd), "mcpServers": []})
    )
    assert set(msg["result"]) == {"modes", "models", "configOptions"}
    ks = kinds(before)
    assert ks[0] == "user_message_chunk"
    assert ks.count("agent_thought_chunk") == 1  # coalesced
    tool = next(u for u in updates(before) if u["sessionUpdate"] == "tool_call")
    assert tool["toolCallId"] == "replay-0-0"
    missing = emu.call("session/load", {"sessionId": "nope", "cwd": "/", "mcpServers": []})
    assert missing["error"] == {
        "code": -32602,
        "message": "Invalid params",
        "data": {"message": 'Session "nope" not found'},
    }


def test_history_survives_process_restart(workspace: Path) -> None:
    first = Emulator(workspace)
    try:
        sid = first.start_session()
        first.until_response(first.prompt(sid, "hello there"))
    finally:
        first.close()
    second = Emulator(workspace)
    try:
        second.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert [s["sessionId"] for s in second.call("session/list", {})["result"]["sessions"]] == [
            sid
        ]
        msg, before = second.until_response(
            second.request(
                "session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}
            )
        )
        assert "result" in msg
        assert "user_message_chunk" in kinds(before)
    finally:
        second.close()


# --- ambient config, process lifetime ------------------------------------------------------


MARKER = ".cursor-emulator-hook-ran"


def test_hooks_file_is_executed(workspace: Path) -> None:
    (workspace / ".cursor").mkdir()
    (workspace / ".cursor" / "hooks.json").write_text("{}")
    e = Emulator(workspace)
    try:
        sid = e.start_session()
        assert (workspace / MARKER).read_text() == ".cursor/hooks.json\n"
        e.until_response(e.prompt(sid, "#!scenario\nload-config"))
        # Once for session/new, once at the prompt, once for the verb.
        assert (workspace / MARKER).read_text().count(".cursor/hooks.json") == 3
    finally:
        e.close()


def test_no_marker_without_executable_config(workspace: Path) -> None:
    (workspace / ".claude").mkdir()
    (workspace / ".claude" / "settings.json").write_text('{"permissions": {}}')
    e = Emulator(workspace)
    try:
        sid = e.start_session()
        e.until_response(e.prompt(sid, "hi"))
        assert not (workspace / MARKER).exists()
        (workspace / ".claude" / "settings.local.json").write_text('{"hooks": {}}')
        e.until_response(e.prompt(sid, "hi"))
        assert (workspace / MARKER).read_text() == ".claude/settings.local.json\n"
    finally:
        e.close()


def test_exit_on_eof_and_exit_delay(workspace: Path) -> None:
    e = Emulator(workspace, extra_env={"CURSOR_EMULATOR_EXIT_DELAY": "0.3"})
    assert e.proc.stdin is not None
    e.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    started = time.monotonic()
    e.proc.stdin.close()
    assert e.proc.wait(timeout=TIMEOUT) == 0
    assert time.monotonic() - started >= 0.25
    e.close()


def test_ignore_sigterm_verb(emu: Emulator) -> None:
    sid = emu.start_session()
    emu.until_response(emu.prompt(sid, "#!scenario\nignore-sigterm"))
    emu.proc.terminate()
    with pytest.raises(subprocess.TimeoutExpired):
        emu.proc.wait(timeout=0.3)
    assert emu.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})["result"]


def test_sigterm_kills_by_default(emu: Emulator) -> None:
    emu.start_session()
    emu.proc.terminate()
    assert emu.proc.wait(timeout=TIMEOUT) == -15


# --- build -----------------------------------------------------------------------------------


def test_build_is_byte_deterministic(tmp_path: Path) -> None:
    digests = []
    for python, out in ((sys.executable, tmp_path / "a"), (PYTHON, tmp_path / "b")):
        res = subprocess.run(
            [python, str(PACK / "build.py"), "--out", str(out)],
            capture_output=True,
            check=True,
            timeout=30,
        )
        archive = out / "cursor-emulator-linux.tar"
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        assert res.stdout.decode().split() == [digest, str(archive)]
        digests.append(digest)
    assert digests[0] == digests[1]
    with tarfile.open(tmp_path / "a" / "cursor-emulator-linux.tar") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert "cursor_emulator.py" in names
    assert "scenarios/hello.scn" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        want = 0o755 if m.isdir() or m.name == "cursor_emulator.py" else 0o644
        assert m.mode == want, m.name


def test_back_to_back_prompts_cancel_in_arrival_order(emu: Emulator) -> None:
    sid = emu.start_session()
    first = emu.prompt(sid, "scenario: hang")
    second = emu.prompt(sid, "#!scenario\nsay second")  # sent before the first streams
    msg, _ = emu.until_response(first)
    assert msg["result"] == {"stopReason": "cancelled"}
    msg, _ = emu.until_response(second)
    assert msg["result"] == {"stopReason": "end_turn"}
