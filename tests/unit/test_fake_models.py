"""The fake model APIs themselves (no agent): their wire shapes, the script, the log."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.fake_models import AnthropicFake, GeminiFake, OpenAIResponsesFake, call, say
from tests.fake_models.base import FakeModel
from tests.fake_models.proxy import RecordingProxy

TOOLS_ANTHROPIC = [{"name": "Read", "input_schema": {"type": "object"}}]


def _post(fake: FakeModel, path: str, body: Any) -> tuple[int, str, str]:
    request = urllib.request.Request(
        fake.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _sse(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        name = None
        data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
        assert data is not None
        events.append((name, data))
    return events


def test_anthropic_streams_text_and_tool_use() -> None:
    script = [call("Read", file_path="/w/a.txt"), say("done")]
    with AnthropicFake(script) as fake:
        body = {"model": "m", "stream": True, "tools": TOOLS_ANTHROPIC, "messages": []}
        status, kind, text = _post(fake, "/v1/messages", body)
        assert (status, kind) == (200, "text/event-stream")
        events = _sse(text)
        names = [n for n, _ in events]
        assert names[0] == "message_start"
        assert names[-2:] == ["message_delta", "message_stop"]
        assert all(n == d["type"] for n, d in events)
        start = next(d for n, d in events if n == "content_block_start")
        assert start["content_block"]["type"] == "tool_use"
        partial = "".join(
            d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"
        )
        assert json.loads(partial) == {"file_path": "/w/a.txt"}
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"

        status, _, text = _post(fake, "/v1/messages", dict(body, stream=False))
        message = json.loads(text)
        assert message["content"] == [{"type": "text", "text": "done"}]
        assert message["stop_reason"] == "end_turn"
        assert fake.script == []
        assert len(fake.main_requests) == 2


def test_anthropic_side_calls_and_extras_do_not_consume_the_script() -> None:
    with AnthropicFake([say("main")], side_reply="a title") as fake:
        _, _, text = _post(fake, "/v1/messages", {"model": "m", "messages": []})
        assert json.loads(text)["content"][0]["text"] == "a title"
        _, _, text = _post(fake, "/v1/messages/count_tokens", {"messages": []})
        assert json.loads(text)["input_tokens"] >= 1
        status, _, _ = _post(fake, "/v1/nothing", {})
        assert status == 404
        assert [r.path for r in fake.unknown] == ["/v1/nothing"]
        assert fake.script == [say("main")]


def test_openai_responses_stream_function_and_custom_calls() -> None:
    tools = [
        {"type": "function", "name": "exec_command"},
        {"type": "custom", "name": "apply_patch"},
    ]
    script = [call("exec_command", cmd="ls"), call("apply_patch", input="*** Begin Patch\n")]
    with OpenAIResponsesFake(script) as fake:
        body = {"model": "gpt-5.5", "stream": True, "tools": tools, "input": []}
        events = _sse(_post(fake, "/v1/responses", body)[2])
        assert [n for n, _ in events][:2] == ["response.created", "response.in_progress"]
        assert events[-1][0] == "response.completed"
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        assert done[0]["type"] == "function_call"
        assert json.loads(done[0]["arguments"]) == {"cmd": "ls"}
        assert events[-1][1]["response"]["usage"]["total_tokens"] > 0

        events = _sse(_post(fake, "/v1/responses", body)[2])
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        assert done[0]["type"] == "custom_tool_call"
        assert done[0]["input"] == "*** Begin Patch\n"


def test_gemini_streams_function_calls_and_answers_side_schemas() -> None:
    with GeminiFake([call("read_file", file_path="a"), say("ok")]) as fake:
        body = {"contents": [], "tools": [{"functionDeclarations": [{"name": "read_file"}]}]}
        path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        events = _sse(_post(fake, path, body)[2])
        (_, chunk) = events[-1]
        part = chunk["candidates"][0]["content"]["parts"][0]
        assert part == {"functionCall": {"name": "read_file", "args": {"file_path": "a"}}}
        assert chunk["candidates"][0]["finishReason"] == "STOP"
        assert fake.requests[0].query == {"alt": ["sse"]}

        schema = {
            "type": "OBJECT",
            "properties": {
                "next_speaker": {"type": "STRING", "enum": ["model", "user"]},
                "reasoning": {"type": "STRING"},
                "score": {"type": "INTEGER"},
            },
        }
        side = {"contents": [], "generationConfig": {"responseJsonSchema": schema}}
        _, _, text = _post(fake, "/v1beta/models/flash:generateContent", side)
        answer = json.loads(json.loads(text)["candidates"][0]["content"]["parts"][0]["text"])
        assert answer == {"next_speaker": "user", "reasoning": "fake", "score": 1}
        assert fake.script == [say("ok")]


def test_an_exhausted_script_is_an_error_the_test_sees() -> None:
    with AnthropicFake([]) as fake:
        _post(fake, "/v1/messages", {"model": "m", "tools": TOOLS_ANTHROPIC, "messages": []})
    assert fake.errors


@pytest.mark.parametrize(
    "target", ["CONNECT example.com:443 HTTP/1.1", "GET http://x.test/ HTTP/1.1"]
)
def test_the_proxy_records_and_refuses(target: str) -> None:
    import socket

    proxy = RecordingProxy().start()
    try:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(f"{target}\r\nHost: x\r\n\r\n".encode())
            assert conn.recv(100).startswith(b"HTTP/1.1 403")
    finally:
        proxy.stop()
    assert proxy.attempts == [target.rsplit(" ", 1)[0]]
