"""`acp-worker run --redis` owns its job like the service does: real bubblewrap, the real
emulator pack, a real Redis — and a real TCP proxy between the worker and Redis that the
tests cut, briefly or for good."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job, run_cli
from tests.procs import finish
from tests.redis_proxy import RedisProxy
from worker.store import keys
from worker.store import lease as leases
from worker.store.lease import Lease

pytestmark = pytest.mark.integration

Event = dict[str, Any]


def _ticks(count: int, pause: float = 0.1) -> str:
    """A scenario that keeps talking: ``tick-000`` … (one word: one delta each), pausing
    after each."""
    lines = [f"say tick-{i:03d}\nsleep {pause}" for i in range(count)]
    return "#!scenario\n" + "\n".join(lines) + "\n"


def _stored(url: str, job_id: str) -> list[Event]:
    client = redis.Redis.from_url(url)
    try:
        return [json.loads(f[b"event"]) for _, f in client.xrange(keys.events(job_id))]
    finally:
        client.close()


def _state(url: str, job_id: str) -> dict[str, str]:
    client = redis.Redis.from_url(url)
    try:
        raw = client.hgetall(keys.state(job_id))
    finally:
        client.close()
    return {k.decode(): v.decode() for k, v in raw.items()}


def _ttl(url: str, key: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.ttl(key))
    finally:
        client.close()


# --- a second run of the same job id ------------------------------------------------------


def test_a_settled_job_is_not_run_again(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hello")
    first = run_cli(tmp_path, "run", str(job), "--json", "--quiet", "--redis", redis_url)
    assert first.returncode == 0, first.stderr
    events = _events(first.stdout)
    job_id = events[0]["job_id"]
    assert _check_stream(events)["status"] == "succeeded"

    events_out = tmp_path / "second.jsonl"
    second = run_cli(
        tmp_path, "run", str(job), "--json", "--redis", redis_url, "--events-out", str(events_out)
    )
    assert second.returncode == 2
    assert second.stdout == ""
    [line] = second.stderr.strip().splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "invalid_input"
    assert "already settled (succeeded)" in error["message"]
    assert "nothing was started" in error["message"]
    assert not events_out.exists()  # refused before any sink was opened
    assert not (tmp_path / "work").exists() or list((tmp_path / "work").iterdir()) == []

    stored = _stored(redis_url, job_id)
    assert stored == events  # one attempt-1 sequence, one job.completed, nothing more
    assert {e["attempt"] for e in stored} == {1}
    state = _state(redis_url, job_id)
    assert (state["status"], state["attempt"], state["ev_seq"]) == (
        "succeeded",
        "1",
        str(len(events)),
    )
    for name in ("events", "state"):
        assert _ttl(redis_url, f"acpw:{{{job_id}}}:{name}") > 0, name
    assert _ttl(redis_url, keys.lease(job_id)) == -2  # released


def test_the_service_reads_a_run_job_like_a_served_one(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hello")
    first = run_cli(tmp_path, "run", str(job), "--json", "--quiet", "--redis", redis_url)
    assert first.returncode == 0, first.stderr
    events = _events(first.stdout)
    job_id = events[0]["job_id"]
    for args in (["events", job_id, "--follow"], ["status", job_id]):
        shown = run_cli(tmp_path, *args, "--json", "--redis", redis_url, timeout=30)
        assert shown.returncode == 0, shown.stderr
        if args[0] == "events":
            assert [item["event"] for item in _events(shown.stdout)] == events
        else:
            assert json.loads(shown.stdout)["status"] == "succeeded"
    # Submitting the same file names the same job (not another spec under its id): the
    # service shows the settled run, and runs nothing.
    submitted = run_cli(tmp_path, "submit", str(job), "--json", "--redis", redis_url)
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["submitted"] == "exists"
    assert json.loads(submitted.stdout)["status"] == "succeeded"
    assert _stored(redis_url, job_id) == events


def test_a_job_held_by_a_live_owner_is_refused(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hello")
    job_id = json.loads(job.read_text())["job_id"]

    async def take() -> Lease:
        client = aioredis.Redis.from_url(redis_url)
        try:
            got = await leases.acquire(client, job_id, worker_id="elsewhere", ttl=60)
        finally:
            await client.aclose()
        assert isinstance(got, Lease)
        return got

    asyncio.run(take())
    result = run_cli(tmp_path, "run", str(job), "--json", "--redis", redis_url)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    error = json.loads(line)["error"]
    assert error["details"]["reason"] == "held"
    assert "a live owner holds its lease" in error["message"]
    assert _stored(redis_url, job_id) == []
    assert _state(redis_url, job_id)["worker"] == "elsewhere"


def test_acp_worker_cancel_reaches_a_run_job(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hang")
    argv = [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"]
    proc = subprocess.Popen(
        [*argv, "--redis", redis_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.stdout is not None
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["type"] == "session.started":
            cancel = run_cli(tmp_path, "cancel", events[0]["job_id"], "--redis", redis_url)
            assert cancel.returncode == 0, cancel.stderr
            break
    out, _ = finish(proc, timeout=30)
    events += _events(out)
    assert proc.returncode == 4
    assert _check_stream(events)["status"] == "cancelled"
    assert _stored(redis_url, events[0]["job_id"]) == events
    assert _state(redis_url, events[0]["job_id"])["status"] == "cancelled"


# --- Redis going away mid-turn -------------------------------------------------------------


@dataclass
class _Run:
    returncode: int
    events: list[Event]
    stderr: str
    cut_at: float
    ended_at: float
    children: set[tuple[int, str]] = field(default_factory=set)


async def _run_cutting(
    tmp_path: Path,
    job: Path,
    url: str,
    *,
    at: str,
    on_cut: Callable[[], Awaitable[None]],
    env: dict[str, str],
) -> _Run:
    """Run the job through the proxy; when a stdout line contains ``at``, note the run's
    processes and call ``on_cut`` (in the background: stdout keeps being read)."""
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        *["--redis", url],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=REPO,
        limit=2**20,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    run = _Run(returncode=-1, events=[], stderr="", cut_at=0.0, ended_at=0.0)
    cutting: list[asyncio.Task[None]] = []
    stderr = asyncio.create_task(proc.stderr.read())
    async for raw in proc.stdout:
        run.events.append(json.loads(raw))
        if not cutting and at in raw.decode():
            run.children = _descendants(proc.pid)
            run.cut_at = time.monotonic()
            cutting.append(asyncio.create_task(on_cut()))
    run.returncode = await asyncio.wait_for(proc.wait(), 60)
    run.ended_at = time.monotonic()
    run.stderr = (await stderr).decode()
    await asyncio.gather(*cutting)
    assert cutting, f"{at!r} never appeared on stdout"
    return run


def _descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process below ``root`` (bwrap, the agent, its tools)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            parents[int(entry.name)] = (int(fields[1]), fields[19])
    found: set[tuple[int, str]] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in parents.items() if ppid in frontier}
        found |= {(pid, parents[pid][1]) for pid in frontier}
    return found


def _still_running(processes: set[tuple[int, str]]) -> list[int]:
    alive = []
    for pid, started in processes:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[19] == started and fields[0] != "Z":
            alive.append(pid)
    return alive


async def test_a_brief_redis_outage_mid_turn_loses_nothing(
    tmp_path: Path, redis_url: str, proxy: RedisProxy
) -> None:
    async def outage() -> None:
        await proxy.cut()
        await asyncio.sleep(1.5)
        await proxy.start()  # the same port again

    job = _job(tmp_path, _ticks(40))
    run = await _run_cutting(
        tmp_path, job, proxy.url, at="tick-010", on_cut=outage, env=_env(tmp_path)
    )
    assert run.returncode == 0, run.stderr
    assert _check_stream(run.events)["status"] == "succeeded"
    job_id = run.events[0]["job_id"]
    # Every event once, in order, contiguous: what stdout saw is exactly what Redis holds.
    assert _stored(redis_url, job_id) == run.events
    assert _state(redis_url, job_id)["status"] == "succeeded"
    assert _ttl(redis_url, keys.events(job_id)) > 0
    assert _still_running(run.children) == []


async def test_redis_gone_for_good_fails_the_job_promptly(
    tmp_path: Path, redis_url: str, proxy: RedisProxy
) -> None:
    job = _job(tmp_path, _ticks(200))  # 20 s of talking if nothing stops it
    env = _env(tmp_path, ACPW_SINK_RETRY_S="1.5")
    run = await _run_cutting(tmp_path, job, proxy.url, at="tick-005", on_cut=proxy.cut, env=env)
    assert run.returncode == 1, run.stderr
    assert run.ended_at - run.cut_at < 10  # the retry budget and a teardown, not the turn
    done = _check_stream(run.events)  # stdout: contiguous, exactly one job.completed, last
    assert done["status"] == "failed"
    assert done["error"]["code"] == "sink_unavailable"
    assert run.events[-2]["type"] == "usage.reported"  # the job settled the normal way
    last = json.loads(run.stderr.strip().splitlines()[-1])
    assert last["error"]["code"] == "sink_unavailable"
    assert _still_running(run.children) == []

    job_id = run.events[0]["job_id"]
    stored = _stored(redis_url, job_id)
    assert stored == run.events[: len(stored)]  # a gapless prefix, nothing after the cut
    assert "job.completed" not in [e["type"] for e in stored]
    # Unsettled in Redis: the lease is left to expire, and the reaper's index keeps the
    # job, so a reaper settles it `lost` (a second run would too, before refusing it).
    assert _state(redis_url, job_id)["status"] == "running"
    assert _ttl(redis_url, keys.lease(job_id)) > 0
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.zscore(keys.LEASES, job_id) is not None
    finally:
        client.close()


# --- the lease lost mid-job -----------------------------------------------------------------


async def test_a_lost_lease_runs_no_capture_and_no_upload(tmp_path: Path, redis_url: str) -> None:
    """Another owner takes the lease mid-turn (as after an expiry and a reaper): the job
    stops, and its teardown writes no results (no session, capture, patch or bundle) and
    logs no traceback; a notice on the sinks that still take events says what was skipped."""
    job = _job(tmp_path, "#!scenario\nwrite new.txt hi\nsay lease-marker\nhang\n")
    job_id = json.loads(job.read_text())["job_id"]

    async def take_over() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.set(keys.lease(job_id), "999999", px=60_000)  # a newer owner's fence
        finally:
            await client.aclose()

    env = _env(tmp_path, ACPW_LEASE_RENEW="0.2", ACPW_RESULTS_BUCKET="never-used")
    run = await _run_cutting(tmp_path, job, redis_url, at="lease-marker", on_cut=take_over, env=env)
    types = [e["type"] for e in run.events]
    assert "workspace.changed" not in types
    code = "results_skipped_lease_lost"
    (notice,) = [e["data"] for e in run.events if e["data"].get("code") == code]
    assert notice["details"]["skipped"] == ["session_save", "capture", "bundle_upload"]
    done = _check_stream(run.events)
    assert (done["status"], done["error"]["code"]) == ("failed", "lease_lost"), done
    assert done.get("result") is None
    assert "capture" not in done.get("timings_ms", {})
    assert "Traceback" not in run.stderr
    assert "lease of job" in run.stderr  # the log line
    assert "capture" in run.stderr
    assert not (tmp_path / "results" / job_id).exists()  # no patch written
    assert list((tmp_path / "work").iterdir()) == []  # the workspace is removed
    assert _still_running(run.children) == []
