"""The client side of one ACP session: typed calls and the inbound request handlers.

Calls translate JSON-RPC errors at this seam: -32000 becomes :class:`AuthRequired`,
-32601 :class:`Unsupported` (fork/resume are asked, never inferred from the schema), any
other error object an :class:`AgentError` naming the method. Inbound requests are
registered by their own modules: ``permissions``, ``fs``, ``terminal``, ``cursor``.

Requests are plain JSON objects built here; results are checked for the fields the
worker relies on and returned as the agent sent them. The ``agent-client-protocol``
package's schema models (``acp.schema``) are deliberately not imported at run time:
``python -X importtime -c 'import acp.schema'`` measured about 330 ms per process (on
top of pydantic), and building the requests from them took ``acp-worker run
examples/hello.json --quiet`` from 0.80 s to 1.17 s (median of 5 on a 2-core machine),
for a job whose own work is under 200 ms. Nor would they fit the results: they drop
fields they do not know (Cursor's ``models`` in a session result, new capabilities),
coerce values (a string ``"1"`` protocol version becomes 1) and close enumerations such
as the stop reason, while events report the agent's answer whole. The schema is
enforced by ``tests/unit/test_acp_schema.py`` instead (see :mod:`worker.rpc.wire`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker import __version__
from worker.errors import (
    AgentError,
    AuthRequired,
    ProtocolError,
    SessionNotFound,
    Unsupported,
)
from worker.events.bounded import bounded_json
from worker.rpc.connection import (
    AUTH_REQUIRED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Connection,
    RpcError,
)
from worker.rpc.wire import JsonObject, JsonValue

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClientCapabilities:
    """What the worker offers the agent at initialize.

    ``fs`` only when the host reaches the files the agent sees; ``terminal`` only when
    commands can run in the agent's own sandbox; ``subagents`` asks Cursor for child
    session updates; ``parameterized_models`` switches Cursor to base model ids plus
    per-parameter options (the two id spaces are disjoint, so it is chosen up front).
    """

    fs: bool = False
    terminal: bool = False
    subagents: bool = True
    parameterized_models: bool = False

    def to_wire(self) -> JsonObject:
        """ACP ``ClientCapabilities``; Cursor's two switches travel in ``_meta``, sent only
        when set."""
        caps: JsonObject = {
            "fs": {"readTextFile": self.fs, "writeTextFile": self.fs},
            "terminal": self.terminal,
        }
        meta: JsonObject = {}
        if self.subagents:
            meta["subagents"] = True
        if self.parameterized_models:
            meta["parameterizedModelPicker"] = True
        if meta:
            caps["_meta"] = meta
        return caps


class AcpClient:
    """Typed ACP calls over a :class:`Connection`."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    async def _call(
        self, method: str, request: JsonObject, *, timeout: float | None = -1
    ) -> JsonValue:
        try:
            result: JsonValue = await self.connection.request(method, request, timeout=timeout)
        except RpcError as exc:
            raise _translated(method, exc) from None
        return result

    async def initialize(self, capabilities: ClientCapabilities) -> Mapping[str, JsonValue]:
        """Negotiate protocol 1; returns the agent's answer as sent.

        Raises:
            ProtocolError: the agent answered another protocol version or a non-object.
        """
        result = await self._call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": capabilities.to_wire(),
                "clientInfo": {"name": "acp-worker", "version": __version__},
            },
        )
        if not isinstance(result, Mapping) or result.get("protocolVersion") != PROTOCOL_VERSION:
            raise ProtocolError(
                "agent does not speak ACP protocol version 1",
                answer=bounded_json(result, 1024)["text"],
            )
        return result

    async def authenticate(self, method_id: str, offered: object) -> None:
        """``authenticate`` with the pack's method, which the agent must have offered.

        Raises:
            AuthRequired: the agent does not offer the method, or refused it (its message
                is kept: e.g. no key in the environment).
        """
        methods = offered if isinstance(offered, list) else []
        ids = [m.get("id") for m in methods if isinstance(m, Mapping)]
        if method_id not in ids:
            raise AuthRequired(
                f"the pack authenticates with {method_id!r}, which the agent does not offer",
                method="authenticate",
                offered=[str(i) for i in ids][:16],
            )
        try:
            await self._call("authenticate", {"methodId": method_id})
        except AuthRequired:
            raise
        except AgentError as exc:
            raise AuthRequired(str(exc), auth_method=method_id, **exc.details) from None

    async def new_session(self, cwd: str) -> Mapping[str, JsonValue]:
        """Create a session; the result (as sent) must carry a string ``sessionId``.

        Raises:
            AuthRequired: the agent needs credentials (JSON-RPC -32000).
            ProtocolError: the result has no session id.
        """
        result = await self._call("session/new", {"cwd": cwd, "mcpServers": []})
        if not isinstance(result, Mapping) or not isinstance(result.get("sessionId"), str):
            raise ProtocolError("session/new returned no sessionId")
        return result

    async def load_session(self, session_id: str, cwd: str) -> Mapping[str, JsonValue]:
        """Resume a recorded session; its history is replayed before this returns.

        Raises:
            SessionNotFound: the agent rejected the id (-32602).
            Unsupported: the agent has no session/load (-32601).
            AuthRequired: the agent needs credentials.
        """
        params: JsonObject = {"sessionId": session_id, "cwd": cwd, "mcpServers": []}
        try:
            result = await self._call("session/load", params)
        except AgentError as exc:
            if exc.details.get("rpc_code") == INVALID_PARAMS:
                raise SessionNotFound(
                    f"the agent has no session {session_id!r} to resume", **exc.details
                ) from None
            raise
        return result if isinstance(result, Mapping) else {}

    async def set_mode(self, session_id: str, mode: str) -> None:
        await self._call("session/set_mode", {"sessionId": session_id, "modeId": mode})

    async def set_config_option(self, session_id: str, config_id: str, value: str) -> JsonValue:
        """Set a select option; returns the result as sent (its ``configOptions`` echo)."""
        params: JsonObject = {"sessionId": session_id, "configId": config_id, "value": value}
        return await self._call("session/set_config_option", params)

    async def set_model(self, session_id: str, model_id: str) -> None:
        """The legacy ``session/set_model`` Cursor still implements (not in the schema)."""
        await self._call("session/set_model", {"sessionId": session_id, "modelId": model_id})

    async def prompt(self, session_id: str, blocks: Sequence[Mapping[str, JsonValue]]) -> str:
        """Run one turn; returns the stop reason (:meth:`turn` for the whole result)."""
        return (await self.turn(session_id, blocks)).stop_reason

    async def turn(
        self, session_id: str, blocks: Sequence[Mapping[str, JsonValue]]
    ) -> PromptResult:
        """Run one turn; returns its stop reason and the usage the agent reported with it,
        if any (as sent). Waits as long as the turn lasts.

        A second prompt on a busy session *interrupts* the first (Cursor cancels it);
        ACP has no steering, so the worker never sends one concurrently. Any string is a
        stop reason: the schema's list is closed, an agent's may be newer.

        Raises:
            ProtocolError: the result carries no stop reason.
        """
        params: JsonObject = {"sessionId": session_id, "prompt": [dict(b) for b in blocks]}
        result = await self._call("session/prompt", params, timeout=None)
        stop = result.get("stopReason") if isinstance(result, Mapping) else None
        if not isinstance(stop, str) or not isinstance(result, Mapping):
            raise ProtocolError("session/prompt returned no stopReason")
        return PromptResult(stop, result.get("usage"))

    async def cancel(self, session_id: str) -> None:
        await self.connection.notify("session/cancel", {"sessionId": session_id})


@dataclass(frozen=True, slots=True)
class PromptResult:
    """A ``session/prompt`` result: its stop reason, and its ``usage`` as sent (None
    when absent; ACP marks it unstable, so it is checked where it is mapped)."""

    stop_reason: str
    usage: JsonValue = None


def _translated(method: str, exc: RpcError) -> AgentError:
    """-32000 → ``auth_required``, -32601 → ``unsupported``, else ``agent_error``."""
    detail: dict[str, object] = {"method": method, "rpc_code": exc.rpc_code}
    if exc.data is not None:
        detail["rpc_data"] = bounded_json(exc.data, 2048)["text"]
    if exc.rpc_code == AUTH_REQUIRED:
        return AuthRequired(f"agent requires authentication: {exc.message}", **detail)
    if exc.rpc_code == METHOD_NOT_FOUND:
        return Unsupported(f"the agent does not implement {method}", **detail)
    return AgentError(f"agent refused {method}: {exc.message}", **detail)
