"""Spend budgets the operator keeps in Redis, one hash per tenant (``keys.budget``).

A tenant is the value of one job label (``ACPW_BUDGET_LABEL``, default ``tenant``); a job
without that label is the tenant ``default``. The hash holds what the operator set —
``limit`` (the tenant's total), ``per_job`` (the most one attempt may spend), both in
``currency`` — and what the workers add: ``spent`` (the cost agents reported, summed
with ``HINCRBYFLOAT``, so concurrent jobs never lose an update) and ``unattributed``
(attempts that ran under the budget while their agent reported no cost: their spend is
unknown, never counted as zero). No hash: no budget, nothing is checked or counted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker.errors import InvalidInput
from worker.store import keys

if TYPE_CHECKING:
    import redis.asyncio as aioredis

DEFAULT_TENANT = "default"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,255}$")
_CURRENCY = re.compile(r"^[A-Z]{3}$")


@dataclass(frozen=True, slots=True)
class Budget:
    """One tenant's budget as Redis holds it (amounts in ``currency``)."""

    tenant: str
    currency: str
    limit: float | None
    per_job: float | None
    spent: float
    unattributed: int

    @property
    def exhausted(self) -> bool:
        """Nothing left: a new job is refused before it starts."""
        return self.limit is not None and self.spent >= self.limit

    def as_dict(self) -> dict[str, object]:
        return {
            "tenant": self.tenant,
            "currency": self.currency,
            "limit": self.limit,
            "per_job": self.per_job,
            "spent": self.spent,
            "unattributed": self.unattributed,
        }


def check_tenant(tenant: str) -> str:
    """``tenant`` if it can name a budget.

    Raises:
        InvalidInput: not 1 to 256 of ``[A-Za-z0-9._:/-]``, starting alphanumeric.
    """
    if not _TENANT.match(tenant):
        raise InvalidInput(f"tenant {tenant[:64]!r} must match {_TENANT.pattern}")
    return tenant


log = logging.getLogger(__name__)


async def read(client: aioredis.Redis, tenant: str, *, retry_for: float = 0.0) -> Budget | None:
    """The tenant's budget, or None when the operator set none (or it is unreadable:
    a hash without a valid ``currency`` is not a budget).

    A Redis that does not answer is asked again for up to ``retry_for`` seconds (a job
    starting while the sentinels promote a replica goes on once they have), then raised.
    """
    import redis.exceptions  # loaded here: a plain local run imports this module, not redis

    outage = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
    deadline = time.monotonic() + retry_for
    pause = 0.1
    while True:
        try:
            raw = await client.hgetall(keys.budget(tenant))
            break
        except outage as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("the budget of tenant %r is unreadable (%s); retrying", tenant, exc)
            await asyncio.sleep(pause)  # a backoff between attempts, bounded by retry_for
            pause = min(pause * 2, 1.0)
    fields = {_text(k): _text(v) for k, v in raw.items()}
    currency = fields.get("currency", "")
    if not _CURRENCY.match(currency):
        return None
    return Budget(
        tenant=tenant,
        currency=currency,
        limit=_amount(fields.get("limit")),
        per_job=_amount(fields.get("per_job")),
        spent=_amount(fields.get("spent"), malformed=math.inf) or 0.0,
        unattributed=int(fields.get("unattributed") or 0),
    )


async def set_budget(
    client: aioredis.Redis,
    tenant: str,
    *,
    currency: str,
    limit: float | None,
    per_job: float | None,
) -> None:
    """Set (or replace) what the operator decides; ``spent`` is kept.

    Raises:
        InvalidInput: a bad tenant, currency (ISO 4217, e.g. ``USD``) or amount.
    """
    check_tenant(tenant)
    if not _CURRENCY.match(currency):
        raise InvalidInput(f"currency {currency[:16]!r} must be an ISO 4217 code, e.g. USD")
    for name, value in (("limit", limit), ("per_job", per_job)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise InvalidInput(f"{name} must be a finite amount >= 0")
    key = keys.budget(tenant)
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(key, "currency", currency)
        for name, value in (("limit", limit), ("per_job", per_job)):
            if value is None:
                pipe.hdel(key, name)
            else:
                pipe.hset(key, name, repr(float(value)))
        pipe.hsetnx(key, "spent", "0")
        await pipe.execute()


async def charge(client: aioredis.Redis, tenant: str, amount: float) -> float:
    """Add ``amount`` to what the tenant spent; returns the new total."""
    return float(await client.hincrbyfloat(keys.budget(tenant), "spent", amount))


async def count_unattributed(client: aioredis.Redis, tenant: str) -> None:
    """One more attempt whose spend is unknown."""
    await client.hincrby(keys.budget(tenant), "unattributed", 1)


async def reset(client: aioredis.Redis, tenant: str) -> None:
    """Start the tenant's spend again from zero (a new period)."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.budget(tenant), "spent", "0")
        pipe.hset(keys.budget(tenant), "unattributed", "0")
        await pipe.execute()


async def remove(client: aioredis.Redis, tenant: str) -> None:
    await client.delete(keys.budget(tenant))


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _amount(value: str | None, *, malformed: float = 0.0) -> float | None:
    """The amount a field holds; one that is not a finite number fails closed (a limit
    of 0, a spend of infinity: nothing more may be spent) rather than lifting the bound."""
    if value is None:
        return None
    try:
        amount = float(value)
    except ValueError:
        return malformed
    return amount if math.isfinite(amount) else malformed
