"""The job service end to end: a real Celery worker process (``acp-worker serve``), real
Redis, real bubblewrap sandboxes and the Cursor emulator pack.

One worker serves the module (starting Celery costs seconds); the SIGKILL test starts
and kills its own. Waiting uses generous deadlines, never assertions on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import REDIS_URL, REPO, at_session_end
from worker.client import Client
from worker.client.queue import MAX_JOB_TIMEOUT_S, RUN_TASK, make_celery, send_run
from worker.jobs.spec import parse_job
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.settings import Settings
from worker.store import keys
from worker.workspace.disk import unmount_below

pytestmark = pytest.mark.integration

# The broker gets its own database (another suite running on this Redis must not steal
# this one's messages); ACPW_TEST_BROKER_URL moves it.
BROKER_URL = os.environ.get("ACPW_TEST_BROKER_URL", REDIS_URL.rsplit("/", 1)[0] + "/14")
ACP_WORKER = str(Path(sys.executable).with_name("acp-worker"))
# The workers' job directories (and their loop-mounted disks): never the host's default.
WORK_DIR = Path(tempfile.mkdtemp(prefix="acpw-it-work-"))


@at_session_end
def _remove_work_dir() -> None:
    """Made at import (collecting alone makes it): gone with the session, its job disks
    unmounted first."""
    with contextlib.suppress(OSError):
        unmount_below(WORK_DIR)
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    # The reapers' host lock, next to the work dir (worker.service.reaper).
    WORK_DIR.with_name(f".{WORK_DIR.name}.reaper.lock").unlink(missing_ok=True)


FAST = {
    # A lease outlives a few missed renewals: with 3 s, a loaded 2-core machine (a first
    # run building images) starved the heartbeat long enough for serve's own reaper to
    # settle a healthy job lost. A killed worker's job is still lost within ~11 s.
    "ACPW_LEASE_TTL": "10",
    "ACPW_LEASE_RENEW": "1",
    "ACPW_CANCEL_GRACE": "2",
    "ACPW_REAPER_INTERVAL": "1",
    "ACPW_SHUTDOWN_EOF_GRACE": "1",
    "ACPW_SHUTDOWN_TERM_GRACE": "1",
}


def _env(worker_id: str) -> dict[str, str]:
    keep = {"ACPW_PACKS_DIR", "ACPW_CACHE_DIR"}  # where a CI run put the built packs
    keep.add("ACPW_K8S_NETWORK_POLICIES")  # make test-k8s: the chart's policies are in place
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_") or k in keep}
    env.update(
        FAST,
        ACPW_REDIS_URL=REDIS_URL,
        ACPW_BROKER_URL=BROKER_URL,
        ACPW_SECRETS_DIR=str(REPO / "examples" / "secrets"),
        ACPW_WORKER_ID=worker_id,
        ACPW_WORK_DIR=str(WORK_DIR),
        # Not the default, next to the work dir: that is the temp dir itself here.
        ACPW_SESSION_DIR=str(WORK_DIR / "sessions"),
    )
    return env


def _settings() -> Settings:
    return Settings(redis_url=REDIS_URL, broker_url=BROKER_URL)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


class Worker:
    """``acp-worker serve`` in its own session, so the test can kill the whole tree."""

    def __init__(
        self,
        log: Path,
        *,
        worker_id: str,
        reaper: bool = True,
        metrics_port: int | None = None,
        concurrency: int = 2,
        env: Mapping[str, str] | None = None,
    ) -> None:
        argv = [ACP_WORKER, "serve", "--concurrency", str(concurrency), "--loglevel", "INFO"]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port)]
        self.log = log
        self.metrics_port = metrics_port
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                argv + ([] if reaper else ["--no-reaper"]),
                cwd=REPO,
                env={**_env(worker_id), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(lambda: " ready." in log.read_text(), "the Celery worker", 60)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the whole tree (the group outlives its leader: pool, reaper)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _flush(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.flushdb()


@pytest.fixture(scope="module")
def logs(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Worker logs, outside pytest's rotating basetemp (kept when a test failed)."""
    path = Path(tempfile.mkdtemp(prefix="acpw-it-"))
    yield path
    if request.session.testsfailed == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def worker(logs: Path) -> Iterator[Worker]:
    _flush(BROKER_URL)
    _flush(REDIS_URL)
    running = Worker(logs / "worker.log", worker_id="it-main", metrics_port=_free_port())
    yield running
    running.stop()
    _flush(BROKER_URL)


@pytest.fixture
def client(worker: Worker, redis_url: str) -> Iterator[Client]:
    with Client(redis_url, settings=_settings()) as c:
        yield c


def job(job_id: str, prompt: str = "scenario: hello", timeout_s: float = 60) -> dict[str, Any]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = job_id
    data["prompt"] = prompt
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    data["limits"]["timeout_s"] = timeout_s
    return data


def events_of(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [dict(item.event) for item in client.events(job_id)]


def completed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "job.completed"]


def sandboxes_of(job_id: str) -> list[Any]:
    return asyncio.run(
        LocalBackend(LocalConfig.from_settings(_settings())).list({LABEL_JOB: job_id})
    )


def sandboxes_left(job_id: str, *, timeout: float = 30) -> list[Any]:
    """The job's sandboxes once its worker released its lease. A worker destroys a local
    sandbox after ``job.completed`` (it was quiesced before the results), still under
    the lease: nothing of a job that settled is left once its lease is gone."""
    deadline = time.monotonic() + timeout
    with redis.Redis.from_url(_settings().redis_url) as r:
        while r.exists(keys.lease(job_id)) and time.monotonic() < deadline:
            time.sleep(0.02)
    return sandboxes_of(job_id)


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    by_attempt: dict[int, list[int]] = {}
    for event in events:
        by_attempt.setdefault(event["attempt"], []).append(event["seq"])
    for seqs in by_attempt.values():
        assert seqs == list(range(1, len(seqs) + 1))


def test_submit_follow_through_the_cli(worker: Worker, redis_url: str) -> None:
    out = subprocess.run(
        [ACP_WORKER, "submit", "examples/hello.json", "--follow", "--json", "--redis", redis_url],
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[0]["submitted"] == "created"
    events = [line["event"] for line in lines[1:]]
    assert events[0]["type"] == "job.accepted"
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
    assert any(e["type"] == "message.delta" for e in events)
    assert_contiguous(events)
    assert sandboxes_left("hello-0001") == []
    resumed = subprocess.run(
        [
            ACP_WORKER,
            "events",
            "hello-0001",
            "--after",
            lines[1]["id"],
            "--json",
            "--redis",
            redis_url,
        ],
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert [json.loads(x)["event"] for x in resumed.stdout.splitlines()] == events[1:]


def test_idempotent_submit_and_new_attempts(client: Client) -> None:
    first = client.submit(job("idem-1"))
    again = client.submit(job("idem-1"))
    assert (first.outcome, again.outcome, again.state.attempt) == ("created", "exists", 1)
    list(client.events("idem-1", follow=True, timeout=60))
    assert client.submit(job("idem-1")).outcome == "exists"  # settled: not re-run
    retry = client.submit(job("idem-1"), new_attempt=True)
    assert (retry.outcome, retry.state.attempt) == ("retried", 2)
    events = [e.event for e in client.events("idem-1", follow=True, timeout=60)]
    assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    assert_contiguous(events)


def test_submit_follow_of_a_new_attempt_shows_that_attempt_only(
    client: Client, redis_url: str, tmp_path: Path
) -> None:
    client.submit(job("again-1"))
    list(client.events("again-1", follow=True, timeout=60))
    path = tmp_path / "again.json"
    path.write_text(json.dumps(job("again-1")))
    argv = [ACP_WORKER, "submit", str(path), "--new-attempt", "--follow", "--redis", redis_url]
    out = subprocess.run(
        [*argv, "--json"], cwd=REPO, env=_env("cli"), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert (lines[0]["submitted"], lines[0]["attempt"]) == ("retried", 2)
    events = [line["event"] for line in lines[1:]]
    assert {e["attempt"] for e in events} == {2}
    assert events[0]["seq"] == 1
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
    live = subprocess.run(  # the live view: the status once, the new attempt's only
        argv,
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert live.returncode == 0, live.stderr
    assert "attempt 3: retried" in live.stderr
    assert live.stderr.count("succeeded") == 1, live.stderr
    followed = subprocess.run(  # `events --follow` ends at the current attempt's completion
        [ACP_WORKER, "events", "again-1", "--follow", "--json", "--redis", redis_url],
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert followed.returncode == 0, followed.stderr
    attempts = [json.loads(line)["event"]["attempt"] for line in followed.stdout.splitlines()]
    assert sorted(set(attempts)) == [1, 2, 3]
    assert attempts[-1] == 3


def test_a_redelivered_message_runs_once(client: Client, redis_url: str) -> None:
    client.submit(job("dup-1", "scenario: hang"))
    wait_for(
        lambda: any(e["type"] == "session.started" for e in events_of(client, "dup-1")),
        "the first delivery to start",
    )
    send_run(
        make_celery(_settings()),
        parse_job(job("dup-1", "scenario: hang")),
        settings=_settings(),
        attempt=1,
        submitted_at=time.time(),
    )
    wait_for(lambda: client.get("dup-1").fields.get("duplicates") == "1", "the duplicate")
    out = subprocess.run(
        [ACP_WORKER, "cancel", "dup-1", "--json", "--redis", redis_url],
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout)["cancel"] == "cancel requested"
    events = [dict(e.event) for e in client.events("dup-1", follow=True, timeout=60)]
    assert [e["type"] for e in events].count("job.accepted") == 1
    assert [e["data"]["status"] for e in completed(events)] == ["cancelled"]
    assert client.get("dup-1").fields["last_refusal"] == "held"
    assert sandboxes_left("dup-1") == []


def test_a_settled_job_delivered_again_after_its_keys_expired_is_refused(
    client: Client, redis_url: str
) -> None:
    client.submit(job("exp-1"))
    events = [dict(e.event) for e in client.events("exp-1", follow=True, timeout=60)]
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
    with redis.Redis.from_url(redis_url) as raw:
        # What ACPW_EVENTS_TTL does (a day later with the default this worker runs with):
        # the job's keys go, its settlement record stays.
        assert raw.ttl(keys.state("exp-1")) > 0
        raw.delete(keys.state("exp-1"), keys.events("exp-1"), keys.control("exp-1"))
        # The broker delivers the job's message again (as after a visibility timeout).
        send_run(
            make_celery(_settings()),
            parse_job(job("exp-1")),
            settings=_settings(),
            attempt=1,
            submitted_at=time.time(),
        )
        wait_for(
            lambda: raw.hget(keys.settled("exp-1"), "last_refusal") == b"settled",
            "the delivery to be refused",
        )
        assert raw.exists(keys.state("exp-1"), keys.events("exp-1")) == 0
        assert raw.hget(keys.settled("exp-1"), "status") == b"succeeded"
    assert sandboxes_left("exp-1") == []


def _session_started(client: Client, job_id: str) -> bool:
    return any(e["type"] == "session.started" for e in events_of(client, job_id))


def test_a_job_cancelled_while_queued_never_starts_its_agent(
    client: Client, redis_url: str
) -> None:
    busy = ("busy-1", "busy-2")  # one hanging turn in each of the two pool processes
    for job_id in busy:
        client.submit(job(job_id, "scenario: hang"))
    for job_id in busy:
        wait_for(lambda job_id=job_id: _session_started(client, job_id), f"{job_id} to start")
    client.submit(job("queued-1"))
    assert client.cancel("queued-1").status == "queued"  # no worker could take it yet
    for job_id in busy:  # frees the pool: the worker takes queued-1 only now
        client.cancel(job_id)
    out = subprocess.run(
        [ACP_WORKER, "events", "queued-1", "--follow", "--json", "--redis", redis_url],
        cwd=REPO,
        env=_env("cli"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 4, out.stderr  # the exit code of `cancelled`
    events = [json.loads(line)["event"] for line in out.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert "pack.ready" not in types  # no preparation at all
    assert "agent.initialized" not in types
    assert [e["data"]["code"] for e in events if e["type"] == "notice"] == [
        "cancelled_before_launch"
    ]
    assert [e["data"]["status"] for e in completed(events)] == ["cancelled"]
    assert client.get("queued-1").status == "cancelled"
    assert sandboxes_left("queued-1") == []
    for job_id in busy:  # cancelled mid-turn, through session/cancel
        ran = [dict(e.event) for e in client.events(job_id, follow=True, timeout=60)]
        assert [e["data"]["status"] for e in completed(ran)] == ["cancelled"]
        assert "agent.initialized" in [e["type"] for e in ran]
        assert sandboxes_left(job_id) == []


def test_timeout_settles_timed_out_and_leaves_nothing(client: Client) -> None:
    client.submit(job("slow-1", "scenario: hang", timeout_s=2))
    events = [dict(e.event) for e in client.events("slow-1", follow=True, timeout=60)]
    assert [e["data"]["status"] for e in completed(events)] == ["timed_out"]
    assert client.get("slow-1").status == "timed_out"
    assert sandboxes_left("slow-1") == []


def test_malformed_payloads_settle_once_without_retry(client: Client, redis_url: str) -> None:
    app = make_celery(_settings())
    app.send_task(RUN_TASK, args=["not a job"], queue="runs")
    app.send_task(RUN_TASK, args=[{"v": 1, "job_id": "bad-1", "extra": True}], queue="runs")
    app.send_task(RUN_TASK, args=[{"v": 1, "job_id": "bad-1"}], queue="runs")  # again
    client.submit(job("after-bad"))  # the worker keeps serving
    list(client.events("after-bad", follow=True, timeout=60))
    with redis.Redis.from_url(BROKER_URL) as broker:  # every message acknowledged, none back
        wait_for(lambda: broker.llen("runs") + broker.hlen("unacked") == 0, "the acks")
    # With two pool processes the duplicate may be handled after "after-bad" settled, and
    # either after the first bad-1 settled ("settled") or while it held the lease ("held").
    wait_for(
        lambda: client.get("bad-1").fields.get("last_refusal") in {"settled", "held"},
        "the duplicate",
    )
    assert client.get("bad-1").fields.get("duplicates") == "1"
    events = events_of(client, "bad-1")
    assert [(e["type"], e["data"]["error"]["code"]) for e in events] == [
        ("job.completed", "invalid_job_spec")
    ]


def test_the_metrics_dir_serve_made_goes_with_the_worker(logs: Path) -> None:
    """``serve --metrics-port`` makes prometheus' multiprocess directory in the temp dir;
    its worker removes it when it stops (every restart left one behind before)."""
    running = Worker(logs / "metrics-dir.log", worker_id="it-metrics", metrics_port=_free_port())
    try:
        environ = Path(f"/proc/{running.proc.pid}/environ").read_bytes().split(b"\0")
        [made] = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"ACPW_METRICS_DIR_MADE=")]
        folder = Path(made.decode())
        assert folder.is_dir()
        assert folder.name.startswith("acpw-metrics-")
    finally:
        running.stop()
    assert not folder.exists()


def test_metrics_and_readiness(worker: Worker, client: Client) -> None:
    assert worker.metrics_port is not None
    client.submit(job("metrics-1"))
    list(client.events("metrics-1", follow=True, timeout=60))
    status, body = _get(worker.metrics_port, "/ready")
    report = json.loads(body)
    assert report.pop("redis_at") == {"url": REDIS_URL, "tls": False}  # which Redis, how
    assert (status, report) == (200, {"redis": "ok", "backend": "ok", "ready": True})
    status, text = wait_for(
        lambda: (r := _get(worker.metrics_port, "/metrics")) and 'status="succeeded"' in r[1] and r,
        "the job in the metrics",
    )
    assert status == 200
    for name in (
        "acpw_jobs_total",
        "acpw_job_duration_seconds",
        "acpw_queue_wait_seconds",
        "acpw_phase_duration_seconds",
        "acpw_events_written_total",
        "acpw_queue_depth",  # the autoscaling signal, read from Redis (helm chart)
        "acpw_jobs_running",
        "acpw_leases_expired",
    ):
        assert name in text


def test_sigkill_of_the_worker_is_reaped_once_and_the_job_can_rerun(
    worker: Worker, redis_url: str, logs: Path
) -> None:
    worker.stop()  # the module's worker would pick the next attempt up too early
    with Client(redis_url, settings=_settings()) as client:
        pids = _run_and_kill(client, logs / "doomed.log")
        fresh = Worker(logs / "fresh.log", worker_id="it-fresh")  # reaps by default
        try:
            wait_for(lambda: client.get("kill-1").status == "lost", "the reaper", 30)
            wait_for(lambda: sandboxes_of("kill-1") == [], "the orphan sandbox to go", 15)
            assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
            retry = client.submit(job("kill-1"), new_attempt=True)
            events = [dict(e.event) for e in client.events("kill-1", follow=True, timeout=60)]
        finally:
            fresh.stop()
    assert retry.state.attempt == 2
    assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [
        (1, "lost"),
        (2, "succeeded"),
    ]
    assert_contiguous(events)


def _run_and_kill(client: Client, log: Path) -> frozenset[int]:
    """Start a hanging job on a worker, SIGKILL the worker's whole tree; the sandbox pids."""
    doomed = Worker(log, worker_id="it-doomed")
    try:
        client.submit(job("kill-1", "scenario: hang"))
        wait_for(
            lambda: any(e["type"] == "session.started" for e in events_of(client, "kill-1")),
            "the agent to start",
        )
        (sandbox,) = sandboxes_of("kill-1")
        status = asyncio.run(
            LocalBackend(LocalConfig.from_settings(_settings())).status(sandbox.sandbox_id)
        )
        assert status is not None
        assert status.running
    finally:
        doomed.kill()
    return status.pids


# --- serve's own reaper ------------------------------------------------------------------


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def _reaper_of(worker: Worker) -> int | None:
    reapers = [p for p, cmd in _children(worker.proc.pid) if " reap --loop --parent " in cmd]
    assert len(reapers) <= 1
    return reapers[0] if reapers else None


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_serve_reaps_its_host_until_it_dies_unless_told_not_to(logs: Path) -> None:
    served = Worker(logs / "reaper.log", worker_id="it-reaper")
    try:
        reaper = wait_for(lambda: _reaper_of(served), "serve's reaper")
        os.kill(served.proc.pid, signal.SIGKILL)  # the worker alone, not its group
        wait_for(lambda: not _running(reaper), "the reaper to go with the worker", 15)
    finally:
        served.kill()
    bare = Worker(logs / "no-reaper.log", worker_id="it-no-reaper", reaper=False)
    try:
        assert _reaper_of(bare) is None  # serve starts its reaper before Celery
    finally:
        bare.stop()


# --- a producer that publishes run_job itself ------------------------------------------------


def test_apply_async_gets_time_limits_from_the_job(redis_url: str) -> None:
    """Published straight to a queue no worker reads, and read back as the broker holds it."""
    import tasks
    from worker.client.queue import time_limits

    spec = job("direct-1", timeout_s=120)
    with tasks.app.connection_for_write(redis_url) as connection:
        tasks.run_job.apply_async(args=[spec], connection=connection)
        tasks.run_job.apply_async(
            args=[spec], connection=connection, soft_time_limit=30, time_limit=40
        )
    with redis.Redis.from_url(redis_url) as broker:
        messages = [json.loads(raw) for raw in broker.lrange("runs", 0, -1)]
    limits = sorted(m["headers"]["timelimit"] for m in messages)
    soft, hard = time_limits(120, tasks.settings)
    assert limits == [[40, 30], [hard, soft]]  # derived when unset, kept when set
    assert hard < time_limits(MAX_JOB_TIMEOUT_S, tasks.settings)[0]  # not the 24 h default
