"""Durable interactions of one job attempt: questions, plans, permission decisions.

    agent request → persist record (open) → interaction.requested
      → answer from acpw:{J}:control, validated (else interaction.answer_rejected,
        the interaction stays open) | answer timeout | turn end | cancel
      → exactly one reply written to the agent → record resolved → interaction.resolved

Interactions belong to the turn that is running when the agent asks (Cursor's question
and plan requests carry no session id); one that arrives outside a turn is answered
``cancelled`` at once. The first valid answer wins; every later one is refused as
``closed``. Without a store (no Redis) nothing can be answered, so requests are
declined with a visible notice instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.errors import LeaseLost, ServiceUnavailable
from worker.events import notices
from worker.events.bounded import bounded
from worker.events.emitter import Emit, utc_timestamp
from worker.events.models import (
    InteractionAnswerRejected,
    InteractionRequested,
    InteractionResolved,
    Notice,
)
from worker.interactions.answers import AnswerInvalid, validate_answer
from worker.interactions.requests import fallback_answer, native_reply
from worker.rpc.connection import Reply
from worker.store.interactions import OPEN, RESOLVED, InteractionStore

Settled = Callable[[dict[str, object]], Awaitable[None]]
FINISH_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class AnswerMessage:
    """One ``answer`` entry of the control stream."""

    interaction_id: str
    answer: object
    job_id: str | None = None


@dataclass(slots=True)
class _Open:
    record: dict[str, Any]
    future: asyncio.Future[tuple[dict[str, object], str]]
    taken: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def kind(self) -> str:
        return str(self.record["kind"])


class InteractionBroker:
    """Opens, answers, times out and closes the interactions of one attempt."""

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        emit: Emit,
        store: InteractionStore | None,
        timeout_s: float,
        max_event_bytes: int = 196 * 1024,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self._emit = emit
        self._store = store
        self._timeout = timeout_s
        self._max_bytes = max_event_bytes
        self.turn = 0
        self.active = False
        self._open: dict[str, _Open] = {}
        self._closed: set[str] = set()
        self.plan_revision = 0

    @property
    def available(self) -> bool:
        return self._store is not None

    def begin_turn(self) -> int:
        self.turn += 1
        self.active = True
        return self.turn

    async def end_turn(self, resolved_by: str) -> None:
        """Cancel every open interaction of the turn and wait for their replies."""
        self.active = False
        pending = list(self._open.values())
        for item in pending:
            self._take(item, {"outcome": "cancelled"}, resolved_by)
        for item in pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(item.done.wait(), FINISH_WAIT_S)

    # -- the agent side -------------------------------------------------------------------

    async def ask(
        self,
        kind: str,
        request: dict[str, object],
        *,
        tool_call_id: str | None,
        settled: Settled | None = None,
    ) -> Any:
        """Open an interaction and wait for its answer; returns the agent's reply."""
        refusal = self._refusal(kind)
        if refusal is not None:
            await self._emit(refusal)
            return native_reply(kind, fallback_answer(kind, request, refusal.code))
        item = self._new(kind, request, tool_call_id)
        if not await self._publish(item):
            return native_reply(kind, fallback_answer(kind, request, "unavailable"))
        answer, resolved_by = await self._wait(item)
        return Reply(native_reply(kind, answer), self._finisher(item, answer, resolved_by, settled))

    def _refusal(self, kind: str) -> Notice | None:
        if self._store is None:
            return notices.interaction_unavailable(kind)
        if not self.active:
            return notices.interaction_outside_turn(kind)
        return None

    def _new(self, kind: str, request: dict[str, object], tool_call_id: str | None) -> _Open:
        interaction_id = f"{kind}-{self.turn}-{len(self._closed) + len(self._open) + 1}-"
        interaction_id += secrets.token_hex(4)
        expires = time.time() + self._timeout
        record = {
            "interaction_id": interaction_id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "turn": self.turn,
            "kind": kind,
            "status": OPEN,
            "tool_call_id": tool_call_id,
            "requested_at": utc_timestamp(),
            "expires_at": utc_timestamp(expires),
            "request": request,
        }
        return _Open(record, asyncio.get_running_loop().create_future())

    async def _publish(self, item: _Open) -> bool:
        """Persist, then emit ``interaction.requested``; False when either is impossible."""
        data = self._requested_data(item.record)
        size = len(json.dumps(data, ensure_ascii=False).encode("utf-8"))
        if size > self._max_bytes - 4096:
            await self._emit(notices.interaction_too_large(item.kind, size, self._max_bytes))
            return False
        try:
            assert self._store is not None
            await self._store.put(item.record)
        except (ServiceUnavailable, LeaseLost) as exc:
            # Lost lease: the job is being cancelled (the heartbeat saw it too); declined.
            await self._emit(notices.interaction_unavailable(item.kind, cause=exc.message))
            return False
        self._open[item.record["interaction_id"]] = item
        await self._emit(InteractionRequested.model_validate(data))
        return True

    def _requested_data(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "interaction_id": record["interaction_id"],
            "kind": record["kind"],
            "turn": record["turn"],
            "tool_call_id": record["tool_call_id"],
            "expires_at": record["expires_at"],
            record["kind"]: record["request"],
        }

    async def _wait(self, item: _Open) -> tuple[dict[str, object], str]:
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), self._timeout)
        except TimeoutError:
            why = f"no answer within {self._timeout:g} s"
            self._take(item, fallback_answer(item.kind, item.record["request"], why), "timeout")
            return await item.future

    def _take(self, item: _Open, answer: dict[str, object], resolved_by: str) -> None:
        if not item.taken:
            item.taken = True
            item.future.set_result((answer, resolved_by))

    def _finisher(
        self, item: _Open, answer: dict[str, object], resolved_by: str, settled: Settled | None
    ) -> Callable[[bool], Awaitable[None]]:
        async def finish(sent: bool) -> None:
            try:
                await self._resolve(item, answer, resolved_by, sent)
                if settled is not None:
                    await settled(item.record)
                with contextlib.suppress(ServiceUnavailable, LeaseLost):
                    assert self._store is not None
                    await self._store.put(item.record)
            finally:
                item.done.set()

        return finish

    async def _resolve(
        self, item: _Open, answer: dict[str, object], resolved_by: str, sent: bool
    ) -> None:
        """Close it here, then tell: the event follows the pipe write at once, before the
        agent's next updates can be read (the record is rewritten right after)."""
        interaction_id = item.record["interaction_id"]
        self._open.pop(interaction_id, None)
        self._closed.add(interaction_id)
        item.record.update(status=RESOLVED, answer=answer, resolved_by=resolved_by, delivered=sent)
        resolved = {
            "interaction_id": interaction_id,
            "kind": item.kind,
            "outcome": answer["outcome"],
            "resolved_by": resolved_by,
            "answer": answer if resolved_by == "answer" else None,
            "delivered": sent,
        }
        await self._emit(InteractionResolved.model_validate(resolved))

    # -- the control-plane side -------------------------------------------------------------

    async def deliver(self, message: AnswerMessage) -> None:
        """Take a valid answer, or emit ``interaction.answer_rejected`` saying why."""
        try:
            item = self._target(message)
            answer = validate_answer(
                item.kind, item.record["request"], message.answer, turn=item.record["turn"]
            )
        except AnswerInvalid as refused:
            await self._reject(message.interaction_id, refused.check, refused.reason)
            return
        self._take(item, answer, "answer")

    def _target(self, message: AnswerMessage) -> _Open:
        if message.job_id is not None and message.job_id != self.job_id:
            raise AnswerInvalid("wrong_job", "the answer names another job")
        item = self._open.get(message.interaction_id)
        if item is None and message.interaction_id in self._closed:
            raise AnswerInvalid("closed", "the interaction is already resolved")
        if item is None:
            raise AnswerInvalid("unknown_interaction", "no such interaction in this attempt")
        if item.taken:
            raise AnswerInvalid("closed", "the interaction already has its answer")
        return item

    async def _reject(self, interaction_id: str, code: str, reason: str) -> None:
        rejected = {
            "interaction_id": bounded(interaction_id, 256)["text"],
            "code": code,
            "reason": bounded(reason, 1024)["text"],
        }
        await self._emit(InteractionAnswerRejected.model_validate(rejected))
