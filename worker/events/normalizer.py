"""ACP ``session/update`` notifications and Cursor's extension requests → canonical events.

Pure mapping (no I/O: the artifact containment check is injected). Nothing the agent
says is dropped: an unknown update kind becomes ``provider.unmapped`` with the raw
payload (bounded), and fields of a known kind that no canonical field holds become a
second ``provider.unmapped`` marked ``partial``. Untrusted text is bounded and marked
when cut; paths are made relative to the workspace, and a location outside it is
dropped with a notice rather than passed on.

Updates are routed by ``sessionId``: the root session's are the job's own; a spawned
subagent's are attributed to it (``child_id``), never flattened into the parent; an
unknown session, a child that already ended, or any child after the turn settled is
refused with a notice. Events of ``session/load`` history carry ``replay: true``.

The output is event models (:mod:`worker.events.models`), built validated: their
constructors are the cheapest way to a checked shape, and the emitter serializes exactly
the fields set here.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from worker.events import artifacts, notices
from worker.events.artifacts import ArtifactCheck, refuse_all
from worker.events.bounded import bound, bound_json, bounded
from worker.events.delegations import TASK_FIELDS, Delegations, Refused
from worker.events.models import (
    Attributed,
    Bounded,
    CommandsAvailable,
    ConfigUpdated,
    Delegation,
    DiffBlock,
    EventData,
    Location,
    MessageDelta,
    ModeChanged,
    Notice,
    PlanEntry,
    PlanUpdated,
    ProviderUnmapped,
    SessionTitled,
    TodosUpdated,
    ToolCompleted,
    ToolStarted,
    ToolUpdated,
    UsageCost,
    UsageReported,
)
from worker.events.todos import KNOWN_FIELDS as TODO_FIELDS
from worker.events.todos import TodoList

Out = list[EventData]
Handler = Callable[[Mapping[str, Any], str | None], Out]
Role = Literal["assistant", "thought", "user"]

_TERMINAL_TOOL = {"completed", "failed"}
_TOOL = ("sessionUpdate", "toolCallId", "title", "kind", "status", "rawInput", "locations")
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "agent_message_chunk": frozenset({"sessionUpdate", "content"}),
    "agent_thought_chunk": frozenset({"sessionUpdate", "content"}),
    "user_message_chunk": frozenset({"sessionUpdate", "content"}),
    "tool_call": frozenset(_TOOL),
    "tool_call_update": frozenset({*_TOOL, "rawOutput", "content"}),
    "plan": frozenset({"sessionUpdate", "entries"}),
    "available_commands_update": frozenset({"sessionUpdate", "availableCommands"}),
    "current_mode_update": frozenset({"sessionUpdate", "currentModeId"}),
    "config_option_update": frozenset({"sessionUpdate", "configOptions"}),
    "session_info_update": frozenset({"sessionUpdate", "title"}),
    "usage_update": frozenset({"sessionUpdate", "used", "size", "cost"}),
    "subagent_spawned": frozenset(
        {"sessionUpdate", "subagentSessionId", "name", "task", "capabilities", "_meta"}
    ),
    "subagent_state_update": frozenset({"sessionUpdate", "subagentSessionId", "state", "_meta"}),
}
_SECRET_KEY = re.compile(r"(?i)(token|secret|passw|api[_-]?key|authorization|cookie|credential)")
_TITLE_LIMIT = 1024
MAX_TOOL_OWNERS = 65536


class Normalizer:
    """Stateful mapping of one job's updates (routing, revisions, checklists, subagents)."""

    def __init__(
        self,
        *,
        workspace_root: str,
        text_limit: int = 16 * 1024,
        artifacts: ArtifactCheck = refuse_all,
    ) -> None:
        self._root = workspace_root.rstrip("/")
        self._limit = text_limit
        self.artifacts = artifacts
        self.session_id: str | None = None
        self.replay = False
        self.settled = False
        self.usage_seen = False
        self._plan_revisions: dict[str | None, int] = {}
        self.todos = TodoList()
        self.delegations = Delegations(text_limit=text_limit)
        #: Tool call id → the child session that started it (bounded: MAX_TOOL_OWNERS).
        self._tool_owner: dict[str, str] = {}
        self._kinds: dict[str, Handler] = {
            "agent_message_chunk": lambda u, c: self._chunk(u, "assistant"),
            "agent_thought_chunk": lambda u, c: self._chunk(u, "thought"),
            "user_message_chunk": lambda u, c: self._chunk(u, "user"),
            "tool_call": self._tool_call,
            "tool_call_update": self._tool_update,
            "plan": self._plan,
            "available_commands_update": self._commands,
            "current_mode_update": self._mode,
            "config_option_update": self._config,
            "session_info_update": self._info,
            "usage_update": self._usage,
            "subagent_spawned": self._spawned,
            "subagent_state_update": self._child_state,
        }

    def bind(self, session_id: str) -> None:
        """From now on, updates of other sessions must come from spawned children."""
        self.session_id = session_id

    def session_update(self, params: Any) -> Out:
        """Events for one ``session/update`` params object."""
        update = params.get("update") if isinstance(params, Mapping) else None
        kind = update.get("sessionUpdate") if isinstance(update, Mapping) else None
        if not isinstance(update, Mapping) or not isinstance(kind, str):
            return [self.provider_unmapped("session/update", params)]
        source = params.get("sessionId")
        child = None
        if self.session_id is not None and source != self.session_id:
            refusal = self._refusal(source, kind)
            if refusal is not None:
                return [refusal]
            child = source
        out = self._mapped(kind, update, child, params)
        if child is not None or self.replay:
            self._stamp(out, child)
        return out

    def _mapped(self, kind: str, update: Mapping[str, Any], child: str | None, raw: Any) -> Out:
        handler = self._kinds.get(kind)
        if handler is None:
            return [self.provider_unmapped(kind, raw)]
        try:
            out = handler(update, child)
        except (KeyError, TypeError, ValueError, AttributeError):
            return [self.provider_unmapped(kind, raw)]
        known = KNOWN_FIELDS[kind]
        if len(update) > len(known) or any(key not in known for key in update):
            out.extend(self._partial(kind, update, known))
        return out

    def provider_unmapped(self, kind: str, raw: Any) -> ProviderUnmapped:
        """What the agent said that no canonical event holds, kept (bounded)."""
        return ProviderUnmapped(kind=kind, raw=bound_json(raw, self._limit))

    def _partial(self, kind: str, update: Mapping[str, Any], known: frozenset[str]) -> Out:
        extra = {key: value for key, value in update.items() if key not in known}
        if not extra:
            return []
        return [ProviderUnmapped(kind=kind, raw=bound_json(extra, self._limit), partial=True)]

    # -- routing --------------------------------------------------------------------------

    def _refusal(self, source: Any, kind: str) -> Notice | None:
        if self.settled:
            reason = "turn_settled"
        elif self.delegations.live_child(source) is not None:
            return None
        elif self.delegations.known_child(source):
            reason = "child_settled"
        else:
            reason = "unknown_session"
        return notices.subagent_update_refused(source, kind, reason)

    def permission_source(
        self, session_id: Any, tool_call_id: str | None
    ) -> tuple[str | None, str | None]:
        """Who asks a ``session/request_permission``: ``(child_id, refusal_reason)``.

        A child may ask on its own session id, or on the parent's with the id of a tool
        the child started (both are reported for Cursor, docs/CURSOR_ACP_FACTS.md Q8).
        Either way the ask is the child's; a child that is not live (or a session nobody
        spawned) is refused.
        """
        if session_id is None or self.session_id is None or session_id == self.session_id:
            child = self._tool_owner.get(tool_call_id) if tool_call_id is not None else None
            if child is None or self.delegations.live_child(child) is not None:
                return child, None
            return child, "child_settled"
        child = session_id if self.delegations.known_child(session_id) else None
        if child is None:
            return None, "unknown_session"
        if self.settled:
            return child, "turn_settled"
        if self.delegations.live_child(child) is None:
            return child, "child_settled"
        return child, None

    def _stamp(self, out: Out, child: str | None) -> None:
        for event in out:
            if isinstance(event, Notice):
                if child is not None:
                    event.details = {**(event.details or {}), "child_id": child}
                continue
            if not isinstance(event, Attributed):  # every other event of an update is
                continue
            if child is not None and not isinstance(event, Delegation):
                event.child_id = child
            if self.replay:
                event.replay = True

    # -- Cursor extension requests (no sessionId: they belong to the root session) -------

    def extension(self, method: str, params: Any) -> Out:
        """Events for a non-blocking ``cursor/*`` request."""
        mapped = _EXTENSIONS.get(method)
        if mapped is None or not isinstance(params, Mapping):
            return [self.provider_unmapped(method, params)]
        handler, known = mapped
        try:
            out = handler(self, params)
        except (KeyError, TypeError, ValueError, AttributeError):
            return [self.provider_unmapped(method, params)]
        return out + self._partial(method, params, known)

    def _todos(self, params: Mapping[str, Any]) -> Out:
        return [TodosUpdated(**self.todos.apply(params))]

    def _task(self, params: Mapping[str, Any]) -> Out:
        return self.delegations.cursor_task(params)

    def _image(self, params: Mapping[str, Any]) -> Out:
        return artifacts.image_events(self.artifacts, params)

    # -- kinds ----------------------------------------------------------------------------

    def _chunk(self, update: Mapping[str, Any], role: Role) -> Out:
        content = update["content"]
        if content.get("type") == "text":
            return [MessageDelta(role=role, text=str(content["text"]))]
        raw = bound_json(content, self._limit)
        block = (
            dict(content)
            if not raw.truncated
            else {"type": str(content.get("type")), "truncated": True, "bytes": raw.bytes}
        )
        return [MessageDelta(role=role, text="", content=block)]

    def _tool_call(self, update: Mapping[str, Any], child: str | None) -> Out:
        refused: Out = []
        tool_call_id = str(update["toolCallId"])
        raw_input = update.get("rawInput")
        started = ToolStarted(
            tool_call_id=tool_call_id,
            title=_title(update.get("title")),
            kind=_opt_str(update.get("kind")),
            status=str(update.get("status") or "pending"),
            raw_input=self._raw_input(raw_input),
            locations=self._locations(update.get("locations"), refused),
        )
        out: Out = [started]
        if child is not None and len(self._tool_owner) < MAX_TOOL_OWNERS:
            self._tool_owner.setdefault(tool_call_id, child)
        if isinstance(raw_input, Mapping) and raw_input.get("_toolName") == "task":
            parent = child or self.session_id
            out += self.delegations.task_tool(tool_call_id, raw_input, parent)
        return out + refused

    def _tool_update(self, update: Mapping[str, Any], child: str | None) -> Out:
        refused: Out = []
        tool_call_id = str(update["toolCallId"])
        status = _opt_str(update.get("status"))
        fields: dict[str, Any] = {"tool_call_id": tool_call_id, "status": status}
        self._tool_fields(update, fields)
        content = update.get("content")
        fields["diffs"] = self._diffs(content, refused)
        fields["locations"] = self._locations(update.get("locations"), refused)
        # Only the fields set go out: ``title``, ``output``, ``exit_code`` and
        # ``raw_input`` are absent, not null, when the update did not carry them.
        event = ToolCompleted(**fields) if status in _TERMINAL_TOOL else ToolUpdated(**fields)
        out: Out = [event]
        if self.delegations.is_task_tool(tool_call_id):
            out += self.delegations.task_output(tool_call_id, status, update.get("rawOutput"))
        return out + self._resources(content, tool_call_id) + refused

    def _tool_fields(self, update: Mapping[str, Any], fields: dict[str, Any]) -> None:
        if update.get("title") is not None:
            fields["title"] = _title(update["title"])
        output = self._output(update)
        if output is not None:
            fields["output"] = output
        raw_output = update.get("rawOutput")
        if isinstance(raw_output, Mapping) and type(raw_output.get("exitCode")) is int:
            fields["exit_code"] = raw_output["exitCode"]
        if update.get("rawInput") is not None:
            fields["raw_input"] = self._raw_input(update["rawInput"])

    def _raw_input(self, raw_input: Any) -> Bounded | None:
        if raw_input is None:
            return None
        return bound_json(_redacted(raw_input), self._limit)

    def _output(self, update: Mapping[str, Any]) -> Bounded | None:
        texts = [
            str(block["content"]["text"])
            for block in update.get("content") or []
            if isinstance(block, Mapping)
            and block.get("type") == "content"
            and isinstance(block.get("content"), Mapping)
            and block["content"].get("type") == "text"
        ]
        if texts:
            return bound("\n".join(texts), self._limit)
        if update.get("rawOutput") is not None:
            return bound_json(update["rawOutput"], self._limit)
        return None

    def _resources(self, content: Any, tool_call_id: str) -> Out:
        """``resource_link`` blocks of a tool's content that name workspace files."""
        out: Out = []
        for block in content if isinstance(content, list) else []:
            inner = block.get("content") if isinstance(block, Mapping) else None
            if not isinstance(inner, Mapping) or inner.get("type") != "resource_link":
                continue
            uri = inner.get("uri")
            path = (
                uri[len("file://") :] if isinstance(uri, str) and uri.startswith("file://") else uri
            )
            out += artifacts.referenced(
                self.artifacts, path, "tool_resource", tool_call_id=tool_call_id
            )
        return out

    def _diffs(self, content: Any, refused: Out) -> list[DiffBlock]:
        diffs = []
        for block in content or []:
            if not isinstance(block, Mapping) or block.get("type") != "diff":
                continue
            path = self._relative(str(block.get("path", "")), refused)
            if path is None:
                continue
            old = block.get("oldText")
            diffs.append(
                DiffBlock(
                    path=path,
                    old_text=None if old is None else bound(str(old), self._limit),
                    new_text=bound(str(block.get("newText", "")), self._limit),
                )
            )
        return diffs

    def _locations(self, locations: Any, refused: Out) -> list[Location]:
        out = []
        for location in locations or []:
            if not isinstance(location, Mapping):
                continue
            path = self._relative(str(location.get("path", "")), refused)
            if path is not None:
                line = location.get("line")
                # A JSON true is no line number (and would be coerced to 1).
                number = line if isinstance(line, int) and not isinstance(line, bool) else None
                out.append(Location(path=path, line=number))
        return out

    def _relative(self, path: str, refused: Out) -> str | None:
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
        refused.append(notices.path_outside_workspace(path))
        return None

    def _plan(self, update: Mapping[str, Any], child: str | None) -> Out:
        revision = self._plan_revisions.get(child, 0) + 1
        self._plan_revisions[child] = revision
        entries = [
            PlanEntry(
                content=str(entry.get("content", "")),
                priority=_opt_str(entry.get("priority")),
                status=str(entry.get("status", "pending")),
            )
            for entry in update["entries"]
            if isinstance(entry, Mapping)
        ]
        return [PlanUpdated(revision=revision, entries=entries)]

    def _commands(self, update: Mapping[str, Any], child: str | None) -> Out:
        commands = [dict(c) for c in update["availableCommands"] if isinstance(c, Mapping)]
        return [CommandsAvailable(commands=commands)]

    def _mode(self, update: Mapping[str, Any], child: str | None) -> Out:
        return [ModeChanged(mode=str(update["currentModeId"]))]

    def _config(self, update: Mapping[str, Any], child: str | None) -> Out:
        options = [dict(o) for o in update["configOptions"] if isinstance(o, Mapping)]
        return [ConfigUpdated(config_options=options)]

    def _info(self, update: Mapping[str, Any], child: str | None) -> Out:
        title = update.get("title")
        if not isinstance(title, str):
            return [self.provider_unmapped("session_info_update", update)]
        return [SessionTitled(title=bounded(title, 1024)["text"])]

    def _usage(self, update: Mapping[str, Any], child: str | None) -> Out:
        self.usage_seen = True
        fields: dict[str, Any] = {"available": True, "source": "agent"}
        for key in ("used", "size"):
            if type(update.get(key)) is int:
                fields[key] = update[key]
        cost = update.get("cost")
        if isinstance(cost, Mapping) and _is_cost(cost):
            fields["cost"] = UsageCost(amount=float(cost["amount"]), currency=cost["currency"])
        malformed = {
            k: update[k] for k in ("used", "size", "cost") if k in update and k not in fields
        }
        usage = UsageReported(**fields)
        return [usage, *self._partial("usage_update", malformed, frozenset())]

    def _spawned(self, update: Mapping[str, Any], child: str | None) -> Out:
        try:
            return self.delegations.spawned(update, child or self.session_id)
        except Refused as refused:
            session_id = update.get("subagentSessionId")
            return [notices.subagent_update_refused(session_id, "subagent_spawned", refused.reason)]

    def _child_state(self, update: Mapping[str, Any], child: str | None) -> Out:
        try:
            return self.delegations.state_update(update, child or self.session_id)
        except Refused as refused:
            kind = "subagent_state_update"
            session_id = update.get("subagentSessionId")
            return [notices.subagent_update_refused(session_id, kind, refused.reason)]


_EXTENSIONS: dict[str, tuple[Callable[[Normalizer, Mapping[str, Any]], Out], frozenset[str]]] = {
    "cursor/update_todos": (Normalizer._todos, TODO_FIELDS),
    "cursor/task": (Normalizer._task, TASK_FIELDS),
    "cursor/generate_image": (
        Normalizer._image,
        frozenset({"toolCallId", "description", "filePath", "referenceImagePaths"}),
    ),
}


def _is_cost(cost: Any) -> bool:
    return (
        isinstance(cost, Mapping)
        and isinstance(cost.get("amount"), int | float)
        and not isinstance(cost.get("amount"), bool)
        and isinstance(cost.get("currency"), str)
    )


def _redacted(value: Any) -> Any:
    """``value`` with the values of secret-looking keys replaced (the emitter also
    scrubs every bound credential; this covers secrets the worker does not know)."""
    if isinstance(value, Mapping):
        return {
            k: "[REDACTED]" if _SECRET_KEY.search(str(k)) else _redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _title(value: Any) -> str | None:
    return None if value is None else bounded(str(value), _TITLE_LIMIT)["text"]


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
