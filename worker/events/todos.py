"""Cursor's execution checklist (``cursor/update_todos``): merged by native id.

Every update yields the complete checklist with an increasing revision, so a reader
never has to replay deltas. ``merge: false`` replaces the list; ``merge: true`` updates
items by id and appends new ones, keeping first-seen order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CANONICAL = frozenset({"pending", "in_progress", "completed", "cancelled"})
KNOWN_FIELDS = frozenset({"toolCallId", "todos", "merge"})


class TodoList:
    """The checklist of one session."""

    def __init__(self) -> None:
        self.revision = 0
        self._items: dict[str, dict[str, object]] = {}

    def apply(self, params: Mapping[str, object]) -> dict[str, Any]:
        """The ``todos.updated`` data after applying one update.

        Raises:
            KeyError, TypeError: ``todos`` is missing or not a list of objects with ids.
        """
        todos = params["todos"]
        if not isinstance(todos, list):
            raise TypeError("todos is not a list")
        merge = params.get("merge") is True
        if not merge:
            self._items = {}
        for todo in todos:
            self._merge(todo)
        self.revision += 1
        tool_call_id = params.get("toolCallId")
        return {
            "revision": self.revision,
            "todos": [dict(item) for item in self._items.values()],
            "merge": merge,
            "tool_call_id": tool_call_id if isinstance(tool_call_id, str) else None,
        }

    def _merge(self, todo: Mapping[str, object]) -> None:
        todo_id = str(todo["id"])
        known = self._items.get(todo_id)
        content = todo.get("content", known["content"] if known else "")
        native = todo.get("status", known["native_status"] if known else "pending")
        self._items[todo_id] = {
            "id": todo_id,
            "content": str(content),
            "status": str(native) if native in CANONICAL else "unknown",
            "native_status": str(native),
        }
