"""``tool_call`` and ``tool_call_update`` → ``tool.started``, ``tool.updated``, ``tool.completed``.

Split from the normalizer: the tool lifecycle also records which child started a tool
(for permission asks), feeds Cursor's ``task`` tool to the delegations, and reports the
workspace files a tool's ``resource_link`` blocks name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from worker.events import artifacts
from worker.events.artifacts import ArtifactCheck
from worker.events.attribution import ToolOwners
from worker.events.bounded import bound, bound_json
from worker.events.content import ContentMapper, opt_str, terminal_meta, title
from worker.events.delegations import Delegations
from worker.events.media import tool_media
from worker.events.models import (
    Bounded,
    EventData,
    ProviderUnmapped,
    ToolCompleted,
    ToolFailure,
    ToolStarted,
    ToolUpdated,
)

Out = list[EventData]

_TERMINAL_TOOL = {"completed", "failed"}
#: Tools whose output came in terminal ``_meta`` remembered at once (the oldest is
#: forgotten first; a tool is forgotten anyway when it completes). The same bound holds
#: the tools whose permission ask the worker denied.
MAX_TERMINAL_TOOLS = 1024
_REASON_LIMIT = 1024
#: ``rawOutput`` keys that report a failed tool (FACTS §7), and the failure's code.
_FAILURE_KEYS: tuple[tuple[str, Literal["error", "rejected", "permission_denied"]], ...] = (
    ("error", "error"),
    ("rejected", "rejected"),
    ("permissionDenied", "permission_denied"),
)


class ToolCalls:
    """The tool lifecycle of one job (``artifacts`` checks the paths a tool names)."""

    def __init__(
        self,
        *,
        content: ContentMapper,
        delegations: Delegations,
        owners: ToolOwners,
        artifacts: ArtifactCheck,
    ) -> None:
        self._content = content
        self._delegations = delegations
        self._owners = owners
        self.artifacts = artifacts
        # Tools whose output streams through terminal ``_meta``: their ``rawOutput`` is
        # that output again (claude-agent-acp sends both), not more of it.
        self._terminal: dict[str, None] = {}
        # Tools whose permission ask was denied: Cursor ends a rejected tool with a bare
        # ``completed`` (no rawOutput), so only this says that it failed.
        self._denied: dict[str, None] = {}
        # The content of the tool call just started and what of it was left over, for
        # the normalizer's partial report of that same update.
        self._started_leftovers: tuple[Any, list[dict[str, Any]]] | None = None

    def content_leftovers(self, content: object) -> list[dict[str, Any]] | None:
        """What of the ``content`` of the tool call just started no ``tool.started``
        field holds; None when it kept no media (the content is then unmapped whole,
        as sent)."""
        started, self._started_leftovers = self._started_leftovers, None
        if started is None or started[0] is not content:
            return None
        return started[1]

    def permission_decided(self, tool_call_id: str, *, denied: bool) -> None:
        """The worker answered the permission ask of ``tool_call_id``."""
        self._denied.pop(tool_call_id, None)
        if denied:
            _remember(self._denied, tool_call_id)

    def started(self, update: Mapping[str, object], child: str | None, *, root: str | None) -> Out:
        """A ``tool_call``; a ``task`` tool also starts a delegation under its parent."""
        refused: Out = []
        tool_call_id = str(update["toolCallId"])
        raw_input = update.get("rawInput")
        started = ToolStarted(
            tool_call_id=tool_call_id,
            title=title(update.get("title")),
            kind=opt_str(update.get("kind")),
            status=str(update.get("status") or "pending"),
            raw_input=self._content.raw_input(raw_input),
            locations=self._content.locations(update.get("locations"), refused),
        )
        media = tool_media(update.get("content"), self._content.limit, media_only=True)
        if media.kept:
            started.content = media.kept
            self._started_leftovers = (update.get("content"), media.leftovers)
        out: Out = [started]
        if child is not None:
            self._owners.record(tool_call_id, child)
        if isinstance(raw_input, Mapping) and raw_input.get("_toolName") == "task":
            out += self._delegations.task_tool(tool_call_id, raw_input, child or root)
        return out + refused

    def updated(self, update: Mapping[str, object], child: str | None) -> Out:
        """A ``tool_call_update``: ``tool.completed`` when its status is terminal."""
        refused: Out = []
        tool_call_id = str(update["toolCallId"])
        status = opt_str(update.get("status"))
        fields: dict[str, Any] = {"tool_call_id": tool_call_id, "status": status}
        self._fields(update, fields)
        content = update.get("content")
        fields["diffs"] = self._content.diffs(content, refused)
        fields["locations"] = self._content.locations(update.get("locations"), refused)
        media = tool_media(content, self._content.limit)
        if media.kept:
            fields["content"] = media.kept
        if media.leftovers:
            raw = bound_json({"content": media.leftovers}, self._content.limit)
            refused.append(ProviderUnmapped(kind="tool_call_update", raw=raw, partial=True))
        # Only the fields set go out: ``title``, ``output``, ``exit_code``, ``raw_input``,
        # ``content`` and ``failure`` are absent, not null, when there is none.
        event: ToolUpdated
        if status in _TERMINAL_TOOL:
            event = self._completed(fields, update.get("rawOutput"))
            status = event.status
        else:
            event = ToolUpdated(**fields)
        out: Out = [event]
        if self._delegations.is_task_tool(tool_call_id):
            out += self._delegations.task_output(tool_call_id, status, update.get("rawOutput"))
        return out + self._resources(content, tool_call_id) + refused

    def _completed(self, fields: dict[str, Any], raw_output: object) -> ToolCompleted:
        """``tool.completed``: ``failed`` when ``rawOutput`` reports a failure, or when a
        tool whose permission ask was denied ends without any output."""
        tool_call_id = fields["tool_call_id"]
        self._terminal.pop(tool_call_id, None)
        denied = tool_call_id in self._denied
        self._denied.pop(tool_call_id, None)
        failure = tool_failure(raw_output)
        if failure is None and denied and raw_output is None:
            failure = ToolFailure(
                code="permission_denied", message="the worker denied the tool's permission ask"
            )
        if failure is not None:
            fields["status"] = "failed"
            fields["failure"] = failure
        return ToolCompleted(**fields)

    def _fields(self, update: Mapping[str, object], fields: dict[str, Any]) -> None:
        """``title``, ``output``, ``exit_code``, ``raw_input`` as the update has them.

        The output is the command output chunk of the terminal ``_meta``
        (:func:`~worker.events.content.terminal_meta`) when the update has one, else its
        text content; its ``rawOutput`` only while no terminal output came for the tool,
        so an agent that sends the output both ways shows it once. The exit status is
        ``rawOutput``'s ``exitCode`` or ``exit_code``, else ``terminal_exit``'s.
        """
        tool_call_id = fields["tool_call_id"]
        if update.get("title") is not None:
            fields["title"] = title(update["title"])
        terminal = terminal_meta(update.get("_meta"))
        output: Bounded | None
        if terminal.output is not None:
            self._remember_terminal(tool_call_id)
            output = bound(terminal.output, self._content.limit)
        else:
            output = self._content.output(update, raw=tool_call_id not in self._terminal)
        if output is not None:
            fields["output"] = output
        exit_code = _exit_code(update.get("rawOutput"))
        if exit_code is None:
            exit_code = terminal.exit_code
        if exit_code is not None:
            fields["exit_code"] = exit_code
        if update.get("rawInput") is not None:
            fields["raw_input"] = self._content.raw_input(update["rawInput"])

    def shows_raw_output(self, tool_call_id: str) -> bool:
        """Whether a ``rawOutput`` of this tool is its output (no terminal output came
        for it, which that would repeat)."""
        return tool_call_id not in self._terminal

    def _remember_terminal(self, tool_call_id: str) -> None:
        _remember(self._terminal, tool_call_id)

    def _resources(self, content: object, tool_call_id: str) -> Out:
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


def _remember(tools: dict[str, None], tool_call_id: str) -> None:
    """Add ``tool_call_id`` to a bounded set of tools (the oldest forgotten first)."""
    if tool_call_id not in tools and len(tools) >= MAX_TERMINAL_TOOLS:
        del tools[next(iter(tools))]
    tools[tool_call_id] = None


def tool_failure(raw_output: object) -> ToolFailure | None:
    """What a tool's ``rawOutput`` says went wrong, in Cursor's shapes (FACTS §7):
    ``{error}``, ``{rejected}``, ``{permissionDenied}`` (a value that is not false,
    null or empty), or an exit code other than 0. None: it reports no failure."""
    if not isinstance(raw_output, Mapping):
        return None
    for key, code in _FAILURE_KEYS:
        value = raw_output.get(key)
        if value is not None and value is not False and value not in ("", {}, []):
            return ToolFailure(code=code, message=_reason(key, value))
    exit_code = _exit_code(raw_output)
    if exit_code is not None and exit_code != 0:
        return ToolFailure(code="exit_code", message=f"exit code {exit_code}")
    return None


def _reason(key: str, value: object) -> str:
    """The agent's own words for a failure (bounded), or its key when it gave none."""
    if value is True:
        return key
    if isinstance(value, str):
        return bound(value, _REASON_LIMIT).text
    return bound_json(value, _REASON_LIMIT).text


def _exit_code(raw_output: object) -> int | None:
    """A tool's exit status in its ``rawOutput``: ``exitCode`` (Cursor, ACP's terminal
    shape) or ``exit_code`` (codex-acp's command without a terminal); a JSON ``true``
    is none."""
    if not isinstance(raw_output, Mapping):
        return None
    for key in ("exitCode", "exit_code"):
        code = raw_output.get(key)
        if type(code) is int:
            return code
    return None
