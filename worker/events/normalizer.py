"""ACP ``session/update`` notifications → canonical events (pure, no I/O).

The normalizer never drops what the agent said: an update kind it does not know becomes
``provider.unmapped`` with the raw payload (bounded). Untrusted text is bounded and
marked when cut; paths are made relative to the workspace, and a location outside it is
dropped with a notice rather than passed on.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from worker.events.bounded import bounded, bounded_json

Out = list[tuple[str, dict[str, Any]]]

_TERMINAL_TOOL = {"completed", "failed"}


class Normalizer:
    """Stateful mapping of one session's updates (plan revisions, usage seen)."""

    def __init__(self, *, workspace_root: str, text_limit: int = 16 * 1024) -> None:
        self._root = workspace_root.rstrip("/")
        self._limit = text_limit
        self._plan_revision = 0
        self.usage_seen = False
        self._kinds: dict[str, Callable[[Mapping[str, Any]], Out]] = {
            "agent_message_chunk": lambda u: self._chunk(u, "assistant"),
            "agent_thought_chunk": lambda u: self._chunk(u, "thought"),
            "user_message_chunk": lambda u: self._chunk(u, "user"),
            "tool_call": self._tool_call,
            "tool_call_update": self._tool_update,
            "plan": self._plan,
            "available_commands_update": self._commands,
            "current_mode_update": self._mode,
            "session_info_update": self._info,
            "usage_update": self._usage,
        }

    def normalize(self, params: Any) -> Out:
        """Events for one ``session/update`` params object."""
        update = params.get("update") if isinstance(params, Mapping) else None
        kind = update.get("sessionUpdate") if isinstance(update, Mapping) else None
        handler = self._kinds.get(kind) if isinstance(kind, str) else None
        if handler is None or not isinstance(update, Mapping):
            return [self.unmapped(str(kind or "session/update"), params)]
        try:
            return handler(update)
        except (KeyError, TypeError, ValueError, AttributeError):
            return [self.unmapped(str(kind), params)]

    def unmapped(self, kind: str, raw: Any) -> tuple[str, dict[str, Any]]:
        return "provider.unmapped", {"kind": kind, "raw": bounded_json(raw, self._limit)}

    # -- kinds ----------------------------------------------------------------------

    def _chunk(self, update: Mapping[str, Any], role: str) -> Out:
        content = update["content"]
        data: dict[str, Any] = {"role": role, "text": ""}
        if content.get("type") == "text":
            data["text"] = str(content["text"])
        else:
            raw = bounded_json(content, self._limit)
            data["content"] = (
                dict(content)
                if not raw["truncated"]
                else {"type": str(content.get("type")), "truncated": True, "bytes": raw["bytes"]}
            )
        return [("message.delta", data)]

    def _tool_call(self, update: Mapping[str, Any]) -> Out:
        out: Out = []
        raw_input = update.get("rawInput")
        data = {
            "tool_call_id": str(update["toolCallId"]),
            "title": _opt_str(update.get("title")),
            "kind": _opt_str(update.get("kind")),
            "status": str(update.get("status") or "pending"),
            "raw_input": None if raw_input is None else bounded_json(raw_input, self._limit),
            "locations": self._locations(update.get("locations"), out),
        }
        return [("tool.started", data), *out]

    def _tool_update(self, update: Mapping[str, Any]) -> Out:
        notices: Out = []
        status = _opt_str(update.get("status"))
        data: dict[str, Any] = {"tool_call_id": str(update["toolCallId"]), "status": status}
        if update.get("title") is not None:
            data["title"] = str(update["title"])
        output = self._output(update)
        if output is not None:
            data["output"] = output
        data["diffs"] = self._diffs(update.get("content"), notices)
        data["locations"] = self._locations(update.get("locations"), notices)
        type_ = "tool.completed" if status in _TERMINAL_TOOL else "tool.updated"
        return [(type_, data), *notices]

    def _output(self, update: Mapping[str, Any]) -> dict[str, Any] | None:
        texts = [
            str(block["content"]["text"])
            for block in update.get("content") or []
            if isinstance(block, Mapping)
            and block.get("type") == "content"
            and isinstance(block.get("content"), Mapping)
            and block["content"].get("type") == "text"
        ]
        if texts:
            return bounded("\n".join(texts), self._limit)
        if update.get("rawOutput") is not None:
            return bounded_json(update["rawOutput"], self._limit)
        return None

    def _diffs(self, content: Any, notices: Out) -> list[dict[str, Any]]:
        diffs = []
        for block in content or []:
            if not isinstance(block, Mapping) or block.get("type") != "diff":
                continue
            path = self._relative(str(block.get("path", "")), notices)
            if path is None:
                continue
            old = block.get("oldText")
            diffs.append(
                {
                    "path": path,
                    "old_text": None if old is None else bounded(str(old), self._limit),
                    "new_text": bounded(str(block.get("newText", "")), self._limit),
                }
            )
        return diffs

    def _locations(self, locations: Any, notices: Out) -> list[dict[str, Any]]:
        out = []
        for location in locations or []:
            if not isinstance(location, Mapping):
                continue
            path = self._relative(str(location.get("path", "")), notices)
            if path is not None:
                line = location.get("line")
                out.append({"path": path, "line": line if isinstance(line, int) else None})
        return out

    def _relative(self, path: str, notices: Out) -> str | None:
        """Workspace-relative form of ``path``; ``None`` (plus a notice) when outside."""
        if path.startswith("/"):
            normalized = posixpath.normpath(path)
            if normalized == self._root:
                return "."
            if normalized.startswith(self._root + "/"):
                return normalized[len(self._root) + 1 :]
        else:
            normalized = posixpath.normpath(path)
            if normalized != ".." and not normalized.startswith("../"):
                return normalized
        notices.append(_outside_notice(path))
        return None

    def _plan(self, update: Mapping[str, Any]) -> Out:
        self._plan_revision += 1
        entries = [
            {
                "content": str(entry.get("content", "")),
                "priority": _opt_str(entry.get("priority")),
                "status": str(entry.get("status", "pending")),
            }
            for entry in update["entries"]
            if isinstance(entry, Mapping)
        ]
        return [("plan.updated", {"revision": self._plan_revision, "entries": entries})]

    def _commands(self, update: Mapping[str, Any]) -> Out:
        commands = [c for c in update["availableCommands"] if isinstance(c, Mapping)]
        return [("commands.available", {"commands": commands})]

    def _mode(self, update: Mapping[str, Any]) -> Out:
        return [("mode.changed", {"mode": str(update["currentModeId"])})]

    def _info(self, update: Mapping[str, Any]) -> Out:
        title = update.get("title")
        if not isinstance(title, str):
            return [self.unmapped("session_info_update", update)]
        return [("session.titled", {"title": bounded(title, 1024)["text"]})]

    def _usage(self, update: Mapping[str, Any]) -> Out:
        self.usage_seen = True
        fields = {k: v for k, v in update.items() if k != "sessionUpdate"}
        return [("usage.reported", {"available": True, "source": "agent", **fields})]


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _outside_notice(path: str) -> tuple[str, dict[str, Any]]:
    return (
        "notice",
        {
            "level": "warning",
            "code": "path_outside_workspace",
            "message": "the agent reported a path outside the workspace; it was dropped",
            "details": {"path": bounded(path, 512)["text"]},
        },
    )
