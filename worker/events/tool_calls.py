"""``tool_call`` and ``tool_call_update`` → ``tool.started``, ``tool.updated``, ``tool.completed``.

Split from the normalizer: the tool lifecycle also records which child started a tool
(for permission asks), feeds Cursor's ``task`` tool to the delegations, and reports the
workspace files a tool's ``resource_link`` blocks name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.events import artifacts
from worker.events.artifacts import ArtifactCheck
from worker.events.attribution import ToolOwners
from worker.events.bounded import bound
from worker.events.content import ContentMapper, opt_str, terminal_meta, title
from worker.events.delegations import Delegations
from worker.events.models import Bounded, EventData, ToolCompleted, ToolStarted, ToolUpdated

Out = list[EventData]

_TERMINAL_TOOL = {"completed", "failed"}
#: Tools whose output came in terminal ``_meta`` remembered at once (the oldest is
#: forgotten first; a tool is forgotten anyway when it completes).
MAX_TERMINAL_TOOLS = 1024


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

    def started(self, update: Mapping[str, Any], child: str | None, *, root: str | None) -> Out:
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
        out: Out = [started]
        if child is not None:
            self._owners.record(tool_call_id, child)
        if isinstance(raw_input, Mapping) and raw_input.get("_toolName") == "task":
            out += self._delegations.task_tool(tool_call_id, raw_input, child or root)
        return out + refused

    def updated(self, update: Mapping[str, Any], child: str | None) -> Out:
        """A ``tool_call_update``: ``tool.completed`` when its status is terminal."""
        refused: Out = []
        tool_call_id = str(update["toolCallId"])
        status = opt_str(update.get("status"))
        fields: dict[str, Any] = {"tool_call_id": tool_call_id, "status": status}
        self._fields(update, fields)
        content = update.get("content")
        fields["diffs"] = self._content.diffs(content, refused)
        fields["locations"] = self._content.locations(update.get("locations"), refused)
        # Only the fields set go out: ``title``, ``output``, ``exit_code`` and
        # ``raw_input`` are absent, not null, when the update did not carry them.
        if status in _TERMINAL_TOOL:
            self._terminal.pop(tool_call_id, None)
        event = ToolCompleted(**fields) if status in _TERMINAL_TOOL else ToolUpdated(**fields)
        out: Out = [event]
        if self._delegations.is_task_tool(tool_call_id):
            out += self._delegations.task_output(tool_call_id, status, update.get("rawOutput"))
        return out + self._resources(content, tool_call_id) + refused

    def _fields(self, update: Mapping[str, Any], fields: dict[str, Any]) -> None:
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

    def _remember_terminal(self, tool_call_id: str) -> None:
        terminal = self._terminal
        if tool_call_id not in terminal and len(terminal) >= MAX_TERMINAL_TOOLS:
            del terminal[next(iter(terminal))]
        terminal[tool_call_id] = None

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


def _exit_code(raw_output: Any) -> int | None:
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
