"""Redaction as a property of streamed text, not of one event.

An agent streams its answer in chunks and may stream a tool's output in pieces; a secret
split over two chunks is whole in neither, yet whole again to anyone who joins them (the
progress view does, so does every client). :class:`TextChannels` sits in front of the
emitter's serialization: per text channel (``message.delta`` per role, child and replay;
a tool's ``output`` per child and ``tool_call_id``) it masks every form of a bound secret
(:meth:`Redactor.scrub_text`) and holds back the end of the text that could be the start
of one (:meth:`Redactor.holdback`) until the next chunk of that channel. Held text is
never lost: it leads the channel's next chunk, or goes out when the channel ends (a tool
completing, :meth:`TextChannels.flush` at the end of the turn and before
``job.completed``). The text of a channel joined is the text the agent sent with every
secret masked.

A tool's output may be a chunk or, as ACP defines ``content``, the whole output so far:
an output that extends the previous one is taken as such a snapshot (nothing is carried
into it); any other is a chunk, led by what was held.

Only used when a secret is bound: without one the emitter never calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.credentials.redact import Redactor

Data = dict[str, Any]
_DELTA = "message.delta"
_TOOL_TYPES = frozenset({"tool.updated", "tool.completed"})
_TOOL_DONE = "tool.completed"
_TOOL_KEYS = ("tool_call_id", "child_id", "replay")


@dataclass(slots=True)
class _Tool:
    """What one tool's output channel holds."""

    keys: Data  # ``tool_call_id`` and the attribution of its events
    held: str = ""
    last_raw: str = ""  # the agent's last output, as sent
    last_output: Data = field(default_factory=dict)
    chunked: bool = False  # an output that did not extend the previous one was seen


class TextChannels:
    """The held-back ends of every text channel of one job attempt."""

    __slots__ = ("_deltas", "_redactor", "_tools")

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        # key → (the channel's last event without its content, its held text)
        self._deltas: dict[tuple[object, ...], tuple[Data, str]] = {}
        self._tools: dict[tuple[object, ...], _Tool] = {}

    def process(self, type_: str, data: Data) -> list[tuple[str, Data]]:
        """The events to emit for one event (``data`` is the emitter's own copy): none
        (all of its text held back), itself with its text masked and cut, or with held
        text of its channel in front."""
        if type_ == _DELTA:
            return self._delta(data)
        if type_ in _TOOL_TYPES:
            return self._tool(type_, data)
        return [(type_, data)]

    def flush(self) -> list[tuple[str, Data]]:
        """Every channel's held text as events (the turn ended, or the job does)."""
        out: list[tuple[str, Data]] = []
        for template, held in self._deltas.values():
            if held:
                out.append((_DELTA, {**template, "text": self._redactor.scrub_text(held)}))
        self._deltas.clear()
        for tool in self._tools.values():
            output = self._tool_flush(tool)
            if output is not None:
                out.append(("tool.updated", {**tool.keys, "status": None, "output": output}))
        self._tools.clear()
        return out

    def _delta(self, data: Data) -> list[tuple[str, Data]]:
        key = (data["role"], data.get("child_id"), data.get("replay", False))
        held = self._deltas.pop(key, None)
        text = data["text"]
        if held is not None:
            text = held[1] + text
        elif not text:
            return [(_DELTA, data)]
        redactor = self._redactor
        masked = redactor.scrub_text(text)
        hold = redactor.holdback(masked)
        if hold:
            template = {k: v for k, v in data.items() if k != "content"}
            self._deltas[key] = (template, masked[-hold:])
            masked = masked[:-hold]
            if not masked and data.get("content") is None:
                return []
        data["text"] = masked
        return [(_DELTA, data)]

    def _tool(self, type_: str, data: Data) -> list[tuple[str, Data]]:
        key = (data.get("child_id"), data["tool_call_id"])
        done = type_ == _TOOL_DONE
        tool = self._tools.get(key)
        output = data.get("output")
        if output is None:
            if done and tool is not None:
                del self._tools[key]
                flushed = self._tool_flush(tool)
                if flushed is not None:
                    data["output"] = flushed
            return [(type_, data)]
        if tool is None:
            keys: Data = {k: data[k] for k in _TOOL_KEYS if k in data}
            tool = self._tools[key] = _Tool(keys=keys)
        raw = output["text"]
        if tool.last_raw and raw.startswith(tool.last_raw):
            buffer = raw  # the whole output so far: what was held is in it
        else:
            tool.chunked = tool.chunked or bool(tool.last_raw)
            buffer = tool.held + raw
        masked = self._redactor.scrub_text(buffer)
        hold = 0 if done else self._redactor.holdback(masked)
        tool.held, tool.last_raw, tool.last_output = masked[len(masked) - hold :], raw, output
        if done:
            del self._tools[key]
        data["output"] = {**output, "text": masked[: len(masked) - hold]}
        return [(type_, data)]

    def _tool_flush(self, tool: _Tool) -> Data | None:
        """A tool's held output at its end: the held end of a chunk, or, when its outputs
        read as snapshots, the last one whole."""
        if not tool.held:
            return None
        if tool.chunked:
            return {
                "text": tool.held,
                "truncated": False,
                "bytes": len(tool.held.encode("utf-8", "replace")),
            }
        return {**tool.last_output, "text": self._redactor.scrub_text(tool.last_raw)}
