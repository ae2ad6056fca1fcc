"""The content of ACP updates → the fields of canonical events (pure, no state).

Split from the normalizer so the routing and the tool-call lifecycle read apart from the
shape of each field: message chunks, tool input and output, diffs and locations (made
workspace-relative, or refused with a notice), plans, commands, modes, usage. Untrusted
text is bounded (``limit``) and secret-looking keys of a tool's input are redacted.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from worker.events import notices
from worker.events.bounded import bound, bound_json, bounded
from worker.events.models import (
    Bounded,
    CommandsAvailable,
    ConfigUpdated,
    DiffBlock,
    EventData,
    Location,
    MessageDelta,
    ModeChanged,
    PlanEntry,
    TokenUsage,
    UsageCost,
)

Out = list[EventData]
Role = Literal["assistant", "thought", "user"]

_SECRET_KEY = re.compile(r"(?i)(token|secret|passw|api[_-]?key|authorization|cookie|credential)")
_TITLE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class ContentMapper:
    """Bounds text at ``limit`` bytes and resolves paths against ``root`` (the workspace)."""

    root: str
    limit: int

    def chunk(self, update: Mapping[str, Any], role: Role) -> Out:
        """A message, thought or user chunk: text as is, any other block kept (bounded)."""
        content = update["content"]
        if content.get("type") == "text":
            return [MessageDelta(role=role, text=str(content["text"]))]
        raw = bound_json(content, self.limit)
        block = (
            dict(content)
            if not raw.truncated
            else {"type": str(content.get("type")), "truncated": True, "bytes": raw.bytes}
        )
        return [MessageDelta(role=role, text="", content=block)]

    def raw_input(self, raw_input: Any) -> Bounded | None:
        """A tool's input, secrets redacted and bounded."""
        if raw_input is None:
            return None
        return bound_json(redacted(raw_input), self.limit)

    def output(self, update: Mapping[str, Any], *, raw: bool = True) -> Bounded | None:
        """A tool's output: its text content blocks joined, else (with ``raw``) its raw
        output."""
        texts = [
            str(block["content"]["text"])
            for block in update.get("content") or []
            if isinstance(block, Mapping)
            and block.get("type") == "content"
            and isinstance(block.get("content"), Mapping)
            and block["content"].get("type") == "text"
        ]
        if texts:
            return bound("\n".join(texts), self.limit)
        if raw and update.get("rawOutput") is not None:
            return bound_json(update["rawOutput"], self.limit)
        return None

    def diffs(self, content: Any, refused: Out) -> list[DiffBlock]:
        """The ``diff`` blocks of a tool's content inside the workspace."""
        diffs = []
        for block in content or []:
            if not isinstance(block, Mapping) or block.get("type") != "diff":
                continue
            path = self.relative(str(block.get("path", "")), refused)
            if path is None:
                continue
            old = block.get("oldText")
            diffs.append(
                DiffBlock(
                    path=path,
                    old_text=None if old is None else bound(str(old), self.limit),
                    new_text=bound(str(block.get("newText", "")), self.limit),
                )
            )
        return diffs

    def locations(self, locations: Any, refused: Out) -> list[Location]:
        """The locations of a tool call inside the workspace."""
        out = []
        for location in locations or []:
            if not isinstance(location, Mapping):
                continue
            path = self.relative(str(location.get("path", "")), refused)
            if path is not None:
                line = location.get("line")
                # A JSON true is no line number (and would be coerced to 1).
                number = line if isinstance(line, int) and not isinstance(line, bool) else None
                out.append(Location(path=path, line=number))
        return out

    def relative(self, path: str, refused: Out) -> str | None:
        """Workspace-relative form of ``path``; ``None`` (plus a notice) when outside."""
        if path.startswith("/"):
            normalized = posixpath.normpath(path)
            if normalized == self.root:
                return "."
            if normalized.startswith(self.root + "/"):
                return normalized[len(self.root) + 1 :]
        else:
            normalized = posixpath.normpath(path)
            if normalized != ".." and not normalized.startswith("../"):
                return normalized
        refused.append(notices.path_outside_workspace(path))
        return None


@dataclass(frozen=True, slots=True)
class TerminalMeta:
    """What a ``tool_call_update``'s terminal ``_meta`` says (:func:`terminal_meta`)."""

    output: str | None  # the command output this update adds (a chunk)
    exit_code: int | None
    #: What of ``_meta`` no canonical field holds: its other keys, or the whole value
    #: when it is no object; empty when all of it was mapped.
    unmapped: Any


_NO_TERMINAL = TerminalMeta(output=None, exit_code=None, unmapped={})
#: The output chunk of a command, by convention: ``terminal_output_delta`` (codex-acp,
#: for a client that declares neither), ``terminal_output`` (Zed's; codex-acp and
#: claude-agent-acp for a client declaring ``_meta.terminal_output``). Both are
#: ``{"data": str, "terminal_id": str}`` and carry text to append.
_TERMINAL_OUTPUT = ("terminal_output_delta", "terminal_output")


def terminal_meta(meta: object) -> TerminalMeta:
    """The command output and exit status in a ``tool_call_update``'s ``_meta``.

    Agents that run a command in a terminal of their own (the client offering none)
    stream its output there instead of in ``content``: ``terminal_output_delta`` or
    ``terminal_output`` ``{data, terminal_id}`` (the text to append) and, at its end,
    ``terminal_exit`` ``{exit_code: int | null, signal: str | null, terminal_id}``. The
    ``terminal_id`` is the tool call's own. A key of another shape, a second output key
    in the same update, a ``signal`` (no canonical field holds it), and every other
    ``_meta`` key (``terminal_info``, agents' own) stay in ``unmapped``.
    """
    if not isinstance(meta, Mapping):
        return _NO_TERMINAL if meta is None else TerminalMeta(None, None, meta)
    unmapped: dict[str, object] = {}
    output = exit_code = None
    for key, value in meta.items():
        if key in _TERMINAL_OUTPUT and output is None and _is_chunk(value):
            output = value["data"]
        elif key == "terminal_exit" and isinstance(value, Mapping):
            code = value.get("exit_code")
            if type(code) is int:
                exit_code = code
            if (code is not None and type(code) is not int) or value.get("signal") is not None:
                unmapped[key] = value
        else:
            unmapped[key] = value
    return TerminalMeta(output=output, exit_code=exit_code, unmapped=unmapped)


def _is_chunk(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("data"), str)


def plan_entries(update: Mapping[str, Any]) -> list[PlanEntry]:
    return [
        PlanEntry(
            content=str(entry.get("content", "")),
            priority=opt_str(entry.get("priority")),
            status=str(entry.get("status", "pending")),
        )
        for entry in update["entries"]
        if isinstance(entry, Mapping)
    ]


def commands(update: Mapping[str, Any], child: str | None) -> Out:
    listed = [dict(c) for c in update["availableCommands"] if isinstance(c, Mapping)]
    return [CommandsAvailable(commands=listed)]


def mode(update: Mapping[str, object], child: str | None) -> Out:
    return [ModeChanged(mode=str(update["currentModeId"]))]


def config(update: Mapping[str, Any], child: str | None) -> Out:
    options = [dict(o) for o in update["configOptions"] if isinstance(o, Mapping)]
    return [ConfigUpdated(config_options=options)]


def usage_fields(update: Mapping[str, object]) -> tuple[dict[str, Any], dict[str, object]]:
    """The ``usage.reported`` fields of a ``usage_update``, and its malformed fields."""
    fields: dict[str, Any] = {"available": True, "source": "agent"}
    for key in ("used", "size"):
        if type(update.get(key)) is int:
            fields[key] = update[key]
    cost = update.get("cost")
    if isinstance(cost, Mapping) and _is_cost(cost):
        fields["cost"] = UsageCost(amount=float(cost["amount"]), currency=cost["currency"])
    malformed = {k: update[k] for k in ("used", "size", "cost") if k in update and k not in fields}
    return fields, malformed


_TOKENS = {
    "inputTokens": "input",
    "outputTokens": "output",
    "totalTokens": "total",
    "thoughtTokens": "thought",
    "cachedReadTokens": "cached_read",
    "cachedWriteTokens": "cached_write",
}
_REQUIRED_TOKENS = ("inputTokens", "outputTokens", "totalTokens")


def token_usage(usage: object) -> TokenUsage | None:
    """The token counts of a prompt result's ``usage`` (ACP, unstable), or None when it
    is not one: the three required counts must be integers >= 0, the others are kept
    only when they are."""
    if not isinstance(usage, Mapping) or not all(
        _count(usage.get(key)) for key in _REQUIRED_TOKENS
    ):
        return None
    return TokenUsage(
        **{name: usage[key] for key, name in _TOKENS.items() if _count(usage.get(key))}
    )


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_cost(cost: object) -> bool:
    return (
        isinstance(cost, Mapping)
        and isinstance(cost.get("amount"), int | float)
        and not isinstance(cost.get("amount"), bool)
        and isinstance(cost.get("currency"), str)
    )


def redacted(value: object) -> Any:
    """``value`` with the values of secret-looking keys replaced (the emitter also
    scrubs every bound credential; this covers secrets the worker does not know)."""
    if isinstance(value, Mapping):
        return {
            k: "[REDACTED]" if _SECRET_KEY.search(str(k)) else redacted(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def title(value: object) -> str | None:
    return None if value is None else bounded(str(value), _TITLE_LIMIT)["text"]


def opt_str(value: object) -> str | None:
    return None if value is None else str(value)
