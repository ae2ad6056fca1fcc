"""Answers on the control stream ``acpw:{J}:control``.

The control stream is shared: ``worker.control.watch.ControlWatcher`` follows it for
``cancel``; this reader follows the same stream (its own cursor, from the first entry)
for ``answer`` entries of its attempt and hands them to the broker. An entry is::

    type=answer  attempt=<N>  job_id=<J>  interaction_id=<id>  answer=<JSON text>
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import redis.asyncio as aioredis

from worker import keys
from worker.interactions.broker import AnswerMessage, InteractionBroker
from worker.leases.lease import REDIS_ERRORS

log = logging.getLogger(__name__)

ANSWER = "answer"
BLOCK_MS = 500


def answer_fields(job_id: str, attempt: int, interaction_id: str, answer: Any) -> dict[str, str]:
    """The fields of one ``answer`` entry (what ``Client.answer`` writes)."""
    return {
        "type": ANSWER,
        "attempt": str(attempt),
        "job_id": job_id,
        "interaction_id": interaction_id,
        "answer": json.dumps(answer, ensure_ascii=False, separators=(",", ":")),
    }


class AnswerReader:
    """Feeds ``answer`` entries for one attempt to an :class:`InteractionBroker`."""

    def __init__(self, client: aioredis.Redis, broker: InteractionBroker) -> None:
        self._client = client
        self._broker = broker
        self._key = keys.control(broker.job_id)
        self._attempt = str(broker.attempt)
        self._last = "0-0"

    async def run(self) -> None:
        while True:
            try:
                reply: Any = await self._client.xread({self._key: self._last}, block=BLOCK_MS)
            except REDIS_ERRORS as exc:
                log.warning("control stream unreadable (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    self._last = entry_id.decode()
                    await self._apply(_decode(fields))

    async def _apply(self, fields: Mapping[str, str]) -> None:
        if fields.get("type") != ANSWER or fields.get("attempt", self._attempt) != self._attempt:
            return
        try:
            answer = json.loads(fields.get("answer", ""))
        except ValueError:
            answer = {"outcome": None, "error": "the answer is not JSON"}
        await self._broker.deliver(
            AnswerMessage(
                interaction_id=fields.get("interaction_id", ""),
                answer=answer,
                job_id=fields.get("job_id"),
            )
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AnswerReader]:
        task = asyncio.create_task(self.run(), name=f"answers-{self._key}")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _decode(fields: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
