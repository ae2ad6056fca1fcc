"""Durable interactions: questions, plans and permission decisions answered by the
control plane through Redis (see docs/contracts.md, "Interaction protocol").

What needs Redis (``AnswerReader``, ``answer_fields``: the control stream) is loaded on
first use, so a job run without Redis, which only declines interactions, never imports
the redis package.
"""

from typing import TYPE_CHECKING, Any

from worker.interactions.broker import AnswerMessage, InteractionBroker
from worker.store.interactions import InteractionStore

if TYPE_CHECKING:
    from worker.interactions.control import AnswerReader, answer_fields

__all__ = [
    "AnswerMessage",
    "AnswerReader",
    "InteractionBroker",
    "InteractionStore",
    "answer_fields",
]


def __getattr__(name: str) -> Any:
    if name in {"AnswerReader", "answer_fields"}:
        from worker.interactions import control

        return getattr(control, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
