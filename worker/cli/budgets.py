"""``acp-worker budget``: the operator's spend budgets per tenant, in Redis.

    acp-worker budget set TENANT --currency USD [--limit X] [--per-job Y]
    acp-worker budget show TENANT        what is set, spent, and unattributed
    acp-worker budget reset TENANT       spent and unattributed back to 0 (a new period)
    acp-worker budget remove TENANT      no budget: its jobs are no longer bounded

A job counts against the tenant its ``ACPW_BUDGET_LABEL`` label (default ``tenant``)
names, else ``default``; what a job does under one is in ``worker.job.spend``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from worker.cli.service import redis_flag, with_redis
from worker.settings import Settings
from worker.store import budgets

if TYPE_CHECKING:
    import redis.asyncio as aioredis

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    budget = sub.add_parser("budget", help="tenants' spend budgets (Redis)")
    actions = budget.add_subparsers(dest="action", required=True, metavar="ACTION")
    set_ = actions.add_parser("set", help="set a tenant's budget (its spend is kept)")
    set_.add_argument("--currency", required=True, help="ISO 4217 code, e.g. USD")
    set_.add_argument("--limit", type=float, default=None, help="the tenant's total")
    set_.add_argument("--per-job", type=float, default=None, help="the most one attempt spends")
    set_.set_defaults(handler=_set)
    for name, handler, text in (
        ("show", _show, "what is set and spent"),
        ("reset", _reset, "spent and unattributed back to 0"),
        ("remove", _remove, "no budget for the tenant"),
    ):
        parser = actions.add_parser(name, help=text)
        parser.set_defaults(handler=handler)
    for parser in (set_, *(actions.choices[n] for n in ("show", "reset", "remove"))):
        parser.add_argument("tenant", help="the tenant")
        redis_flag(parser)


def _with_client(
    args: argparse.Namespace,
    settings: Settings,
    work: Callable[[aioredis.Redis], Awaitable[T]],
) -> T:
    from worker.store.lease import redis_client

    budgets.check_tenant(args.tenant)

    async def run() -> T:
        client = redis_client(with_redis(args, settings).redis_url, settings)
        try:
            return await work(client)
        finally:
            await client.aclose()

    return asyncio.run(run())


def _set(args: argparse.Namespace, settings: Settings) -> int:
    async def work(client: aioredis.Redis) -> budgets.Budget | None:
        await budgets.set_budget(
            client,
            args.tenant,
            currency=args.currency,
            limit=args.limit,
            per_job=args.per_job,
        )
        return await budgets.read(client, args.tenant)

    _print(args, _with_client(args, settings, work), args.tenant)
    return 0


def _show(args: argparse.Namespace, settings: Settings) -> int:
    async def work(client: aioredis.Redis) -> budgets.Budget | None:
        return await budgets.read(client, args.tenant)

    budget = _with_client(args, settings, work)
    _print(args, budget, args.tenant)
    return 0 if budget is not None else 1


def _reset(args: argparse.Namespace, settings: Settings) -> int:
    async def work(client: aioredis.Redis) -> budgets.Budget | None:
        if await budgets.read(client, args.tenant) is None:
            return None
        await budgets.reset(client, args.tenant)
        return await budgets.read(client, args.tenant)

    budget = _with_client(args, settings, work)
    _print(args, budget, args.tenant)
    return 0 if budget is not None else 1


def _remove(args: argparse.Namespace, settings: Settings) -> int:
    async def work(client: aioredis.Redis) -> None:
        await budgets.remove(client, args.tenant)

    _with_client(args, settings, work)
    print(f"tenant {args.tenant!r}: no budget", file=sys.stderr)
    return 0


def _print(args: argparse.Namespace, budget: budgets.Budget | None, tenant: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(None if budget is None else budget.as_dict()))
    elif budget is None:
        print(f"tenant {tenant!r}: no budget", file=sys.stderr)
    else:
        limit = "none" if budget.limit is None else f"{budget.limit:g}"
        per_job = "none" if budget.per_job is None else f"{budget.per_job:g}"
        print(
            f"{tenant}: spent {budget.spent:g} of {limit} {budget.currency} "
            f"(per job {per_job}; {budget.unattributed} attempt(s) of unknown cost)"
        )
