"""Draining ``acp-worker serve`` on SIGTERM, for real: Celery worker processes, Redis,
bubblewrap sandboxes and the Cursor emulator pack.

A job is held busy by a question only the test answers (``ask-question`` waits), so what
runs when is decided by the test, never by a sleep. SIGTERM goes to the ``serve`` process
alone, as Kubernetes (and systemd's ``KillMode=mixed``) send it. The figures (SIGTERM →
exit, hand-back → next attempt running, an idle worker's SIGTERM → exit as the baseline)
are printed; ``-s`` shows them. No assertion is on elapsed time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from celery import current_app

from tests.integration.test_run_job import _job
from tests.integration.test_service import (
    ACP_WORKER,
    BROKER_URL,
    REDIS_URL,
    REPO,
    _env,
    _flush,
    _settings,
    completed,
    events_of,
    job,
    sandboxes_left,
    wait_for,
)
from worker.client import Client
from worker.client.queue import make_celery
from worker.errors import HandedBack, LeaseLost
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import Notice
from worker.service.drain import HAND_BACK_SIGNAL, DrainTimer, HandBack
from worker.service.guarded import Delivery, run_delivery
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Lease, Refusal
from worker.store.state import read_state

pytestmark = pytest.mark.integration

QUESTION = {
    "questions": [{"id": "go", "prompt": "Go on?", "options": [{"id": "yes", "label": "Yes"}]}]
}
ANSWER = {"outcome": "answered", "answers": [{"question_id": "go", "option_ids": ["yes"]}]}
GATED = "#!scenario\nsay gated\nask-question " + json.dumps(QUESTION) + "\nsay done\n"
FIGURES: dict[str, float] = {}


class Serve:
    """``acp-worker serve``; ``term`` signals the serve process only."""

    def __init__(self, log: Path, worker_id: str, *, grace: float, concurrency: int) -> None:
        self.worker_id = worker_id
        self.log = log
        env = _env(worker_id) | {"ACPW_DRAIN_GRACE_S": str(grace)}
        argv = [ACP_WORKER, "serve", "--concurrency", str(concurrency), "--no-reaper"]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.termed_at: float | None = None
        try:
            wait_for(lambda: " ready." in log.read_text(), f"worker {worker_id}", 60)
        except BaseException:
            self.kill()
            raise

    def term(self) -> None:
        self.termed_at = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "Warm shutdown" in self.log.read_text(), "the warm shutdown", 10)

    def exited(self, timeout: float = 60, *, since: float | None = None) -> tuple[int, float]:
        """The exit code, and milliseconds from SIGTERM (or ``since``) to exit."""
        code = self.proc.wait(timeout)
        start = since if since is not None else self.termed_at
        assert start is not None
        return code, (time.monotonic() - start) * 1000

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    """Starts workers; any still running at the end is killed."""
    _flush(BROKER_URL)
    started: list[Serve] = []

    def start(worker_id: str, grace: float, concurrency: int = 1) -> Serve:
        log = tmp_path / f"{worker_id}.log"
        started.append(Serve(log, worker_id, grace=grace, concurrency=concurrency))
        return started[-1]

    yield start
    for worker in started:
        worker.kill()
    _flush(BROKER_URL)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    with Client(redis_url, settings=_settings()) as c:
        yield c


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    yield
    if FIGURES:
        print("\ndrain figures (ms):", json.dumps(FIGURES, sort_keys=True))


def _question(client: Client, job_id: str, attempt: int) -> str:
    """Waits for ``attempt``'s question; returns its interaction id."""

    def asked() -> str | None:
        for event in events_of(client, job_id):
            if event["type"] == "interaction.requested" and event["attempt"] == attempt:
                return str(event["data"]["interaction_id"])
        return None

    return str(wait_for(asked, f"the question of {job_id} attempt {attempt}"))


def _worker_of(events: list[dict[str, Any]], attempt: int) -> str:
    [started] = [e for e in events if e["type"] == "job.started" and e["attempt"] == attempt]
    return str(started["data"]["worker_id"])


def _stream_ms(job_id: str, event_type: str, attempt: int) -> int:
    """Redis's clock (ms) when ``attempt``'s ``event_type`` was written: its stream id."""
    with redis.Redis.from_url(REDIS_URL) as r:
        for entry_id, fields in r.xrange(keys.events(job_id)):
            event = json.loads(fields[b"event"])
            if event["type"] == event_type and event["attempt"] == attempt:
                return int(entry_id.split(b"-")[0])
    pytest.fail(f"no {event_type} of attempt {attempt}")


def test_sigterm_lets_the_running_job_finish_and_takes_no_new_one(
    serve: Any, client: Client
) -> None:
    first = serve("drain-a", grace=60, concurrency=2)
    client.submit(job("busy-1", GATED))
    question = _question(client, "busy-1", 1)
    first.term()
    # Queued after the signal: the draining worker has a free process, yet does not take it.
    client.submit(job("after-1"))
    second = serve("drain-b", grace=60)
    after = list(client.events("after-1", follow=True, timeout=60))
    assert [e.event["data"]["status"] for e in after if e.event["type"] == "job.completed"] == [
        "succeeded"
    ]
    assert _worker_of([e.event for e in after], 1) == "drain-b"
    assert first.proc.poll() is None  # still draining: busy-1 waits for its answer
    answered = time.monotonic()
    client.answer("busy-1", question, ANSWER)
    code, answer_to_exit = first.exited(since=answered)
    events = events_of(client, "busy-1")
    assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [(1, "succeeded")]
    assert _worker_of(events, 1) == "drain-a"
    assert code == 0
    assert "drain grace of" not in first.log.read_text()  # out before the grace was over
    assert "duplicates" not in client.get("after-1").fields
    assert sandboxes_left("busy-1") == []
    FIGURES["busy_last_job_answered_to_exit"] = round(answer_to_exit)
    second.term()
    code, idle_term_to_exit = second.exited()
    assert code == 0
    FIGURES["idle_sigterm_to_exit_baseline"] = round(idle_term_to_exit)


def test_a_job_outliving_the_grace_is_handed_back_and_run_as_attempt_2(
    serve: Any, client: Client
) -> None:
    draining = serve("drain-c", grace=1)
    client.submit(job("long-1", GATED))
    _question(client, "long-1", 1)
    serve("drain-d", grace=60)  # idle until attempt 2 is published
    draining.term()
    second = _question(client, "long-1", 2)
    code, term_to_exit = draining.exited()
    assert code == 0
    state = client.get("long-1")
    assert (state.attempt, state.status, state.fields.get("duplicates")) == (2, "running", None)
    client.answer("long-1", second, ANSWER)
    events = [e.event for e in client.events("long-1", follow=True, attempt=2, timeout=60)]
    everything = events_of(client, "long-1")
    [handed_back] = [e for e in everything if e["type"] == "notice" and e["attempt"] == 1]
    assert handed_back["data"]["code"] == "handed_back"
    assert handed_back["data"]["details"]["next_attempt"] == 2
    attempt_1 = [e["data"] for e in completed(everything) if e["attempt"] == 1]
    assert [(d["status"], d["error"]["code"]) for d in attempt_1] == [("cancelled", "handed_back")]
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
    assert (_worker_of(everything, 1), _worker_of(everything, 2)) == ("drain-c", "drain-d")
    assert client.get("long-1").status == "succeeded"
    followed = client.events("long-1", follow=True, attempt=1, timeout=30)
    assert [  # a follower of attempt 1 goes on with attempt 2, to its end
        (e.event["attempt"], e.event["data"]["status"])
        for e in followed
        if e.event["type"] == "job.completed"
    ] == [(1, "cancelled"), (2, "succeeded")]
    assert sandboxes_left("long-1") == []
    with redis.Redis.from_url(REDIS_URL) as r:
        assert r.hget(keys.settled("long-1"), "attempt") == b"2"  # attempt 1 never settled
    FIGURES["handback_sigterm_to_exit_grace_1s"] = round(term_to_exit)
    FIGURES["handback_to_attempt_2_running"] = _stream_ms("long-1", "job.started", 2) - _stream_ms(
        "long-1", "job.completed", 1
    )


# --- the hand-back itself, in one process -----------------------------------------------


async def _emit_completed(client: aioredis.Redis, lease: Lease, error: HandedBack) -> bool:
    sink = FencedStreamSink(client, lease, policy=SinkPolicy())
    emitter = EventEmitter(job_id=lease.job_id, attempt=lease.attempt, sinks=[sink])
    await emitter.emit(job_completed(status="cancelled", error=error, duration_ms=1.0))
    await emitter.close()
    return sink.handed_back


async def test_a_hand_back_queues_the_next_attempt_and_fences_the_old_owner(
    aredis: aioredis.Redis,
) -> None:
    old = await leases.acquire(aredis, "hb-1", worker_id="w1", ttl=30, job_json="{}")
    assert isinstance(old, Lease)
    assert await _emit_completed(aredis, old, HandedBack("drained", next_attempt=2))
    state = await read_state(aredis, "hb-1")
    assert state is not None
    [(last_id, _)] = await aredis.xrevrange(keys.events("hb-1"), count=1)
    assert (state.attempt, state.status, state.enqueued) == (2, "queued", False)
    assert state.attempt_after == last_id.decode()  # attempt 2's events start after it
    assert await aredis.exists(keys.lease("hb-1"), keys.settled("hb-1")) == 0
    assert await aredis.ttl(keys.state("hb-1")) == -1  # not settled: no TTL
    late = FencedStreamSink(aredis, old, policy=SinkPolicy())
    late_emitter = EventEmitter(job_id="hb-1", attempt=1, sinks=[late])
    await late_emitter.emit(Notice(level="info", code="late", message="too late"))
    with pytest.raises(LeaseLost):
        await late.close()
    assert not await leases.renew(aredis, old, ttl=30)
    new = await leases.acquire(aredis, "hb-1", worker_id="w2", ttl=30, attempt=2)
    assert isinstance(new, Lease), new  # never `held` by the handed-back owner
    assert new.token > old.token
    again = await leases.acquire(aredis, "hb-1", worker_id="w3", ttl=30, attempt=1)
    assert isinstance(again, Refusal)
    assert again.reason == "stale"
    events = [json.loads(f[b"event"]) for _, f in await aredis.xrange(keys.events("hb-1"))]
    assert [e["type"] for e in events] == ["job.completed"]


def _in_process_settings(tmp_path: Path) -> Settings:
    return Settings(
        redis_url=REDIS_URL,
        broker_url=BROKER_URL,
        lease_renew=0.5,
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        secrets_dir=tmp_path / "secrets",
        shutdown_eof_grace=1,
        cancel_grace=2,
        drain_grace_s=0,
    )


async def _marker(client: Client, job_id: str, text: str) -> None:
    for _ in range(600):
        if any(text in json.dumps(e) for e in events_of(client, job_id)):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{text!r} never reached Redis")


def _published_attempts() -> list[int]:
    """The ``attempt`` of each ``tasks.run_job`` message waiting in the broker."""
    with redis.Redis.from_url(BROKER_URL) as broker:
        raw = broker.lrange("runs", 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in raw]
    return [int(body[1]["attempt"]) for body in bodies]


@pytest.mark.usefixtures("redis_url")
async def test_a_tripped_switch_hands_the_job_back_and_publishes_attempt_2(
    tmp_path: Path, client: Client
) -> None:
    _flush(BROKER_URL)
    spec = json.loads(_job(tmp_path, "#!scenario\nsay running\nhang\n").read_text())
    spec["workspace"]["path"] = str(tmp_path / "ws")
    client.submit(spec)  # attempt 1's message: taken here, by hand, as a worker would
    _flush(BROKER_URL)
    switch = HandBack()
    delivery = Delivery(spec, attempt=1)
    settings = _in_process_settings(tmp_path)
    served = asyncio.create_task(
        run_delivery(delivery, settings=settings, environ={}, hand_back=switch)
    )
    await _marker(client, spec["job_id"], "running")
    switch.trip()
    result = await asyncio.wait_for(served, 60)
    assert (result.outcome, result.attempt, result.status) == ("handed_back", 1, "cancelled")
    state = client.get(spec["job_id"])
    assert (state.attempt, state.status, state.enqueued) == (2, "queued", True)
    assert _published_attempts() == [2]
    assert await asyncio.to_thread(sandboxes_left, spec["job_id"]) == []
    assert list((tmp_path / "work").iterdir()) == []
    _flush(BROKER_URL)


@pytest.mark.usefixtures("redis_url")
async def test_a_job_the_control_plane_cancelled_is_not_handed_back(
    tmp_path: Path, client: Client
) -> None:
    """Both a cancel and the drain are there when the job starts (each sets its ``cancel``
    at once): the cancel the control plane asked for wins, no next attempt is queued."""
    _flush(BROKER_URL)
    spec = json.loads(_job(tmp_path, "#!scenario\nsay running\nhang\n").read_text())
    spec["workspace"]["path"] = str(tmp_path / "ws")
    client.submit(spec)
    _flush(BROKER_URL)
    client.cancel(spec["job_id"])
    switch = HandBack()
    switch.trip()
    settings = _in_process_settings(tmp_path)
    delivery = Delivery(spec, attempt=1)
    result = await run_delivery(delivery, settings=settings, environ={}, hand_back=switch)
    assert (result.outcome, result.status, result.error) == ("ran", "cancelled", None)
    state = client.get(spec["job_id"])
    assert (state.attempt, state.status) == (1, "cancelled")
    codes = [e["data"]["code"] for e in events_of(client, spec["job_id"]) if e["type"] == "notice"]
    assert codes == ["cancelled_before_launch"]
    assert _published_attempts() == []


def test_the_timer_signals_every_pool_process_and_skips_one_gone() -> None:
    """Real processes: one that takes the signal's default action, one already reaped."""
    alive = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        timer = DrainTimer(0.0, lambda: [alive.pid, gone.pid])
        assert timer.fire() == [alive.pid]
        assert alive.wait(10) == -HAND_BACK_SIGNAL
    finally:
        alive.kill()
        alive.wait()


def test_a_client_made_in_a_worker_process_leaves_the_worker_app_current(redis_url: str) -> None:
    """The hand-back publishes through a ``Client`` in the pool process: the pool's task
    tracing looks tasks up in Celery's current app, which must stay the worker's."""
    worker_app = make_celery(_settings())
    assert current_app._get_current_object() is worker_app
    with Client(redis_url, settings=_settings()):
        assert current_app._get_current_object() is worker_app
