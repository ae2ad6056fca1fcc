"""End to end: an agent that leaks the bound secret split over consecutive chunks, at
every split position, over message chunks, thought chunks and tool output; JSON-escaped
and base64 too. Every output of the job is scanned: stdout JSONL, the events file, the
Redis stream and the progress view on stderr, each joined the way a reader joins it."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import redis

from tests.integration.test_run_job import SECRET, _check_stream, _events, _job, run_cli
from worker.credentials.redact import MASK
from worker.store import keys

B64 = base64.b64encode(SECRET.encode()).decode()


def _chunk(kind: str, text: str) -> str:
    return "update " + json.dumps(
        {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    )


def _tool(tool_id: str, text: str, status: str = "in_progress") -> str:
    block = {"type": "content", "content": {"type": "text", "text": text}}
    update = {"sessionUpdate": "tool_call_update", "toolCallId": tool_id, "status": status}
    return "update " + json.dumps({**update, "content": [block]})


def _script() -> str:
    lines = ["#!scenario"]
    for cut in range(1, len(SECRET)):
        lines += [
            _chunk("agent_message_chunk", f"<{SECRET[:cut]}"),
            _chunk("agent_thought_chunk", f"[{SECRET[:cut]}"),  # another channel between
            _chunk("agent_message_chunk", f"{SECRET[cut:]}>"),
            _chunk("agent_thought_chunk", f"{SECRET[cut:]}]"),
        ]
        tool = f"leak-{cut}"
        start = {"sessionUpdate": "tool_call", "toolCallId": tool, "title": "cat", "kind": "read"}
        lines += [
            "update " + json.dumps({**start, "status": "pending"}),
            _tool(tool, f"({SECRET[:cut]}"),
            _tool(tool, f"{SECRET[cut:]})", status="completed"),
        ]
    for cut in range(1, len(B64)):
        lines += [
            _chunk("agent_message_chunk", B64[:cut]),
            _chunk("agent_message_chunk", B64[cut:]),
        ]
    lines += [
        _chunk("agent_message_chunk", json.dumps(SECRET)),
        _chunk("agent_message_chunk", f"tail {SECRET[:7]}"),  # held, then flushed at the end
        "stop end_turn",
    ]
    return "\n".join(lines) + "\n"


def _joined(events: list[dict[str, Any]], role: str) -> str:
    return "".join(
        e["data"]["text"]
        for e in events
        if e["type"] == "message.delta" and e["data"]["role"] == role
    )


def _tool_outputs(events: list[dict[str, Any]], tool: str) -> str:
    return "".join(
        e["data"]["output"]["text"]
        for e in events
        if e["type"] in {"tool.updated", "tool.completed"}
        and e["data"]["tool_call_id"] == tool
        and e["data"].get("output")
    )


def _check_joined(events: list[dict[str, Any]]) -> None:
    cuts = len(SECRET) - 1
    unpadded = len(B64.rstrip("="))
    # Cut inside the padding, the unpadded form is whole in the first chunk: masked there.
    b64 = "".join(MASK + (B64[unpadded:] if cut >= unpadded else "") for cut in range(1, len(B64)))
    assert _joined(events, "thought") == f"[{MASK}]" * cuts
    assert _joined(events, "assistant") == (
        f"<{MASK}>" * cuts + b64 + f'"{MASK}"' + f"tail {SECRET[:7]}"
    )
    for cut in range(1, len(SECRET)):
        assert _tool_outputs(events, f"leak-{cut}") == f"({MASK})"


def test_a_secret_split_at_every_position_never_leaves(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, _script(), limits={"timeout_s": 120, "memory_mb": 512, "pids": 128})
    events_file = tmp_path / "ev.jsonl"
    result = run_cli(
        tmp_path,
        "run",
        str(job),
        "--json",
        "--events-out",
        str(events_file),
        "--redis",
        redis_url,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    stdout_events = _events(result.stdout)
    assert _check_stream(stdout_events)["status"] == "succeeded"
    file_events = _events(events_file.read_text())
    client = redis.Redis.from_url(redis_url)
    stream_key = keys.events(stdout_events[0]["job_id"])
    stored = [json.loads(f[b"event"]) for _, f in client.xrange(stream_key)]
    assert file_events == stdout_events
    assert stored == stdout_events
    _check_joined(stdout_events)
    # Nothing in clear anywhere, raw or in the encodings, joined or not.
    everything = result.stdout + result.stderr + events_file.read_text()
    everything += "".join(json.dumps(e) for e in stored)
    for needle in (SECRET, B64, json.dumps(SECRET)[1:-1]):
        assert needle not in everything
        assert needle not in _joined(stdout_events, "assistant")
    # The progress view joins the deltas of a role while it streams: joined across its
    # lines, each role's text is what the events say (nothing held back is lost).
    for role, label in (("assistant", "  agent: "), ("thought", "  thinking: ")):
        shown = "".join(
            line[len(label) :] for line in result.stderr.splitlines() if line.startswith(label)
        )
        assert shown == _joined(stdout_events, role)
