"""The client side of one ACP session: typed calls and the inbound request handlers.

Calls translate JSON-RPC errors at this seam: -32000 becomes :class:`AuthRequired`, any
other error object an :class:`AgentError` naming the method. Inbound requests the worker
answers itself live here (permissions); dialect-specific ones (``cursor/*``) are
registered by their dialect module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from worker import __version__
from worker.acp.connection import AUTH_REQUIRED, Connection, RpcError
from worker.errors import AgentError, AuthRequired, ProtocolError
from worker.events.bounded import bounded_json

PROTOCOL_VERSION = 1
Emit = Callable[[str, dict[str, Any]], Awaitable[Any]]


class AcpClient:
    """Typed ACP calls over a :class:`Connection`."""

    def __init__(self, connection: Connection, *, emit: Emit) -> None:
        self.connection = connection
        self._emit = emit
        connection.route("session/request_permission", self._permission)

    async def _call(self, method: str, params: Any, *, timeout: float | None = -1) -> Any:
        try:
            return await self.connection.request(method, params, timeout=timeout)
        except RpcError as exc:
            detail = {"method": method, "rpc_code": exc.code}
            if exc.data is not None:
                detail["rpc_data"] = bounded_json(exc.data, 2048)["text"]
            if exc.code == AUTH_REQUIRED:
                raise AuthRequired(
                    f"agent requires authentication: {exc.message}", **detail
                ) from None
            raise AgentError(f"agent refused {method}: {exc.message}", **detail) from None

    async def initialize(self) -> Mapping[str, Any]:
        """Negotiate protocol 1.

        Raises:
            ProtocolError: the agent answered another protocol version or a non-object.
        """
        result = await self._call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
                "clientInfo": {"name": "acp-worker", "version": __version__},
            },
        )
        if not isinstance(result, Mapping) or result.get("protocolVersion") != PROTOCOL_VERSION:
            raise ProtocolError(
                "agent does not speak ACP protocol version 1",
                answer=bounded_json(result, 1024)["text"],
            )
        return result

    async def new_session(self, cwd: str) -> Mapping[str, Any]:
        """Create a session; the result must carry a string ``sessionId``.

        Raises:
            AuthRequired: the agent needs credentials (JSON-RPC -32000).
            ProtocolError: the result has no session id.
        """
        result = await self._call("session/new", {"cwd": cwd, "mcpServers": []})
        if not isinstance(result, Mapping) or not isinstance(result.get("sessionId"), str):
            raise ProtocolError("session/new returned no sessionId")
        return result

    async def set_mode(self, session_id: str, mode: str) -> None:
        await self._call("session/set_mode", {"sessionId": session_id, "modeId": mode})

    async def set_config_option(self, session_id: str, config_id: str, value: str) -> Any:
        params = {"sessionId": session_id, "configId": config_id, "value": value}
        return await self._call("session/set_config_option", params)

    async def set_model(self, session_id: str, model_id: str) -> None:
        await self._call("session/set_model", {"sessionId": session_id, "modelId": model_id})

    async def prompt(self, session_id: str, blocks: list[dict[str, Any]]) -> str:
        """Run one turn; returns the stop reason. Waits as long as the turn lasts.

        Raises:
            ProtocolError: the result carries no stop reason.
        """
        result = await self._call(
            "session/prompt", {"sessionId": session_id, "prompt": blocks}, timeout=None
        )
        stop = result.get("stopReason") if isinstance(result, Mapping) else None
        if not isinstance(stop, str):
            raise ProtocolError("session/prompt returned no stopReason")
        return stop

    async def cancel(self, session_id: str) -> None:
        await self.connection.notify("session/cancel", {"sessionId": session_id})

    async def _permission(self, params: Any) -> Any:
        """Deny by default: pick the agent's one-time reject option, never an "always"."""
        options = params.get("options") if isinstance(params, Mapping) else None
        reject = next(
            (
                o.get("optionId")
                for o in options or []
                if isinstance(o, Mapping) and o.get("kind") == "reject_once"
            ),
            None,
        )
        title = params.get("toolCall", {}).get("title") if isinstance(params, Mapping) else None
        await self._emit(
            "notice",
            {
                "level": "info",
                "code": "permission_denied",
                "message": "a permission request was denied by the job's policy (deny)",
                "details": {"title": bounded_json(title, 512)["text"]},
            },
        )
        if reject is None:
            return {"outcome": {"outcome": "cancelled"}}
        return {"outcome": {"outcome": "selected", "optionId": reject}}
