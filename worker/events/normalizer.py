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

from collections.abc import Callable, Mapping
from typing import Any

from worker.events import artifacts, content
from worker.events.artifacts import ArtifactCheck, refuse_all
from worker.events.attribution import MAX_TOOL_OWNERS, Attribution, ToolOwners
from worker.events.bounded import bound_json, bounded
from worker.events.content import ContentMapper, Role
from worker.events.delegations import TASK_FIELDS, Delegations
from worker.events.models import (
    Bounded,
    EventData,
    PlanUpdated,
    ProviderUnmapped,
    SessionTitled,
    TodosUpdated,
    ToolUpdated,
    UsageReported,
)
from worker.events.todos import KNOWN_FIELDS as TODO_FIELDS
from worker.events.todos import TodoList
from worker.events.tool_calls import ToolCalls
from worker.rpc.oversize import OversizeLine

__all__ = ["KNOWN_FIELDS", "MAX_TOOL_OWNERS", "Normalizer", "Role"]

Out = list[EventData]
Handler = Callable[[Mapping[str, object], str | None], Out]

_TOOL = ("sessionUpdate", "toolCallId", "title", "kind", "status", "rawInput", "locations")
# ``messageId`` (ACP's message id, sent by claude-agent-acp and codex-acp on every chunk)
# only groups chunks into messages, which the stream of deltas already does.
_CHUNK = frozenset({"sessionUpdate", "content", "messageId"})
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "agent_message_chunk": _CHUNK,
    "agent_thought_chunk": _CHUNK,
    "user_message_chunk": _CHUNK,
    # ``content`` is not: its media go into ``tool.started``, the rest stays partial.
    "tool_call": frozenset(_TOOL),
    # ``_meta``: only its terminal keys are mapped (content.terminal_meta), the rest is
    # reported as partial.
    "tool_call_update": frozenset({*_TOOL, "rawOutput", "content", "_meta"}),
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


class Normalizer:
    """Stateful mapping of one job's updates (routing, revisions, checklists, subagents).

    It routes; what each kind becomes is delegated: field shapes to
    :class:`~worker.events.content.ContentMapper`, the tool lifecycle to
    :class:`~worker.events.tool_calls.ToolCalls`, whose update it is to
    :class:`~worker.events.attribution.Attribution`.
    """

    def __init__(
        self,
        *,
        workspace_root: str,
        text_limit: int = 16 * 1024,
        artifacts: ArtifactCheck = refuse_all,
    ) -> None:
        self._limit = text_limit
        self.session_id: str | None = None
        self.replay = False
        self.settled = False
        self.usage_seen = False
        #: Tool calls the agent started in this job's own turn (history replayed by
        #: ``session/load`` not counted): what ``expect.tool_calls`` checks.
        self.tool_calls = 0
        self._plan_revisions: dict[str | None, int] = {}
        self.todos = TodoList()
        self.delegations = Delegations(text_limit=text_limit)
        owners = ToolOwners()
        self._content = ContentMapper(root=workspace_root.rstrip("/"), limit=text_limit)
        self._attribution = Attribution(delegations=self.delegations, owners=owners)
        self._tools = ToolCalls(
            content=self._content, delegations=self.delegations, owners=owners, artifacts=artifacts
        )
        self._kinds = self._handlers()

    def _handlers(self) -> dict[str, Handler]:
        chunk = self._content.chunk
        return {
            "agent_message_chunk": lambda u, c: chunk(u, "assistant"),
            "agent_thought_chunk": lambda u, c: chunk(u, "thought"),
            "user_message_chunk": lambda u, c: chunk(u, "user"),
            "tool_call": self._tool_call,
            "tool_call_update": self._tools.updated,
            "plan": self._plan,
            "available_commands_update": content.commands,
            "current_mode_update": content.mode,
            "config_option_update": content.config,
            "session_info_update": self._info,
            "usage_update": self._usage,
            "subagent_spawned": lambda u, c: self._attribution.spawned(u, c or self.session_id),
            "subagent_state_update": (
                lambda u, c: self._attribution.child_state(u, c or self.session_id)
            ),
        }

    def _tool_call(self, update: Mapping[str, object], child: str | None) -> Out:
        if not self.replay:
            self.tool_calls += 1
        return self._tools.started(update, child, root=self.session_id)

    @property
    def artifacts(self) -> ArtifactCheck:
        """Checks the paths the agent names (set once the workspace is staged)."""
        return self._tools.artifacts

    @artifacts.setter
    def artifacts(self, check: ArtifactCheck) -> None:
        self._tools.artifacts = check

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
            refusal = self._attribution.refusal(source, kind, settled=self.settled)
            if refusal is not None:
                return [refusal]
            child = source
        out = self._mapped(kind, update, child, params)
        if child is not None or self.replay:
            self._attribution.stamp(out, child, replay=self.replay)
        return out

    def _mapped(
        self, kind: str, update: Mapping[str, object], child: str | None, raw: object
    ) -> Out:
        handler = self._kinds.get(kind)
        if handler is None:
            return [self.provider_unmapped(kind, raw)]
        try:
            out = handler(update, child)
        except (KeyError, TypeError, ValueError, AttributeError):
            return [self.provider_unmapped(kind, raw)]
        known = KNOWN_FIELDS[kind]
        if (
            len(update) > len(known)
            or any(key not in known for key in update)
            or (kind == "tool_call_update" and "_meta" in update)
        ):
            out.extend(self._partial(kind, update, known))
        return out

    def oversize_update(self, line: OversizeLine) -> Out:
        """The tool event of a ``session/update`` ``tool_call_update`` too large to read
        whole, from the fields its first bytes held: its output is the text its prefix
        held, cut (``truncated``, ``bytes`` -1: the full size is not known, the notice
        gives the line's), taken where a whole update's would be (its text content or
        terminal output, else its ``rawOutput`` as JSON). Nothing for any other oversize
        line."""
        update = line.update
        tool_call_id = update.get("toolCallId")
        if (
            line.method != "session/update"
            or update.get("sessionUpdate") != "tool_call_update"
            or not isinstance(tool_call_id, str)
        ):
            return []
        text = line.output_preview
        if text is None and self._tools.shows_raw_output(tool_call_id):  # before it ends
            text = line.raw_output_preview
        salvaged: dict[str, object] = {k: v for k, v in update.items() if v is not None}
        out = self.session_update({"sessionId": line.session_id, "update": salvaged})
        preview = bounded(text or "", self._limit)["text"]
        cut = Bounded(text=preview, truncated=True, bytes=-1)
        return [
            event.model_copy(update={"output": cut}) if isinstance(event, ToolUpdated) else event
            for event in out
        ]

    def provider_unmapped(self, kind: str, raw: object) -> ProviderUnmapped:
        """What the agent said that no canonical event holds, kept (bounded)."""
        return ProviderUnmapped(kind=kind, raw=bound_json(raw, self._limit))

    def _partial(self, kind: str, update: Mapping[str, object], known: frozenset[str]) -> Out:
        extra = {key: value for key, value in update.items() if key not in known}
        if kind == "tool_call_update" and "_meta" in update:
            # Of a tool update's ``_meta``, only what its terminal keys do not map.
            unmapped = content.terminal_meta(update["_meta"]).unmapped
            if unmapped != {}:
                extra["_meta"] = unmapped
        if kind == "tool_call" and "content" in extra:
            # Of a tool call's content, only what ``tool.started`` did not keep.
            leftovers = self._tools.content_leftovers(update["content"])
            if leftovers is None:
                pass  # none kept: the content as sent
            elif leftovers:
                extra["content"] = leftovers
            else:
                del extra["content"]
        if not extra:
            return []
        return [ProviderUnmapped(kind=kind, raw=bound_json(extra, self._limit), partial=True)]

    def permission_decided(self, tool_call_id: str, *, denied: bool) -> None:
        """The worker answered a tool's permission ask: a denied tool that then ends
        without output ends ``failed`` (Cursor reports it as a bare ``completed``)."""
        self._tools.permission_decided(tool_call_id, denied=denied)

    def close_delegations(self) -> Out:
        """At the job's end: every delegation still running (a background subagent the
        agent never reported finished) closed, ``cancelled`` with reason ``job_ended``."""
        return self.delegations.close_open("job_ended")

    def permission_source(
        self, session_id: Any, tool_call_id: str | None
    ) -> tuple[str | None, str | None]:
        """Who asks a ``session/request_permission``: ``(child_id, refusal_reason)``
        (see :meth:`~worker.events.attribution.Attribution.permission_source`)."""
        return self._attribution.permission_source(
            session_id, tool_call_id, root=self.session_id, settled=self.settled
        )

    # -- Cursor extension requests (no sessionId: they belong to the root session) -------

    def extension(self, method: str, params: object) -> Out:
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

    def _todos(self, params: Mapping[str, object]) -> Out:
        return [TodosUpdated(**self.todos.apply(params))]

    def _task(self, params: Mapping[str, object]) -> Out:
        return self.delegations.cursor_task(params)

    def _image(self, params: Mapping[str, object]) -> Out:
        return artifacts.image_events(self.artifacts, params)

    # -- kinds with state of their own ----------------------------------------------------

    def _plan(self, update: Mapping[str, object], child: str | None) -> Out:
        revision = self._plan_revisions.get(child, 0) + 1
        self._plan_revisions[child] = revision
        return [PlanUpdated(revision=revision, entries=content.plan_entries(update))]

    def _info(self, update: Mapping[str, object], child: str | None) -> Out:
        title = update.get("title")
        if not isinstance(title, str):
            return [self.provider_unmapped("session_info_update", update)]
        return [SessionTitled(title=bounded(title, 1024)["text"])]

    def prompt_usage(self, usage: object) -> Out:
        """The token counts of a prompt result (``usage``, ACP unstable) as
        ``usage.reported``; a ``usage`` that is not one is ``provider.unmapped``."""
        tokens = content.token_usage(usage)
        if tokens is None:
            return [self.provider_unmapped("session/prompt.usage", usage)]
        self.usage_seen = True
        return [UsageReported(available=True, source="agent", tokens=tokens)]

    def _usage(self, update: Mapping[str, object], child: str | None) -> Out:
        self.usage_seen = True
        fields, malformed = content.usage_fields(update)
        usage = UsageReported(**fields)
        return [usage, *self._partial("usage_update", malformed, frozenset())]


_EXTENSIONS: dict[str, tuple[Callable[[Normalizer, Mapping[str, object]], Out], frozenset[str]]] = {
    "cursor/update_todos": (Normalizer._todos, TODO_FIELDS),
    "cursor/task": (Normalizer._task, TASK_FIELDS),
    "cursor/generate_image": (
        Normalizer._image,
        frozenset({"toolCallId", "description", "filePath", "referenceImagePaths"}),
    ),
}
