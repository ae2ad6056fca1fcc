"""Cursor's ACP dialect: the five ``cursor/*`` extension methods.

Cursor sends them as JSON-RPC *requests with ids* (its docs call three of them
notifications) and none carries a ``sessionId``. The non-blocking three are acknowledged
at once and never turned into questions; the two blocking ones (questions and plans)
need a durable interaction channel — until that exists they are answered ``cancelled``
with a visible notice, never silently. Every payload is kept as ``provider.unmapped``.
"""

from __future__ import annotations

from typing import Any

from worker.acp.client import Emit
from worker.acp.connection import Connection
from worker.events.bounded import bounded_json

NON_BLOCKING = ("cursor/update_todos", "cursor/task", "cursor/generate_image")
BLOCKING = ("cursor/ask_question", "cursor/create_plan")
RAW_LIMIT = 16 * 1024


class CursorDialect:
    """Registers handlers for Cursor's extension requests on a connection."""

    def __init__(self, connection: Connection, *, emit: Emit) -> None:
        self._emit = emit
        for method in NON_BLOCKING:
            connection.route(method, self._acknowledger(method))
        for method in BLOCKING:
            connection.route(method, self._decliner(method))

    def _acknowledger(self, method: str) -> Any:
        async def acknowledge(params: Any) -> dict[str, Any]:
            await self._keep(method, params)
            return {}

        return acknowledge

    def _decliner(self, method: str) -> Any:
        async def decline(params: Any) -> dict[str, Any]:
            await self._keep(method, params)
            await self._emit(
                "notice",
                {
                    "level": "warning",
                    "code": "interaction_unavailable",
                    "message": f"{method} needs an answer from the control plane; this worker "
                    "has no interaction channel yet, so it was answered cancelled",
                    "details": {"method": method},
                },
            )
            return {"outcome": {"outcome": "cancelled"}}

        return decline

    async def _keep(self, method: str, params: Any) -> None:
        await self._emit(
            "provider.unmapped", {"kind": method, "raw": bounded_json(params, RAW_LIMIT)}
        )
