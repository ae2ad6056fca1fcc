"""What an attempt spent (``worker.job.spend.Spend``) and the prompt result's token
counts: cumulative amounts become the attempt's own, replayed history is its baseline,
nothing unknown becomes zero."""

from __future__ import annotations

from typing import Any

import pytest

from worker.events.content import token_usage
from worker.events.models import TokenUsage, UsageCost, UsageReported
from worker.events.normalizer import Normalizer
from worker.job.spend import Spend


def _cost(amount: float, currency: str = "USD") -> UsageReported:
    return UsageReported(available=True, cost=UsageCost(amount=amount, currency=currency))


def test_cumulative_reports_add_only_their_increase() -> None:
    spend = Spend()
    assert [spend.observe(_cost(a), replay=False) for a in (0.1, 0.25, 0.25, 0.2)] == [
        0.1,
        pytest.approx(0.15),
        0.0,
        0.0,  # a lower cumulative amount adds nothing (never a refund)
    ]
    assert spend.summary() == {"available": True, "cost": {"amount": 0.25, "currency": "USD"}}


def test_replayed_cost_is_the_sessions_earlier_spend_not_this_attempts() -> None:
    spend = Spend()
    assert spend.observe(_cost(1.0), replay=True) == 0.0
    assert spend.observe(_cost(1.3), replay=False) == pytest.approx(0.3)
    assert spend.cost == pytest.approx(0.3)
    assert not Spend().summary()["available"]


def test_another_currency_is_never_summed() -> None:
    spend = Spend()
    spend.observe(_cost(0.5), replay=False)
    assert spend.observe(_cost(9.0, "EUR"), replay=False) == 0.0
    assert spend.mixed
    assert "cost" not in spend.summary()


def test_tokens_come_from_the_prompt_result() -> None:
    normalizer = Normalizer(workspace_root="/workspace")
    usage = {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15, "cachedReadTokens": 3}
    [event] = normalizer.prompt_usage(usage)
    assert isinstance(event, UsageReported)
    assert event.tokens == TokenUsage(input=10, output=5, total=15, cached_read=3)
    spend = Spend()
    spend.observe(event, replay=False)
    assert spend.summary() == {
        "available": True,
        "tokens": {"input": 10, "output": 5, "total": 15, "cached_read": 3},
    }


@pytest.mark.parametrize(
    "usage",
    [
        None,
        [],
        {"inputTokens": 1, "outputTokens": 1},
        {"inputTokens": -1, "outputTokens": 1, "totalTokens": 0},
        {"inputTokens": 1.5, "outputTokens": 1, "totalTokens": 2},
        {"inputTokens": True, "outputTokens": 1, "totalTokens": 2},
    ],
)
def test_a_malformed_usage_is_unmapped_not_guessed(usage: Any) -> None:
    assert token_usage(usage) is None
    normalizer = Normalizer(workspace_root="/workspace")
    [event] = normalizer.prompt_usage(usage)
    assert event.TYPE == "provider.unmapped"
    assert not normalizer.usage_seen
