"""Durable interactions: questions, plans and permission decisions answered by the
control plane through Redis (see docs/contracts.md, "Interaction protocol")."""

from worker.interactions.broker import AnswerMessage, InteractionBroker
from worker.interactions.control import AnswerReader, answer_fields
from worker.store.interactions import InteractionStore

__all__ = [
    "AnswerMessage",
    "AnswerReader",
    "InteractionBroker",
    "InteractionStore",
    "answer_fields",
]
