"""OpenAI's Responses API (``POST /v1/responses``, streamed or not) and ``GET /v1/models``.

A stream is ``response.created``, ``response.in_progress``, per output item
``response.output_item.added`` … ``response.output_item.done`` (a message with
``response.content_part.added`` / ``response.output_text.delta`` / ``…done``; a function
call with ``response.function_call_arguments.delta`` / ``…done``), then
``response.completed`` carrying the whole response with its usage.

A scripted :class:`~tests.fake_models.base.ToolCall` whose arguments hold only ``input``
and whose tool the request declares as ``{"type": "custom"}`` (codex's freeform
``apply_patch``) is sent as a ``custom_tool_call`` item; any other as a
``function_call`` with JSON arguments.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.fake_models.base import (
    Exchange,
    FakeModel,
    JsonObject,
    Reply,
    Request,
    ToolCall,
    held,
)

MODELS = ("gpt-5", "gpt-5-codex", "gpt-5-mini")


class OpenAIResponsesFake(FakeModel):
    api = "openai"

    def handle(self, request: Request) -> Exchange | None:
        path = request.path.removesuffix("/")
        if request.method == "POST" and path.endswith("/responses"):
            return self._responses(request)
        if request.method == "GET" and path.endswith("/models"):
            return Exchange(body=_models())
        return None

    def _responses(self, request: Request) -> Exchange:
        body: JsonObject = request.body if isinstance(request.body, dict) else {}
        request.main = bool(body.get("tools"))
        reply = self.next_reply() if request.main else Reply(text=self.side_reply)
        custom = {
            t.get("name")
            for t in body.get("tools", [])
            if isinstance(t, dict) and t.get("type") == "custom"
        }
        response_id = self.new_id("resp_fake")
        model = str(body.get("model", MODELS[0]))
        items: list[JsonObject] = []
        if reply.text:
            items.append(
                {
                    "id": self.new_id("msg_fake"),
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        items.extend(self._call_item(c, custom) for c in reply.calls)
        usage = {
            "input_tokens": max(1, len(json.dumps(body)) // 4),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        response: JsonObject = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": items,
            "usage": usage,
            "error": None,
            "incomplete_details": None,
        }
        if not body.get("stream"):
            return Exchange(body=response)
        seq = _Seq()
        pending = dict(response, status="in_progress", output=[], usage=None)
        events = [
            seq.event("response.created", response=pending),
            seq.event("response.in_progress", response=pending),
        ]
        for index, item in enumerate(items):
            events.extend(_item_events(seq, index, item))
        events.append(seq.event("response.completed", response=response))
        if reply.hang:
            last = "response.output_text.delta"
            return Exchange(events=held(events, last), stream=True, hold=True)
        return Exchange(events=events, stream=True)

    def _call_item(self, tool: ToolCall, custom: set[Any]) -> JsonObject:
        call_id = self.new_id("call_fake")
        if tool.name in custom and set(tool.arguments) == {"input"}:
            return {
                "id": self.new_id("ctc_fake"),
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": call_id,
                "name": tool.name,
                "input": tool.arguments["input"],
            }
        return {
            "id": self.new_id("fc_fake"),
            "type": "function_call",
            "status": "completed",
            "call_id": call_id,
            "name": tool.name,
            "arguments": json.dumps(tool.arguments),
        }


class _Seq:
    def __init__(self) -> None:
        self.n = 0

    def event(self, name: str, **fields: Any) -> tuple[str | None, JsonObject]:
        data: JsonObject = {"type": name, "sequence_number": self.n, **fields}
        self.n += 1
        return name, data


def _item_events(seq: _Seq, index: int, item: JsonObject) -> list[tuple[str | None, JsonObject]]:
    where = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": []}
        added = dict(item, status="in_progress", content=[])
        half = len(text) // 2
        return [
            seq.event("response.output_item.added", output_index=index, item=added),
            seq.event("response.content_part.added", content_index=0, part=part, **where),
            *(
                seq.event("response.output_text.delta", content_index=0, delta=d, **where)
                for d in (text[:half], text[half:])
                if d
            ),
            seq.event("response.output_text.done", content_index=0, text=text, **where),
            seq.event(
                "response.content_part.done", content_index=0, part=item["content"][0], **where
            ),
            seq.event("response.output_item.done", output_index=index, item=item),
        ]
    if item["type"] == "custom_tool_call":
        added = dict(item, status="in_progress", input="")
        return [
            seq.event("response.output_item.added", output_index=index, item=added),
            seq.event("response.custom_tool_call_input.delta", delta=item["input"], **where),
            seq.event("response.custom_tool_call_input.done", input=item["input"], **where),
            seq.event("response.output_item.done", output_index=index, item=item),
        ]
    raw = item["arguments"]
    added = dict(item, status="in_progress", arguments="")
    return [
        seq.event("response.output_item.added", output_index=index, item=added),
        seq.event("response.function_call_arguments.delta", delta=raw, **where),
        seq.event("response.function_call_arguments.done", arguments=raw, **where),
        seq.event("response.output_item.done", output_index=index, item=item),
    ]


def _models() -> JsonObject:
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": 1735689600, "owned_by": "fake"} for m in MODELS
        ],
    }
