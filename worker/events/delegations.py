"""Subagent tasks: the Task tool, ``cursor/task`` and the subagent updates, correlated.

One task is keyed by the parent's Task ``toolCallId`` (and, once spawned, by its child
session id). Its facts arrive from up to four places in any order — the Task
``tool_call`` (prompt, description, type), its completion (``durationMs``,
``isBackground``), ``cursor/task`` (model, agent id) and ``subagent_spawned`` /
``subagent_state_update`` (child session, role, terminal state) — and every
``delegation.*`` event carries the complete merged snapshot.

Identity is checked, never assumed: a second spawn of a known child, or a spawn naming a
Task tool of another session, is refused (the caller turns the reason into a notice).
A ``disconnected`` child is a failed child.

The tasks one job tracks are bounded (:data:`MAX_TASKS`): past it the oldest *finished*
task is forgotten, with a notice (``delegation_evicted``); when every tracked task is
still running, a new one is refused (``too_many_tasks``: a notice, and the update kept as
``provider.unmapped``), never a running one dropped. At the job's end, a task still
running (a background child nobody reported finished) is closed ``cancelled``, reason
``job_ended`` (:meth:`Delegations.close_open`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from worker.errors import WorkerError
from worker.events import notices
from worker.events.bounded import bound, bound_json
from worker.events.models import (
    Delegation,
    DelegationCompleted,
    DelegationStarted,
    DelegationUpdated,
    EventData,
    ProviderUnmapped,
)

Out = list[EventData]
State = Literal["running", "completed", "failed", "cancelled"]

TERMINAL_STATES: dict[str, tuple[State, str | None]] = {
    "completed": ("completed", None),
    "failed": ("failed", None),
    "cancelled": ("cancelled", None),
    "disconnected": ("failed", "disconnected"),
}
#: Subagent tasks tracked at once per job (Task tools, ``cursor/task``, spawned children).
MAX_TASKS = 512
TASK_FIELDS = frozenset(
    {"toolCallId", "description", "prompt", "subagentType", "model", "agentId", "durationMs"}
)


class Refused(WorkerError):
    """An update that contradicts what is known about a task; ``reason`` is stable."""

    code = "delegation_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason=reason)
        self.reason = reason


@dataclass(slots=True)
class _Task:
    tool_call_id: str | None
    child_id: str | None = None
    parent_id: str | None = None
    state: State = "running"
    reason: str | None = None
    role: str | None = None
    model: str | None = None
    model_is_final: bool = False
    description: str | None = None
    task: str | None = None
    subagent_type: str | None = None
    agent_id: str | None = None
    background: bool | None = None
    duration_ms: int | None = None
    announced: bool = False
    finished: bool = False
    last: Delegation | None = None


class Delegations:
    """Every subagent task of one job."""

    def __init__(self, *, text_limit: int) -> None:
        self._limit = text_limit
        self._by_tool: dict[str, _Task] = {}
        self._by_child: dict[str, _Task] = {}
        #: Every tracked task, oldest first (keyed by identity: a task may have no ids).
        self._tasks: dict[int, _Task] = {}
        self._notices: Out = []  # evictions, sent before the next delegation event

    def live_child(self, session_id: object) -> _Task | None:
        """The task of a spawned child that has not reached a terminal state."""
        task = self._by_child.get(session_id) if isinstance(session_id, str) else None
        return task if task is not None and not task.finished else None

    def known_child(self, session_id: object) -> bool:
        return isinstance(session_id, str) and session_id in self._by_child

    def is_task_tool(self, tool_call_id: str) -> bool:
        return tool_call_id in self._by_tool

    # -- sources ------------------------------------------------------------------------

    def task_tool(
        self, tool_call_id: str, raw_input: Mapping[str, object], parent: str | None
    ) -> Out:
        """The parent's Task ``tool_call`` (``rawInput._toolName == "task"``)."""
        try:
            task = self._task(tool_call_id)
        except Refused as refused:
            return [notices.subagent_update_refused(tool_call_id, "task", refused.reason)]
        task.parent_id = task.parent_id or parent
        task.description = _str(raw_input.get("description")) or task.description
        task.task = _str(raw_input.get("prompt")) or task.task
        task.subagent_type = task.subagent_type or subagent_type(raw_input.get("subagentType"))
        return self._emit(task)

    def task_output(self, tool_call_id: str, status: str | None, raw_output: object) -> Out:
        """An update of a Task tool: duration and background flag; its end when childless."""
        task = self._by_tool[tool_call_id]
        if isinstance(raw_output, Mapping):
            task.duration_ms = _int(raw_output.get("durationMs"), task.duration_ms)
            if isinstance(raw_output.get("isBackground"), bool):
                task.background = raw_output["isBackground"]
        if status == "failed" and task.child_id is None:
            task.state, task.reason = "failed", "tool_failed"
        elif status == "completed" and task.child_id is None and not task.background:
            task.state = "completed"
        return self._emit(task)

    def cursor_task(self, params: Mapping[str, object]) -> Out:
        """``cursor/task``: the model (authoritative, even for custom agents) and ids."""
        tool_call_id = str(params["toolCallId"])
        try:
            task = self._task(tool_call_id)
        except Refused as refused:
            kept = ProviderUnmapped(kind="cursor/task", raw=bound_json(params, self._limit))
            notice = notices.subagent_update_refused(tool_call_id, "cursor/task", refused.reason)
            return [notice, kept]
        task.description = _str(params.get("description")) or task.description
        task.task = _str(params.get("prompt")) or task.task
        task.subagent_type = subagent_type(params.get("subagentType")) or task.subagent_type
        model = params.get("model")
        if isinstance(model, str):
            task.model, task.model_is_final = model, True
        task.agent_id = _str(params.get("agentId")) or task.agent_id
        task.duration_ms = _int(params.get("durationMs"), task.duration_ms)
        return self._emit(task)

    def spawned(self, update: Mapping[str, object], parent: str | None) -> Out:
        """``subagent_spawned`` on ``parent``'s session.

        Raises:
            Refused: the child is already known, or its Task tool belongs elsewhere.
        """
        child = str(update["subagentSessionId"])
        meta = _cursor_meta(update)
        tool_call_id = _str(meta.get("toolCallId"))
        if child in self._by_child:
            raise Refused("duplicate_spawn")
        task = self._task(tool_call_id) if tool_call_id else self._track(_Task(None))
        if task.child_id is not None:
            raise Refused("task_already_has_a_child")
        if task.parent_id is not None and task.parent_id != parent:
            raise Refused("foreign_parent")
        self._bind_child(task, child, parent, update, meta)
        return self._emit(task)

    def _bind_child(
        self,
        task: _Task,
        child: str,
        parent: str | None,
        update: Mapping[str, object],
        meta: Mapping[str, object],
    ) -> None:
        task.child_id, task.parent_id = child, parent
        self._by_child[child] = task
        task.role = _str(update.get("name")) or task.role
        task.task = _str(update.get("task")) or task.task
        task.agent_id = task.agent_id or _str(meta.get("agentId"))
        if not task.model_is_final:
            task.model = _str(meta.get("model")) or task.model

    def state_update(self, update: Mapping[str, object], parent: str | None) -> Out:
        """``subagent_state_update``: terminal only (there is no "running" state).

        Raises:
            Refused: an unknown child, one reported by a session that is not its parent,
                or a state that is not terminal.
        """
        task = self._by_child.get(str(update["subagentSessionId"]))
        if task is None:
            raise Refused("unknown_child")
        if task.parent_id != parent:
            raise Refused("foreign_parent")
        if task.finished:
            raise Refused("child_settled")
        state = TERMINAL_STATES.get(str(update.get("state")))
        if state is None:
            raise Refused("unknown_state")
        task.state, task.reason = state
        return self._emit(task)

    # -- snapshots ----------------------------------------------------------------------

    def _task(self, tool_call_id: str) -> _Task:
        """The task of a Task tool, tracked from now on if it is new.

        Raises:
            Refused: ``too_many_tasks`` (see :meth:`_track`).
        """
        task = self._by_tool.get(tool_call_id)
        if task is None:
            task = self._by_tool[tool_call_id] = self._track(_Task(tool_call_id))
        return task

    def _track(self, task: _Task) -> _Task:
        """``task`` tracked, the oldest finished task forgotten first when full.

        Raises:
            Refused: ``too_many_tasks``: every tracked task is still running.
        """
        if len(self._tasks) >= MAX_TASKS:
            oldest = next((t for t in self._tasks.values() if t.finished), None)
            if oldest is None:
                raise Refused("too_many_tasks")
            self._forget(oldest)
        self._tasks[id(task)] = task
        return task

    def _forget(self, task: _Task) -> None:
        del self._tasks[id(task)]
        if task.tool_call_id is not None and self._by_tool.get(task.tool_call_id) is task:
            del self._by_tool[task.tool_call_id]
        if task.child_id is not None and self._by_child.get(task.child_id) is task:
            del self._by_child[task.child_id]
        self._notices.append(
            notices.delegation_evicted(task.tool_call_id, task.child_id, task.state, MAX_TASKS)
        )

    def close_open(self, reason: str) -> Out:
        """Every task still running closed ``cancelled`` with ``reason`` (the job ended:
        whatever the agent left running is gone with it)."""
        out: Out = []
        for task in list(self._tasks.values()):
            if task.state == "running" and task.announced:
                task.state, task.reason = "cancelled", reason
                out += self._emit(task)
        return out

    def _emit(self, task: _Task) -> Out:
        """started (first sight), completed (first terminal state), else updated — the
        latter only when the snapshot changed."""
        evicted, self._notices = self._notices, []
        snapshot = self._snapshot(task)
        if snapshot == task.last:
            return evicted
        task.last = snapshot
        kinds: list[type[Delegation]] = []
        if not task.announced:
            task.announced = True
            kinds.append(DelegationStarted)
        if task.state != "running" and not task.finished:
            task.finished = True
            kinds.append(DelegationCompleted)
        elif not kinds:
            kinds.append(DelegationUpdated)
        fields = snapshot.wire()
        return evicted + [kind(**fields) for kind in kinds]

    def _snapshot(self, task: _Task) -> Delegation:
        """The task's snapshot (compared with the last one sent, never sent itself)."""
        return Delegation(
            child_id=task.child_id,
            tool_call_id=task.tool_call_id,
            parent_id=task.parent_id,
            state=task.state,
            reason=task.reason,
            role=task.role or task.subagent_type,
            model=task.model,
            description=task.description,
            task=None if task.task is None else bound(task.task, self._limit),
            subagent_type=task.subagent_type,
            agent_id=task.agent_id,
            background=task.background,
            duration_ms=task.duration_ms,
        )


def subagent_type(value: object) -> str | None:
    """Cursor's subagent type, an object such as ``{"custom": {"name": "x"}}``, as text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    key, inner = next(iter(value.items()))
    if key != "custom" or not isinstance(inner, Mapping):
        return str(key)
    name = inner.get("name")
    detail = name if isinstance(name, str) else subagent_type(inner)
    return f"custom:{detail}" if detail else "custom"


def _cursor_meta(update: Mapping[str, object]) -> Mapping[str, object]:
    meta = update.get("_meta")
    cursor = meta.get("cursor") if isinstance(meta, Mapping) else None
    return cursor if isinstance(cursor, Mapping) else {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
