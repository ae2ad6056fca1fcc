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
from worker.events.content import ContentMapper, opt_str, title
from worker.events.delegations import Delegations
from worker.events.models import EventData, ToolCompleted, ToolStarted, ToolUpdated

Out = list[EventData]

_TERMINAL_TOOL = {"completed", "failed"}


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
        event = ToolCompleted(**fields) if status in _TERMINAL_TOOL else ToolUpdated(**fields)
        out: Out = [event]
        if self._delegations.is_task_tool(tool_call_id):
            out += self._delegations.task_output(tool_call_id, status, update.get("rawOutput"))
        return out + self._resources(content, tool_call_id) + refused

    def _fields(self, update: Mapping[str, Any], fields: dict[str, Any]) -> None:
        if update.get("title") is not None:
            fields["title"] = title(update["title"])
        output = self._content.output(update)
        if output is not None:
            fields["output"] = output
        raw_output = update.get("rawOutput")
        if isinstance(raw_output, Mapping) and type(raw_output.get("exitCode")) is int:
            fields["exit_code"] = raw_output["exitCode"]
        if update.get("rawInput") is not None:
            fields["raw_input"] = self._content.raw_input(update["rawInput"])

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
