"""An ACP client with the session methods the worker itself never calls (``session/list``,
``session/resume``, ``session/fork``): the tests use them to check what agents, the
emulator first, answer to them."""

from __future__ import annotations

from collections.abc import Mapping

from worker.acp.client import AcpClient
from worker.rpc.wire import JsonObject, JsonValue


class SessionsClient(AcpClient):
    """:class:`AcpClient` plus the session methods only the tests ask for."""

    async def list_sessions(self, cwd: str | None = None) -> list[Mapping[str, JsonValue]]:
        """``session/list``: the agent's recorded sessions (no paging).

        Raises:
            Unsupported: the agent has no session/list.
        """
        result = await self._call("session/list", {} if cwd is None else {"cwd": cwd})
        sessions = result.get("sessions") if isinstance(result, Mapping) else None
        listed = sessions if isinstance(sessions, list) else []
        return [s for s in listed if isinstance(s, Mapping)]

    async def resume_session(self, session_id: str, cwd: str) -> Mapping[str, JsonValue]:
        """``session/resume`` (never inferred from the schema: asked).

        Raises:
            Unsupported: the agent answered method-not-found (Cursor does).
        """
        params: JsonObject = {"sessionId": session_id, "cwd": cwd, "mcpServers": []}
        result = await self._call("session/resume", params)
        return result if isinstance(result, Mapping) else {}

    async def fork_session(self, session_id: str, cwd: str) -> Mapping[str, JsonValue]:
        """``session/fork``.

        Raises:
            Unsupported: the agent answered method-not-found (Cursor does).
        """
        params: JsonObject = {"sessionId": session_id, "cwd": cwd, "mcpServers": []}
        result = await self._call("session/fork", params)
        return result if isinstance(result, Mapping) else {}
