"""Answers on the control stream ``acpw:{J}:control``.

The control stream is shared: ``worker.store.control.ControlWatcher`` follows it for
``cancel``; this reader (the same :class:`ControlStream`, its own cursor) takes the
``answer`` entries of its attempt and hands them to the broker. An entry is::

    type=answer  attempt=<N>  job_id=<J>  interaction_id=<id>  answer=<JSON text>
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import redis.asyncio as aioredis

from worker.interactions.broker import AnswerMessage, InteractionBroker
from worker.store.control import ControlStream

ANSWER = "answer"


def answer_fields(job_id: str, attempt: int, interaction_id: str, answer: object) -> dict[str, str]:
    """The fields of one ``answer`` entry (what ``Client.answer`` writes)."""
    return {
        "type": ANSWER,
        "attempt": str(attempt),
        "job_id": job_id,
        "interaction_id": interaction_id,
        "answer": json.dumps(answer, ensure_ascii=False, separators=(",", ":")),
    }


class AnswerReader(ControlStream):
    """Feeds ``answer`` entries for one attempt to an :class:`InteractionBroker`."""

    def __init__(self, client: aioredis.Redis, broker: InteractionBroker) -> None:
        self._broker = broker
        super().__init__(client, broker.job_id, broker.attempt, {ANSWER: self._apply})

    async def _apply(self, fields: Mapping[str, str]) -> None:
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
