"""Spend: each attempt's usage as its agent reported it, and tenant budgets in Redis
(real emulator agent, real bubblewrap, real Redis): a spent budget refuses a job before
anything starts, going over it mid-turn cancels the turn, an agent that reports no cost
leaves the spend unknown (never zero)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.test_run_job import _events, _job, run_cli
from worker.store import keys


def _usage(cost: float) -> str:
    update = {"sessionUpdate": "usage_update", "used": 1200, "size": 200000,
              "cost": {"amount": cost, "currency": "USD"}}  # fmt: skip
    return f"update {json.dumps(update)}\n"


SPENDING = "#!scenario\n" + _usage(0.25) + "say working\n" + _usage(0.4) + "say done\n"
RUNAWAY = "#!scenario\n" + _usage(0.3) + "say working\n" + _usage(0.6) + "hang\n"


def _run(
    tmp_path: Path, prompt: str, redis_url: str | None = None, **spec: Any
) -> tuple[int, list[dict[str, Any]]]:
    job = _job(tmp_path, prompt, **spec)
    extra = ("--redis", redis_url) if redis_url else ()
    done = run_cli(tmp_path, "run", str(job), "--json", "--quiet", *extra)
    return done.returncode, _events(done.stdout)


def _budget(redis_url: str, tenant: str) -> dict[str, str]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return client.hgetall(keys.budget(tenant))
    finally:
        client.close()


def _set(tmp_path: Path, redis_url: str, tenant: str, *args: str) -> None:
    done = run_cli(tmp_path, "budget", "set", tenant, "--redis", redis_url, *args)
    assert done.returncode == 0, done.stderr


def _notices(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]


def test_an_attempt_reports_what_its_agent_said_it_cost(tmp_path: Path) -> None:
    code, events = _run(tmp_path, SPENDING)
    assert code == 0
    usage = events[-1]["data"]["usage"]
    assert usage == {"available": True, "cost": {"amount": 0.4, "currency": "USD"}}
    costs = [e["data"]["cost"]["amount"] for e in events if e["type"] == "usage.reported"]
    assert costs == [0.25, 0.4]


def test_unknown_usage_is_unavailable_never_zero(tmp_path: Path) -> None:
    code, events = _run(tmp_path, "scenario: hello")
    assert code == 0
    assert events[-1]["data"]["usage"] == {"available": False}


def test_a_spent_budget_refuses_the_job_before_anything_starts(
    tmp_path: Path, redis_url: str
) -> None:
    _set(tmp_path, redis_url, "acme", "--currency", "USD", "--limit", "1")
    redis.Redis.from_url(redis_url).hincrbyfloat(keys.budget("acme"), "spent", 1.0)
    code, events = _run(tmp_path, SPENDING, redis_url, labels={"tenant": "acme"})
    assert code == 3
    done = events[-1]["data"]
    assert (done["status"], done["error"]["code"]) == ("failed", "budget_exceeded")
    assert done["error"]["details"]["tenant"] == "acme"
    types = {e["type"] for e in events}
    assert not types & {"pack.ready", "sandbox.ready", "agent.initialized"}


def test_going_over_per_job_mid_turn_cancels_the_turn(tmp_path: Path, redis_url: str) -> None:
    _set(tmp_path, redis_url, "acme", "--currency", "USD", "--limit", "10", "--per-job", "0.5")
    code, events = _run(tmp_path, RUNAWAY, redis_url, labels={"tenant": "acme"})
    assert code == 1
    done = events[-1]["data"]
    assert (done["status"], done["error"]["code"]) == ("failed", "budget_exceeded")
    assert done["error"]["details"]["bound"] == "per_job"
    assert done["usage"]["cost"] == {"amount": 0.6, "currency": "USD"}
    assert float(_budget(redis_url, "acme")["spent"]) == 0.6


def test_going_over_the_tenant_limit_mid_turn_cancels_too(tmp_path: Path, redis_url: str) -> None:
    _set(tmp_path, redis_url, "default", "--currency", "USD", "--limit", "0.5")
    code, events = _run(tmp_path, RUNAWAY, redis_url)  # no tenant label: `default`
    assert code == 1
    error = events[-1]["data"]["error"]
    assert (error["code"], error["details"]["bound"]) == ("budget_exceeded", "limit")
    (tmp_path / "next").mkdir()
    again, refused = _run(tmp_path / "next", SPENDING, redis_url)
    assert again == 3
    assert refused[-1]["data"]["error"]["code"] == "budget_exceeded"


def test_a_budget_the_agent_reports_no_cost_for_is_said_unenforced(
    tmp_path: Path, redis_url: str
) -> None:
    _set(tmp_path, redis_url, "acme", "--currency", "USD", "--limit", "1")
    code, events = _run(tmp_path, "scenario: hello", redis_url, labels={"tenant": "acme"})
    assert code == 0
    [notice] = _notices(events, "budget_unenforced")
    assert notice["details"] == {"tenant": "acme", "reason": "no_cost"}
    budget = _budget(redis_url, "acme")
    assert (float(budget["spent"]), budget["unattributed"]) == (0.0, "1")


def test_a_cost_in_another_currency_is_not_summed(tmp_path: Path, redis_url: str) -> None:
    _set(tmp_path, redis_url, "acme", "--currency", "EUR", "--limit", "0.1")
    code, events = _run(tmp_path, SPENDING, redis_url, labels={"tenant": "acme"})
    assert code == 0
    [notice] = _notices(events, "budget_unenforced")
    assert notice["details"]["reason"] == "currency"
    assert float(_budget(redis_url, "acme")["spent"]) == 0.0


def test_a_malformed_budget_fails_closed(tmp_path: Path, redis_url: str) -> None:
    """A hash whose amounts are not numbers lifts no bound: a bad limit refuses."""
    redis.Redis.from_url(redis_url).hset(
        keys.budget("acme"), mapping={"currency": "USD", "limit": "lots", "spent": "0"}
    )
    code, events = _run(tmp_path, SPENDING, redis_url, labels={"tenant": "acme"})
    assert code == 3
    assert events[-1]["data"]["error"]["code"] == "budget_exceeded"


async def test_a_budget_read_goes_on_through_a_redis_outage(aredis: Any, monkeypatch: Any) -> None:
    """A job starting while the sentinels promote a replica reads its tenant's budget:
    the read is asked again while Redis refuses (here twice), for up to ``retry_for``
    seconds (the pipeline gives ``ACPW_SINK_RETRY_S``), then raised."""
    import redis.exceptions

    from worker.store import budgets

    await budgets.set_budget(aredis, "outage-tenant", currency="USD", limit=5.0, per_job=None)
    real = aredis.hgetall
    refusals = {"left": 2}

    async def refusing(key: str) -> Any:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise redis.exceptions.ConnectionError("Connection refused (the failover)")
        return await real(key)

    monkeypatch.setattr(aredis, "hgetall", refusing)
    budget = await budgets.read(aredis, "outage-tenant", retry_for=30)
    assert budget is not None
    assert budget.limit == 5.0
    assert refusals["left"] == 0
    refusals["left"] = 1
    with pytest.raises(redis.exceptions.ConnectionError):
        await budgets.read(aredis, "outage-tenant", retry_for=0)
