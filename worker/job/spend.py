"""What one attempt spent, from what its agent reported, and the tenant budget it runs
under (``worker.store.budgets``).

Agents report cost as the session's cumulative amount (ACP ``usage_update.cost``), so an
attempt's cost is the last amount it reported less what the session had cost before it:
the amount replayed by ``session/load``, if the agent replays usage; otherwise the
whole cumulative amount counts (over-counting a resumed session is the safe side of a
budget). Token counts come from the prompt result's ``usage``. Nothing is estimated: an
agent that reports no cost (Cursor's CLI never does) leaves the attempt's cost unknown,
and a budget it runs under says so (``budget_unenforced``) and counts it
``unattributed`` instead of adding zero.

With a budget, each reported increase is charged to the tenant at once
(``HINCRBYFLOAT``); going over ``per_job`` (this attempt) or ``limit`` (the tenant's
total) mid-turn cancels the turn (``budget_exceeded``). A budget already spent refuses
the job before anything is prepared. Concurrent jobs of one tenant can each start just
under the limit: together they overshoot it by at most what each reports before its
next charge.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from worker.errors import BudgetExceeded, BudgetRefused
from worker.events import notices
from worker.events.models import Notice, TokenUsage, UsageReported
from worker.store import budgets
from worker.store.budgets import DEFAULT_TENANT, Budget

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)


class Spend:
    """One attempt's reported usage."""

    __slots__ = ("_baseline", "_charged", "cost_seen", "currency", "mixed", "tokens")

    def __init__(self) -> None:
        self._baseline = 0.0  # the session's cost before this attempt, when replayed
        self._charged = 0.0  # the cumulative amount accounted for so far
        self.currency: str | None = None
        self.cost_seen = False
        self.mixed = False
        self.tokens: TokenUsage | None = None

    def observe(self, event: UsageReported, *, replay: bool) -> float:
        """Take in one ``usage.reported``; returns the spend it adds (0 for none)."""
        if event.tokens is not None and not replay:
            self.tokens = event.tokens
        cost = event.cost
        if cost is None:
            return 0.0
        if self.currency is None:
            self.currency = cost.currency
        elif cost.currency != self.currency:
            self.mixed = True  # amounts in two currencies cannot be summed
            return 0.0
        if replay:
            self._baseline = max(self._baseline, cost.amount)
            self._charged = max(self._charged, cost.amount)
            return 0.0
        self.cost_seen = True
        added = max(0.0, cost.amount - self._charged)
        self._charged = max(self._charged, cost.amount)
        return added

    @property
    def cost(self) -> float:
        """This attempt's cost so far (in ``currency``)."""
        return max(0.0, self._charged - self._baseline)

    def summary(self) -> dict[str, object]:
        """``job.completed``'s ``usage``."""
        out: dict[str, object] = {"available": self.cost_seen or self.tokens is not None}
        if self.cost_seen and not self.mixed:
            out["cost"] = {"amount": round(self.cost, 9), "currency": self.currency}
        if self.tokens is not None:
            out["tokens"] = self.tokens.model_dump(exclude_none=True)
        return out


def tenant_of(labels: dict[str, str], label: str) -> str:
    """The tenant a job's spend counts against: its ``label`` label, else the default."""
    return labels.get(label) or DEFAULT_TENANT


class BudgetGuard:
    """The tenant budget one attempt runs under."""

    def __init__(self, client: aioredis.Redis, budget: Budget) -> None:
        self._client = client
        self.budget = budget
        self.exceeded = asyncio.Event()
        self.error: BudgetExceeded | None = None
        self._unenforced: str | None = None

    @classmethod
    async def load(
        cls, client: aioredis.Redis | None, tenant: str, *, retry_for: float = 0.0
    ) -> BudgetGuard | None:
        """The guard of ``tenant``'s budget; None without Redis or without a budget (a
        Redis that does not answer is asked again for ``retry_for`` seconds)."""
        if client is None:
            return None
        budget = await budgets.read(client, tenant, retry_for=retry_for)
        return None if budget is None else cls(client, budget)

    def check_start(self) -> None:
        """Raises BudgetRefused when nothing is left to spend."""
        budget = self.budget
        if budget.exhausted:
            raise BudgetRefused(
                f"the budget of tenant {budget.tenant!r} is spent ({budget.spent:g} of "
                f"{budget.limit:g} {budget.currency}): nothing was started",
                tenant=budget.tenant,
                spent=budget.spent,
                limit=budget.limit,
                currency=budget.currency,
            )

    async def charge(self, added: float, spend: Spend) -> Notice | None:
        """Charge what a report added; sets ``exceeded`` once over a bound. Returns the
        notice to send when the budget cannot bound this attempt (said once)."""
        budget = self.budget
        if spend.currency is not None and (spend.mixed or spend.currency != budget.currency):
            return self._said("currency", f"the agent reports cost in {spend.currency}")
        if added <= 0:
            return None
        try:
            spent = await budgets.charge(self._client, budget.tenant, added)
        except Exception:  # a Redis error: the turn goes on, unbounded, and says so
            log.warning("charging tenant %s failed", budget.tenant, exc_info=True)
            return self._said("unavailable", "its spend could not be recorded")
        over_job = budget.per_job is not None and spend.cost > budget.per_job
        over_tenant = budget.limit is not None and spent > budget.limit
        if (over_job or over_tenant) and self.error is None:
            bound = "per_job" if over_job else "limit"
            self.error = BudgetExceeded(
                f"this attempt went over the {bound} budget of tenant {budget.tenant!r} "
                f"({spend.cost:g} {budget.currency} this attempt, {spent:g} in all): "
                "the turn was cancelled",
                tenant=budget.tenant,
                bound=bound,
                attempt_cost=spend.cost,
                spent=spent,
                limit=budget.limit,
                per_job=budget.per_job,
                currency=budget.currency,
            )
            self.exceeded.set()
        return None

    async def settle(self, spend: Spend) -> Notice | None:
        """At the end: an attempt whose cost stayed unknown is counted ``unattributed``
        and said (``budget_unenforced``), unless that was said already."""
        if spend.cost_seen:
            return None
        try:
            await budgets.count_unattributed(self._client, self.budget.tenant)
        except Exception:
            log.warning("counting tenant %s failed", self.budget.tenant, exc_info=True)
        return self._said("no_cost", "the agent reported no cost, so its spend is unknown")

    def _said(self, reason: str, why: str) -> Notice | None:
        if self._unenforced is not None:
            return None
        self._unenforced = reason
        return notices.budget_unenforced(self.budget.tenant, reason, why)
