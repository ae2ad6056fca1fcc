"""``session/request_permission`` answered by the job's permission policy.

    deny         every request: the agent's one-time reject option
    allow_reads  ``read``/``search`` tools allowed once; everything else rejected
    allow_all    every tool allowed once (never a question in disguise: ``think``)
    ask          a durable interaction; unanswered → rejected once

``allow-always`` is never chosen, by any policy or any answer: Cursor turns it into a
global rule in the user's config. Every decision is recorded as ``permission.decided``.

A subagent's ask is attributed to it (``child_id`` on the request and the decision);
one from a child that is no longer live, or from a session nobody spawned, is rejected
without asking anyone, with a ``permission_refused`` notice.

The answer is a ``RequestPermissionResponse`` outcome built as plain JSON (the
``acp.schema`` models are not imported at run time: :mod:`worker.acp.client` says why;
``tests/unit/test_acp_schema.py`` checks every outcome against the model). The request
is read from the decoded params, not through ``RequestPermissionRequest``: that model
closes the option kinds to four and requires every option's ``name``, so one option it
does not know would fail the whole request, while :func:`permission_request` keeps what
it can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from worker.events import notices
from worker.events.emitter import Emit
from worker.events.models import PermissionDecided
from worker.interactions.broker import InteractionBroker
from worker.interactions.requests import permission_request
from worker.rpc.connection import Reply
from worker.rpc.wire import JsonObject, JsonValue

READ_KINDS = frozenset({"read", "search"})
CANCELLED: JsonObject = {"outcome": {"outcome": "cancelled"}}

#: ``(sessionId, toolCallId) -> (child_id, refusal_reason)``, see
#: :meth:`worker.events.normalizer.Normalizer.permission_source`.
Attribute = Callable[[JsonValue, "str | None"], "tuple[str | None, str | None]"]


def _root(session_id: JsonValue, tool_call_id: str | None) -> tuple[str | None, str | None]:
    return None, None


class PermissionPolicy:
    """The handler of ``session/request_permission`` for one job."""

    def __init__(
        self,
        policy: str,
        *,
        emit: Emit,
        broker: InteractionBroker,
        attribute: Attribute = _root,
    ) -> None:
        self.policy = policy
        self._emit = emit
        self._broker = broker
        self._attribute = attribute

    async def __call__(self, params: JsonValue) -> JsonValue | Reply:
        fields: Mapping[str, JsonValue] = params if isinstance(params, Mapping) else {}
        request = permission_request(fields)
        tool_call_id = _tool_call_id(fields)
        child, refused = self._attribute(fields.get("sessionId"), tool_call_id)
        if child is not None:
            request["child_id"] = child
        if refused is not None:
            return await self._refuse(request, tool_call_id, fields.get("sessionId"), refused)
        if self.policy == "ask":
            return await self._ask(request, tool_call_id)
        allowed = self._allows(request["kind"])
        option = _option(request, "allow_once" if allowed else "reject_once")
        await self._decided(request, tool_call_id, option if allowed else None, option)
        return _reply(option)

    def _allows(self, kind: str | None) -> bool:
        if self.policy == "allow_all":
            return kind != "think"
        return self.policy == "allow_reads" and kind in READ_KINDS

    async def _ask(self, request: dict[str, Any], tool_call_id: str | None) -> JsonValue | Reply:
        async def settled(record: dict[str, Any]) -> None:
            answer = record["answer"]
            option = answer.get("option_id")
            kind = next((o["kind"] for o in request["options"] if o["option_id"] == option), "")
            allowed = option if kind.startswith("allow") else None
            await self._decided(request, tool_call_id, allowed, option, record["interaction_id"])

        reply: JsonValue | Reply = await self._broker.ask(
            "permission", request, tool_call_id=tool_call_id, settled=settled
        )
        if not isinstance(reply, Reply):  # declined at once: nobody could answer
            option = _option(request, "reject_once")
            await self._decided(request, tool_call_id, None, option)
        return reply

    async def _refuse(
        self,
        request: dict[str, object],
        tool_call_id: str | None,
        session_id: JsonValue,
        reason: str,
    ) -> JsonObject:
        await self._emit(notices.permission_refused(session_id, tool_call_id, reason))
        option = _option(request, "reject_once")
        await self._decided(request, tool_call_id, None, option)
        return _reply(option)

    async def _decided(
        self,
        request: Mapping[str, object],
        tool_call_id: str | None,
        allowed: str | None,
        option: str | None,
        interaction_id: str | None = None,
    ) -> None:
        data: dict[str, object] = {
            "tool_call_id": tool_call_id,
            "title": request["title"],
            "kind": request["kind"],
            "policy": self.policy,
            "decision": "allowed" if allowed else "denied",
            "option_id": option,
            "interaction_id": interaction_id,
        }
        if request.get("child_id") is not None:
            data["child_id"] = request["child_id"]
        await self._emit(PermissionDecided.model_validate(data))


def _option(request: Mapping[str, Any], kind: str) -> str | None:
    return next((o["option_id"] for o in request["options"] if o["kind"] == kind), None)


def _reply(option: str | None) -> JsonObject:
    if option is None:
        return CANCELLED
    return {"outcome": {"outcome": "selected", "optionId": option}}


def _tool_call_id(params: Mapping[str, JsonValue]) -> str | None:
    tool = params.get("toolCall")
    value = tool.get("toolCallId") if isinstance(tool, Mapping) else None
    return value if isinstance(value, str) else None
