"""An agent process that writes lines over the 8 MiB bound, end to end through the
worker's own handlers (the connection, the turn's notice and tool-event wiring, the
normalizer, the emitter): each oversize line is skipped with a notice saying what was
lost, a tool update that large still closes its tool with its output cut to a preview,
an oversize request is answered -32600, and the turn settles on what follows.

A reply to a prompt the turn abandoned (after a cancel's grace) is a late reply: logged,
not a malformed-line notice.

The agent is a small peer script (a real process, its stdout a real pipe), not the
Cursor emulator, whose bytes are pinned.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.acp.agent import AgentProcess
from worker.acp.client import AcpClient, ClientCapabilities
from worker.events.emitter import EventEmitter
from worker.events.normalizer import Normalizer
from worker.events.sinks import JsonlSink
from worker.job.state import Made
from worker.job.turn import Turn
from worker.sandbox.fake import FakeProcess
from worker.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MIB = 1024 * 1024

# The agent: answers initialize and session/new, then during the prompt writes a 9 MiB
# tool_call_update (in 64 KiB writes), a 9 MiB cursor/ask_question request, waits for
# the worker's answer to it and reports the code it got, a chunk, and its stop reason.
PEER = textwrap.dedent(
    """
    import json, sys

    out = sys.stdout.buffer

    def send(obj):
        out.write(json.dumps(obj).encode() + b"\\n")
        out.flush()

    def big_line(head, tail):
        out.write(head)
        for _ in range(9 * 16):
            out.write(b"A" * 65536)
            out.flush()
        out.write(tail + b"\\n")
        out.flush()

    def chunk(text):
        update = {"sessionUpdate": "agent_message_chunk",
                  "content": {"type": "text", "text": text}}
        send({"jsonrpc": "2.0", "method": "session/update",
              "params": {"sessionId": "s1", "update": update}})

    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        if "method" not in msg:
            chunk("question answered " + str(msg.get("error", {}).get("code")))
            chunk("after")
            send({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "end_turn"}})
        elif msg["method"] == "initialize":
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif msg["method"] == "session/new":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "s1"}})
        elif msg["method"] == "session/prompt":
            prompt_id = msg["id"]
            send({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": "s1", "update": {"sessionUpdate": "tool_call",
                "toolCallId": "t1", "title": "cat big.log", "kind": "read",
                "status": "in_progress"}}})
            big_line(
                b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1",'
                b'"update":{"sessionUpdate":"tool_call_update","toolCallId":"t1",'
                b'"status":"completed","content":[{"type":"content","content":'
                b'{"type":"text","text":"',
                b'"}}]}}}',
            )
            big_line(
                b'{"jsonrpc":"2.0","id":"q1","method":"cursor/ask_question","params":'
                b'{"title":"',
                b'"}}',
            )
    """
)


async def _peer(
    tmp_path: Path, source: str, normalizer: Normalizer
) -> tuple[AgentProcess, AcpClient, io.StringIO]:
    """A real peer process running ``source``, wired to a turn's handlers as a job's
    agent is: what those handlers emit lands in the returned stream as JSON lines."""
    stream = io.StringIO()
    emitter = EventEmitter(job_id="j", attempt=1, sinks=[JsonlSink(stream)])
    turn = Turn(SimpleNamespace(emitter=emitter), SimpleNamespace(normalizer=normalizer), Made())  # type: ignore[arg-type]
    script = tmp_path / "peer.py"
    script.write_text(source)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    agent = AgentProcess(
        FakeProcess(proc),
        line_limit=8 * MIB,
        request_timeout=10,
        stderr_limit=65536,
        on_notification=turn._notification,
        on_malformed=turn._malformed,
        on_oversize=turn._oversize,
        on_stray_reply=turn._stray_reply,
    )
    agent.start()
    return agent, AcpClient(agent.connection), stream


async def _run(tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    assert Settings().acp_line_limit == 8 * MIB  # the peer writes past the default bound
    normalizer = Normalizer(workspace_root="/workspace")
    agent, client, stream = await _peer(tmp_path, PEER, normalizer)
    try:
        await client.initialize(ClientCapabilities())
        session = await client.new_session("/workspace")
        normalizer.bind(str(session["sessionId"]))
        stop = await asyncio.wait_for(client.prompt("s1", [{"type": "text", "text": "go"}]), 30)
    finally:
        await agent.shutdown(eof_grace=2, term_grace=1)
    return stop, [json.loads(line) for line in stream.getvalue().splitlines()]


def test_oversize_lines_are_skipped_and_the_turn_settles(tmp_path: Path) -> None:
    stop, events = asyncio.run(_run(tmp_path))
    assert stop == "end_turn"
    kinds = [e["type"] for e in events]
    assert kinds == [
        "tool.started",
        "tool.completed",  # the oversize update, from its first bytes
        "notice",
        "notice",  # the oversize request
        "message.delta",
        "message.delta",
    ]
    completed = events[1]["data"]
    assert completed["tool_call_id"] == "t1"
    assert completed["status"] == "completed"
    output = completed["output"]
    assert output["truncated"] is True
    assert output["bytes"] == -1  # the full size is not known; the notice has the line's
    assert set(output["text"]) == {"A"}
    assert 10_000 < len(output["text"]) <= 16 * 1024

    tool_notice, request_notice = events[2]["data"], events[3]["data"]
    assert tool_notice["code"] == "acp_line_skipped"
    assert tool_notice["details"]["bytes"] > 9 * MIB
    assert tool_notice["details"]["limit"] == 8 * MIB
    assert tool_notice["details"]["tool_event"] is True
    assert tool_notice["details"]["update"] == "tool_call_update"
    assert tool_notice["details"]["tool_call_id"] == "t1"
    assert "tool_call_update" in tool_notice["message"]
    assert request_notice["code"] == "acp_line_skipped"
    assert (request_notice["details"]["kind"], request_notice["details"]["method"]) == (
        "request",
        "cursor/ask_question",
    )
    assert request_notice["details"]["id"] == "q1"
    assert "-32600" in request_notice["message"]

    texts = [e["data"]["text"] for e in events[4:]]
    assert texts == ["question answered -32600", "after"]


# The agent for late replies: it does not answer the prompt until asked something else,
# then answers the (abandoned) prompt first, then the new request.
LATE_PEER = textwrap.dedent(
    """
    import json, sys

    def send(obj):
        sys.stdout.write(json.dumps(obj) + "\\n")
        sys.stdout.flush()

    for raw in sys.stdin:
        msg = json.loads(raw)
        if msg.get("method") == "session/prompt":
            prompt_id = msg["id"]
        elif msg.get("method") == "session/set_mode":
            send({"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "cancelled"}})
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
    """
)


async def _late(tmp_path: Path) -> list[dict[str, Any]]:
    normalizer = Normalizer(workspace_root="/workspace")
    agent, client, stream = await _peer(tmp_path, LATE_PEER, normalizer)
    try:
        prompt = asyncio.create_task(client.prompt("s1", [{"type": "text", "text": "go"}]))
        await client.cancel("s1")
        with pytest.raises(TimeoutError):  # the cancel's grace passes unanswered
            await asyncio.wait_for(asyncio.shield(prompt), 0.2)
        prompt.cancel()  # the turn abandons its prompt, as Turn._end does
        await asyncio.gather(prompt, return_exceptions=True)
        await client.set_mode("s1", "ask")  # answered after the late prompt reply
    finally:
        await agent.shutdown(eof_grace=2, term_grace=1)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_late_reply_to_an_abandoned_prompt_is_not_malformed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="worker.rpc.connection")
    events = asyncio.run(_late(tmp_path))
    assert events == []  # no acp_malformed_line notice
    assert any("a late reply to session/prompt" in record.getMessage() for record in caplog.records)


# The agent for a duplicate reply: it answers session/set_mode twice.
DUPLICATE_PEER = textwrap.dedent(
    """
    import json, sys

    for raw in sys.stdin:
        msg = json.loads(raw)
        if msg.get("method") == "session/set_mode":
            reply = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
            sys.stdout.write(reply + "\\n" + reply + "\\n")
            sys.stdout.flush()
    """
)


def test_a_duplicate_reply_is_reported_as_one_not_as_a_malformed_line(tmp_path: Path) -> None:
    async def run() -> list[dict[str, Any]]:
        agent, client, stream = await _peer(
            tmp_path, DUPLICATE_PEER, Normalizer(workspace_root="/workspace")
        )
        try:
            await client.set_mode("s1", "ask")
            await client.set_mode("s1", "agent")
        finally:
            await agent.shutdown(eof_grace=2, term_grace=1)
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    events = asyncio.run(run())
    assert [e["data"] for e in events] == [
        {
            "level": "warning",
            "code": "acp_stray_reply",
            "message": f"the agent answered request {n} (session/set_mode) again; "
            "the repeated reply was skipped",
            "details": {"id": n, "reason": "duplicate", "method": "session/set_mode"},
        }
        for n in (0, 1)
    ]


# Cursor's shell, as its ACP server reports it (CURSOR_ACP_FACTS.md, Tools): the output in
# ``rawOutput`` ``{exitCode, stdout, stderr}``, not in ``content``; here 9 MiB of stdout.
SHELL_PEER = textwrap.dedent(
    """
    import json, sys

    out = sys.stdout.buffer

    def send(obj):
        out.write(json.dumps(obj).encode() + b"\\n")
        out.flush()

    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        if msg.get("method") == "initialize":
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif msg.get("method") == "session/new":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "s1"}})
        elif msg.get("method") == "session/prompt":
            send({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": "s1", "update": {"sessionUpdate": "tool_call",
                "toolCallId": "t1", "title": "`cat big.log`", "kind": "execute",
                "status": "pending", "rawInput": {"command": "cat big.log"}}}})
            stdout = "".join(f"line {n:07d} of big.log\\n" for n in range(400_000))
            update = {"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                      "status": "completed",
                      "rawOutput": {"exitCode": 0, "stdout": stdout, "stderr": ""}}
            send({"jsonrpc": "2.0", "method": "session/update",
                  "params": {"sessionId": "s1", "update": update}})
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"stopReason": "end_turn"}})
    """
)


def test_an_oversize_shell_update_keeps_the_stdout_its_first_bytes_held(tmp_path: Path) -> None:
    async def run() -> list[dict[str, Any]]:
        normalizer = Normalizer(workspace_root="/workspace")
        agent, client, stream = await _peer(tmp_path, SHELL_PEER, normalizer)
        try:
            await client.initialize(ClientCapabilities())
            await client.new_session("/workspace")
            normalizer.bind("s1")
            await asyncio.wait_for(client.prompt("s1", [{"type": "text", "text": "go"}]), 30)
        finally:
            await agent.shutdown(eof_grace=2, term_grace=1)
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    events = asyncio.run(run())
    assert [e["type"] for e in events] == ["tool.started", "tool.completed", "notice"]
    assert events[2]["data"]["details"]["bytes"] > 8 * MIB
    output = events[1]["data"]["output"]
    assert (output["truncated"], output["bytes"]) == (True, -1)
    text = output["text"]
    assert text.startswith('{"exitCode": 0, "stdout": "line 0000000 of big.log\\nline 0000001')
    assert 16 * 1024 - 200 < len(text.encode()) <= 16 * 1024  # what the first 16 KiB held
