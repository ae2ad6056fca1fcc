"""Google's Gemini API: ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``,
``:generateContent`` and ``:countTokens``, and ``GET /v1beta/models``.

A streamed answer is SSE ``data:`` lines, each a ``GenerateContentResponse``
(``candidates[0].content.parts``: ``text`` or ``functionCall {name, args}``); the last one
carries ``finishReason: STOP`` and ``usageMetadata``.

Side calls: gemini-cli asks non-streamed ``generateContent`` with a JSON response schema
(its next-speaker check, loop detection, routing): those get ``side_json`` as the text.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fake_models.base import Exchange, FakeModel, JsonObject, Reply, Request

MODELS = ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.5-flash-lite")


class GeminiFake(FakeModel):
    api = "gemini"

    def __init__(
        self,
        script: list[Reply] | None = None,
        *,
        side_reply: str = "OK",
        side_json: JsonObject | None = None,
    ) -> None:
        super().__init__(script, side_reply=side_reply)
        # Fields of a side call's JSON answer chosen on purpose (others: schema defaults).
        self.side_json = {"next_speaker": "user", "complexity_score": 10, **(side_json or {})}

    def handle(self, request: Request) -> Exchange | None:
        path = request.path.removesuffix("/")
        if request.method == "GET" and path.endswith("/models"):
            return Exchange(
                body={
                    "models": [
                        {
                            "name": f"models/{m}",
                            "displayName": m,
                            "supportedGenerationMethods": ["generateContent", "countTokens"],
                        }
                        for m in MODELS
                    ]
                }
            )
        if request.method != "POST" or ":" not in path:
            return None
        model_path, _, verb = path.rpartition(":")
        model = model_path.rsplit("/", 1)[-1]
        if verb == "countTokens":
            return Exchange(body={"totalTokens": max(1, len(request.text) // 4)})
        if verb not in {"generateContent", "streamGenerateContent"}:
            return None
        return self._generate(request, model, stream=verb == "streamGenerateContent")

    def _generate(self, request: Request, model: str, *, stream: bool) -> Exchange:
        body: JsonObject = request.body if isinstance(request.body, dict) else {}
        request.main = bool(body.get("tools"))
        config = body.get("generationConfig") or {}
        if request.main:
            reply = self.next_reply()
        elif schema := config.get("responseJsonSchema") or config.get("responseSchema"):
            reply = Reply(text=json.dumps(_instance(schema, self.side_json)))
        else:
            reply = Reply(text=self.side_reply)
        parts: list[JsonObject] = []
        if reply.text:
            parts.append({"text": reply.text})
        parts.extend({"functionCall": {"name": c.name, "args": c.arguments}} for c in reply.calls)
        prompt_tokens = max(1, len(request.text) // 4)
        usage = {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": 5,
            "totalTokenCount": prompt_tokens + 5,
        }
        if not stream:
            return Exchange(body=_chunk(parts, model, usage, final=True))
        if reply.hang:  # the text so far, unfinished
            chunk = _chunk([{"text": reply.text}], model, usage, final=False)
            return Exchange(events=[(None, chunk)], stream=True, hold=True)
        # One chunk per part, the last one finishing, as the service streams them.
        chunks = [
            _chunk([part], model, usage, final=i == len(parts) - 1) for i, part in enumerate(parts)
        ] or [_chunk([{"text": ""}], model, usage, final=True)]
        return Exchange(events=[(None, c) for c in chunks], stream=True)


def _instance(schema: Any, chosen: JsonObject, name: str = "") -> Any:
    """A minimal value of a (Gemini/OpenAPI-style) JSON schema; ``chosen`` values win."""
    if name in chosen:
        return chosen[name]
    if not isinstance(schema, dict):
        return None
    if schema.get("enum"):
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {key: _instance(sub, chosen, key) for key, sub in props.items()}
    if kind == "array":
        return []
    return {"string": "fake", "integer": 1, "number": 1, "boolean": False}.get(kind)


def _chunk(parts: list[JsonObject], model: str, usage: JsonObject, *, final: bool) -> JsonObject:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: JsonObject = {"candidates": [candidate], "modelVersion": model}
    if final:
        candidate["finishReason"] = "STOP"
        out["usageMetadata"] = usage
    return out
