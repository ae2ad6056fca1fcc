"""Anthropic's Messages API (``POST /v1/messages``, streamed or not) and what Claude Code
asks besides: ``/v1/messages/count_tokens`` and ``GET /v1/models``.

Shapes per Anthropic's API reference: a stream is ``message_start``, per content block
``content_block_start`` / ``content_block_delta`` (``text_delta`` or ``input_json_delta``)
/ ``content_block_stop``, then ``message_delta`` (stop_reason, usage) and ``message_stop``.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fake_models.base import Exchange, FakeModel, JsonObject, Reply, Request, held

MODELS = ("claude-sonnet-4-5", "claude-opus-4-1", "claude-haiku-4-5")


class AnthropicFake(FakeModel):
    api = "anthropic"

    def handle(self, request: Request) -> Exchange | None:
        path = request.path.removesuffix("/")
        if request.method == "POST" and path == "/v1/messages":
            return self._messages(request)
        if request.method == "POST" and path == "/v1/messages/count_tokens":
            return Exchange(body={"input_tokens": _tokens(request.body)})
        if request.method == "GET" and path == "/v1/models":
            data = [_model(m) for m in MODELS]
            return Exchange(
                body={
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"],
                    "last_id": data[-1]["id"],
                }
            )
        if request.method == "GET" and path.startswith("/v1/models/"):
            return Exchange(body=_model(path.rsplit("/", 1)[1]))
        if request.method == "HEAD" or (request.method == "GET" and path in {"", "/"}):
            return Exchange(body={})
        return None

    def _messages(self, request: Request) -> Exchange:
        body: JsonObject = request.body if isinstance(request.body, dict) else {}
        request.main = bool(body.get("tools"))
        reply = self.next_reply() if request.main else Reply(text=self.side_reply)
        model = str(body.get("model", MODELS[0]))
        content: list[JsonObject] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        content.extend(
            {
                "type": "tool_use",
                "id": self.new_id("toolu_fake"),
                "name": c.name,
                "input": c.arguments,
            }
            for c in reply.calls
        )
        stop = "tool_use" if reply.calls else "end_turn"
        usage = {"input_tokens": _tokens(body), "output_tokens": 5}
        message: JsonObject = {
            "id": self.new_id("msg_fake"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return Exchange(body=message)
        start = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
        events: list[tuple[str | None, JsonObject]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for index, block in enumerate(content):
            events.extend(_block_events(index, block))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        if reply.hang:
            return Exchange(events=held(events, "content_block_delta"), stream=True, hold=True)
        return Exchange(events=events, stream=True)


def _block_events(index: int, block: JsonObject) -> list[tuple[str | None, JsonObject]]:
    if block["type"] == "text":
        opening: JsonObject = {"type": "text", "text": ""}
        text = block["text"]
        # Two deltas, so a client that joins them is exercised.
        half = len(text) // 2
        deltas = [{"type": "text_delta", "text": part} for part in (text[:half], text[half:])]
    else:
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        raw = json.dumps(block["input"])
        half = len(raw) // 2
        deltas = [
            {"type": "input_json_delta", "partial_json": part} for part in (raw[:half], raw[half:])
        ]
    events: list[tuple[str | None, JsonObject]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    events.extend(
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
        if d.get("text") or d.get("partial_json")
    )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _model(model_id: str) -> JsonObject:
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": "2025-01-01T00:00:00Z",
    }


def _tokens(body: Any) -> int:
    return max(1, len(json.dumps(body)) // 4)
