"""Whose an update or a permission ask is: the root session's, or a spawned subagent's.

Split from the normalizer because attribution is its own rule set: updates of a live
child carry its ``child_id`` (never flattened into the parent); an unknown session, a
child that already ended, or any child after the turn settled is refused with a notice;
a permission ask on the parent's session with the id of a tool a child started is the
child's. The normalizer owns the flags (``session_id``, ``settled``, ``replay``) because
the job sets them on it; they are passed in here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.events import notices
from worker.events.delegations import Delegations, Refused
from worker.events.models import Attributed, Delegation, EventData, Notice

Out = list[EventData]

MAX_TOOL_OWNERS = 65536


class ToolOwners:
    """Tool call id → the child session that started it (bounded: MAX_TOOL_OWNERS)."""

    __slots__ = ("_owner",)

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}

    def record(self, tool_call_id: str, child: str) -> None:
        """The first child to start ``tool_call_id`` owns it; past the bound, nobody new."""
        if len(self._owner) < MAX_TOOL_OWNERS:
            self._owner.setdefault(tool_call_id, child)

    def get(self, tool_call_id: str | None) -> str | None:
        return self._owner.get(tool_call_id) if tool_call_id is not None else None


class Attribution:
    """Routing of updates and asks to the root session or a live child."""

    def __init__(self, *, delegations: Delegations, owners: ToolOwners) -> None:
        self.delegations = delegations
        self.owners = owners

    def refusal(self, source: object, kind: str, *, settled: bool) -> Notice | None:
        """The notice refusing an update of session ``source`` (not the root), or None
        when it comes from a live child."""
        if settled:
            reason = "turn_settled"
        elif self.delegations.live_child(source) is not None:
            return None
        elif self.delegations.known_child(source):
            reason = "child_settled"
        else:
            reason = "unknown_session"
        return notices.subagent_update_refused(source, kind, reason)

    def permission_source(
        self, session_id: Any, tool_call_id: str | None, *, root: str | None, settled: bool
    ) -> tuple[str | None, str | None]:
        """Who asks a ``session/request_permission``: ``(child_id, refusal_reason)``.

        A child may ask on its own session id, or on the parent's with the id of a tool
        the child started (both are reported for Cursor, docs/CURSOR_ACP_FACTS.md Q8).
        Either way the ask is the child's; a child that is not live (or a session nobody
        spawned) is refused.
        """
        if session_id is None or root is None or session_id == root:
            child = self.owners.get(tool_call_id)
            if child is None or self.delegations.live_child(child) is not None:
                return child, None
            return child, "child_settled"
        child = session_id if self.delegations.known_child(session_id) else None
        if child is None:
            return None, "unknown_session"
        if settled:
            return child, "turn_settled"
        if self.delegations.live_child(child) is None:
            return child, "child_settled"
        return child, None

    @staticmethod
    def stamp(out: Out, child: str | None, *, replay: bool) -> None:
        """Mark ``out`` as the child's (notices in their details) and as replayed."""
        for event in out:
            if isinstance(event, Notice):
                if child is not None:
                    event.details = {**(event.details or {}), "child_id": child}
                continue
            if not isinstance(event, Attributed):  # every other event of an update is
                continue
            if child is not None and not isinstance(event, Delegation):
                event.child_id = child
            if replay:
                event.replay = True

    def spawned(self, update: Mapping[str, object], parent: str | None) -> Out:
        """A ``subagent_spawned`` update: the delegation, or a refusal notice."""
        try:
            return self.delegations.spawned(update, parent)
        except Refused as refused:
            session_id = update.get("subagentSessionId")
            return [notices.subagent_update_refused(session_id, "subagent_spawned", refused.reason)]

    def child_state(self, update: Mapping[str, object], parent: str | None) -> Out:
        """A ``subagent_state_update``: the delegation's new state, or a refusal notice."""
        try:
            return self.delegations.state_update(update, parent)
        except Refused as refused:
            kind = "subagent_state_update"
            session_id = update.get("subagentSessionId")
            return [notices.subagent_update_refused(session_id, kind, refused.reason)]
