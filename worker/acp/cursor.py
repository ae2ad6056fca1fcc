"""Cursor's ACP dialect: the five ``cursor/*`` extension methods.

Cursor sends them as JSON-RPC *requests with ids* (its docs call three of them
notifications) and none carries a ``sessionId``: they belong to the running turn.

- ``cursor/update_todos``, ``cursor/task``, ``cursor/generate_image``: acknowledged at
  once with ``{}`` — never turned into questions, never blocking — and normalized
  (merged checklist, correlated subagent task, contained artifacts).
- ``cursor/ask_question``, ``cursor/create_plan``: durable interactions (see
  :mod:`worker.interactions.broker`). A request that cannot be presented faithfully
  (malformed, or a plan document over 196 KiB) is declined with a notice, never cut.

None of them is in the ACP schema (``acp.schema``): their params stay the decoded JSON,
and their answers are Cursor's own shapes (``{"outcome": {"outcome": "cancelled"}}``
merely looks like a permission answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from worker.events import notices
from worker.events.artifacts import named_paths
from worker.events.emitter import Emit
from worker.events.normalizer import Normalizer
from worker.interactions.broker import InteractionBroker
from worker.interactions.requests import RequestInvalid, plan_request, question_request
from worker.rpc.connection import Connection, Reply
from worker.rpc.wire import JsonObject, JsonValue

#: Looks paths up before their artifacts are checked (``WorkspaceFiles.look_up``).
LookUp = Callable[[Sequence[str]], Awaitable[None]]

NON_BLOCKING = ("cursor/update_todos", "cursor/task", "cursor/generate_image")
CANCELLED: JsonObject = {"outcome": {"outcome": "cancelled"}}


class CursorDialect:
    """Registers handlers for Cursor's extension requests on a connection."""

    def __init__(
        self,
        connection: Connection,
        *,
        emit: Emit,
        normalizer: Normalizer,
        broker: InteractionBroker,
        look_up: LookUp | None = None,
    ) -> None:
        self._emit = emit
        self._normalizer = normalizer
        self._broker = broker
        self._look_up = look_up
        for method in NON_BLOCKING:
            connection.route(method, self._acknowledger(method), inline=True)
        connection.route("cursor/ask_question", self._question)
        connection.route("cursor/create_plan", self._plan)

    def _acknowledger(self, method: str) -> Callable[[JsonValue], Awaitable[JsonObject]]:
        async def acknowledge(params: JsonValue) -> JsonObject:
            paths = named_paths(method, params)
            if paths and self._look_up is not None:
                await self._look_up(paths)
            for event in self._normalizer.extension(method, params):
                await self._emit(event)
            return {}

        return acknowledge

    async def _question(self, params: JsonValue) -> JsonValue | Reply:
        try:
            request = question_request(_mapping(params))
        except RequestInvalid as exc:
            return await self._declined("cursor/ask_question", exc, params)
        tool_call_id = _tool_call_id(params)
        reply: JsonValue | Reply = await self._broker.ask(
            "question", request, tool_call_id=tool_call_id
        )
        return reply

    async def _plan(self, params: JsonValue) -> JsonValue | Reply:
        revision = self._broker.plan_revision + 1
        try:
            request = plan_request(_mapping(params), revision)
        except RequestInvalid as exc:
            return await self._declined("cursor/create_plan", exc, params, rejected=True)
        self._broker.plan_revision = revision
        reply: JsonValue | Reply = await self._broker.ask(
            "plan", request, tool_call_id=_tool_call_id(params)
        )
        return reply

    async def _declined(
        self, method: str, exc: RequestInvalid, params: JsonValue, *, rejected: bool = False
    ) -> JsonObject:
        await self._emit(notices.interaction_refused(method, exc.reason, exc.check))
        if exc.check == "too_large":
            return (
                {"outcome": {"outcome": "rejected", "reason": exc.reason}}
                if rejected
                else CANCELLED
            )
        await self._emit(self._normalizer.provider_unmapped(method, params))  # kept, never dropped
        return CANCELLED


def _mapping(params: JsonValue) -> Mapping[str, JsonValue]:
    if not isinstance(params, Mapping):
        raise RequestInvalid("malformed_request", "params must be an object")
    return params


def _tool_call_id(params: JsonValue) -> str | None:
    value = params.get("toolCallId") if isinstance(params, Mapping) else None
    return value if isinstance(value, str) else None
