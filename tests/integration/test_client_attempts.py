"""The control-plane client against a real Redis: one job id names one spec, and a reader
of one attempt sees that attempt only. The worker's side is played here through the
same lease and fenced-sink code a worker uses (the Celery path is in test_service.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu.exceptions
import pytest
import redis
import redis.asyncio as aioredis

from tests.conftest import REPO
from worker.client import Client, queue
from worker.client.client import spec_digest
from worker.errors import EventsTrimmed, JobConflict, JobNotFound, ServiceUnavailable
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import Notice
from worker.jobs.spec import parse_job
from worker.settings import Settings
from worker.store import fields, jobs, keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy

pytestmark = pytest.mark.integration


def _job(job_id: str, prompt: str = "scenario: hello", **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "job_id": job_id,
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "/tmp"},
        "prompt": prompt,
        **extra,
    }


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    # The broker is this test database too: nothing consumes it, the flush clears it.
    with Client(redis_url, settings=Settings(redis_url=redis_url, broker_url=redis_url)) as c:
        yield c


def _run_attempt(redis_url: str, job_id: str, attempt: int, notices: int = 2) -> None:
    """What a worker writes for one attempt: notices, then ``job.completed`` succeeded."""

    async def run() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            lease = await leases.acquire(client, job_id, worker_id="sim", ttl=30, attempt=attempt)
            assert isinstance(lease, leases.Lease), lease
            sink = FencedStreamSink(client, lease, policy=SinkPolicy())
            emitter = EventEmitter(job_id=job_id, attempt=attempt, sinks=[sink])
            for i in range(notices):
                await emitter.emit(Notice(level="info", code="t", message=str(i)))
            done = job_completed(
                status="succeeded", stop_reason="end_turn", error=None, duration_ms=1.0
            )
            await emitter.emit(done)
            await emitter.close()
            await leases.release(client, lease)
        finally:
            await client.aclose()

    asyncio.run(run())


def _attempts(items: Any) -> list[tuple[int, str]]:
    return [(i.event["attempt"], i.event["type"]) for i in items]


# --- one job id, one spec -----------------------------------------------------------------


def test_the_same_spec_is_idempotent_and_another_is_a_conflict(
    client: Client, redis_url: str
) -> None:
    first = client.submit(_job("spec-1"))
    # The same job written differently (a default spelled out): the same spec.
    same = client.submit(_job("spec-1", limits={"timeout_s": 600}))
    assert (first.outcome, same.outcome) == ("created", "exists")
    assert first.state.fields["spec_digest"] == spec_digest(parse_job(_job("spec-1")))
    with pytest.raises(JobConflict) as conflict:
        client.submit(_job("spec-1", "scenario: hang"))
    assert conflict.value.code == "job_conflict"
    assert conflict.value.exit_code == 2
    assert "spec-1" in conflict.value.message
    details = conflict.value.details
    assert (details["job_id"], details["attempt"], details["status"]) == ("spec-1", 1, "queued")
    assert details["existing_digest"] == first.state.fields["spec_digest"]
    assert details["submitted_digest"] != details["existing_digest"]
    with pytest.raises(JobConflict):  # not settled: no new attempt, and no new spec
        client.submit(_job("spec-1", "scenario: hang"), new_attempt=True)
    state = client.get("spec-1")
    assert parse_job(state.fields["job"]).prompt == "scenario: hello"  # untouched
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1  # enqueued once, by the first submit


def test_a_new_attempt_may_change_the_spec(client: Client, redis_url: str) -> None:
    client.submit(_job("spec-2"))
    _run_attempt(redis_url, "spec-2", 1)
    with pytest.raises(JobConflict) as settled:
        client.submit(_job("spec-2", "scenario: hang"))
    assert "as a new attempt" in settled.value.message
    retry = client.submit(_job("spec-2", "scenario: hang"), new_attempt=True)
    assert (retry.outcome, retry.state.attempt) == ("retried", 2)
    hang = spec_digest(parse_job(_job("spec-2", "scenario: hang")))
    assert retry.state.fields["spec_digest"] == hang
    assert client.submit(_job("spec-2", "scenario: hang")).outcome == "exists"
    with pytest.raises(JobConflict):  # the first spec is the previous attempt's now
        client.submit(_job("spec-2"))


def test_a_state_without_a_digest_is_compared_by_its_stored_spec(
    client: Client, redis_url: str
) -> None:
    """A worker that took a message published without ``submit`` recorded only the job."""
    spec = parse_job(_job("spec-3"))

    async def deliver() -> None:
        aclient = aioredis.Redis.from_url(redis_url)
        try:
            got = await leases.acquire(
                aclient, "spec-3", worker_id="w", ttl=30, job_json=spec.model_dump_json()
            )
            assert isinstance(got, leases.Lease)
        finally:
            await aclient.aclose()

    asyncio.run(deliver())
    assert "spec_digest" not in client.get("spec-3").fields
    assert client.submit(_job("spec-3")).outcome == "exists"
    with pytest.raises(JobConflict):
        client.submit(_job("spec-3", "scenario: hang"))


def test_the_cli_names_the_conflict_and_exits_2(
    client: Client, redis_url: str, tmp_path: Path
) -> None:
    client.submit(_job("spec-4"))
    path = tmp_path / "other.json"
    path.write_text(json.dumps(_job("spec-4", "scenario: hang")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env["ACPW_BROKER_URL"] = redis_url
    argv = [sys.executable, "-m", "worker.cli", "submit", str(path), "--json", "--redis", redis_url]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert out.stdout == ""
    [line] = out.stderr.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "job_conflict"
    assert "spec-4" in error["message"]


# --- one attempt's events -----------------------------------------------------------------


def test_an_attempt_is_read_from_where_it_begins(client: Client, redis_url: str) -> None:
    client.submit(_job("att-1"))
    _run_attempt(redis_url, "att-1", 1)
    client.submit(_job("att-1"), new_attempt=True)
    _run_attempt(redis_url, "att-1", 2, notices=1)
    second = list(client.events("att-1", attempt=2))
    assert _attempts(second) == [(2, "notice"), (2, "job.completed")]
    followed = list(client.events("att-1", attempt=2, follow=True, timeout=10))
    assert followed == second
    assert _attempts(client.events("att-1", attempt=1)) == [(1, "notice")] * 2 + [
        (1, "job.completed")
    ]
    # Attempt 1's events trimmed off the bounded stream: reading everything fails loudly,
    # reading attempt 2 does not even look at them.
    entries = [i.id for i in client.events("att-1")]
    with redis.Redis.from_url(redis_url) as raw:
        raw.hset(keys.state("att-1"), "events_trimmed_until", entries[2])
        raw.xtrim(keys.events("att-1"), minid=entries[3])
    with pytest.raises(EventsTrimmed):
        list(client.events("att-1"))
    assert list(client.events("att-1", attempt=2, follow=True, timeout=10)) == second


def test_follow_ends_at_the_attempt_current_when_it_began(client: Client, redis_url: str) -> None:
    client.submit(_job("att-2"))
    _run_attempt(redis_url, "att-2", 1)
    following = client.events("att-2", follow=True, timeout=10)
    first = next(following)  # the follow has begun: attempt 1 is the current one
    client.submit(_job("att-2"), new_attempt=True)
    _run_attempt(redis_url, "att-2", 2)
    rest = list(following)
    assert _attempts([first, *rest]) == [(1, "notice")] * 2 + [(1, "job.completed")]
    # Begun now, it replays attempt 1 and ends at attempt 2's completion, not at 1's.
    everything = _attempts(client.events("att-2", follow=True, timeout=10))
    assert everything[-1] == (2, "job.completed")
    assert everything.count((1, "job.completed")) == 1


def test_follow_resumed_after_the_completion_ends(
    client: Client, redis_url: str, tmp_path: Path
) -> None:
    client.submit(_job("att-3"))
    _run_attempt(redis_url, "att-3", 1)
    done = list(client.events("att-3"))[-1]
    assert done.event["type"] == "job.completed"
    started = time.monotonic()
    assert list(client.events("att-3", follow=True, after=done.id, timeout=30)) == []
    assert list(client.events("att-3", attempt=1, follow=True, after=done.id, timeout=30)) == []
    # An earlier attempt's follow, resumed after its completion, ends too: later attempts'
    # events are not its own.
    client.submit(_job("att-3"), new_attempt=True)
    _run_attempt(redis_url, "att-3", 2)
    assert list(client.events("att-3", attempt=1, follow=True, after=done.id, timeout=30)) == []
    assert time.monotonic() - started < 10  # not the timeouts
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    argv = [sys.executable, "-m", "worker.cli", "events", "att-3", "--follow", "--json"]
    last = list(client.events("att-3"))[-1].id
    argv += ["--after", last, "--redis", redis_url]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_follow_of_a_running_attempt_waits_past_its_last_event(
    client: Client, redis_url: str
) -> None:
    client.submit(_job("att-4"))
    _run_attempt(redis_url, "att-4", 1)
    with redis.Redis.from_url(redis_url) as raw:  # as if attempt 1 were still running
        raw.hset(keys.state("att-4"), "status", "running")
    done = list(client.events("att-4"))[-1]
    started = time.monotonic()
    assert list(client.events("att-4", follow=True, after=done.id, timeout=2)) == []
    assert time.monotonic() - started >= 2  # ended by the timeout, not by the state


def test_a_job_that_vanished_with_redis_is_detected_and_resubmitted(
    client: Client, redis_url: str
) -> None:
    """Redis restarted empty (no AOF): the job's state and its queued message are gone.
    ``get`` (``acp-worker status``) says ``job_not_found``; submitting the same spec again
    creates it anew as attempt 1, queued once more (docs/durability.md)."""
    first = client.submit(_job("vanish-1"))
    assert (first.outcome, first.state.attempt, first.state.enqueued) == ("created", 1, True)
    with redis.Redis.from_url(redis_url) as raw:
        raw.flushdb()  # what a restart without persistence leaves
    with pytest.raises(JobNotFound) as missing:
        client.get("vanish-1")
    assert (missing.value.code, missing.value.exit_code) == ("job_not_found", 2)
    again = client.submit(_job("vanish-1"))
    assert (again.outcome, again.state.attempt, again.state.status) == ("created", 1, "queued")
    assert again.state.enqueued
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1  # queued again, once


def test_the_cli_status_of_a_vanished_job_exits_2_naming_it(redis_url: str) -> None:
    env = {**os.environ, "ACPW_REDIS_URL": redis_url}
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "status", "never-was", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stderr.strip().splitlines()[-1])["error"]["code"] == "job_not_found"


# --- requeue: a queued job whose message is gone ---------------------------------------------
# Redis back from an older snapshot: the state says queued and enqueued, the message was
# consumed after the snapshot. The real worker's side is in test_requeue.py.


def _lose_message(client: Client, redis_url: str, job_id: str) -> None:
    """Submit ``job_id`` and take its message off the broker's queue, as a rollback does."""
    assert client.submit(_job(job_id)).state.enqueued
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.lpop("runs") is not None
        assert raw.llen("runs") == 0


def test_requeue_publishes_a_queued_job_that_submit_leaves_alone(
    client: Client, redis_url: str
) -> None:
    _lose_message(client, redis_url, "rq-1")
    again = client.submit(_job("rq-1"))
    assert (again.outcome, again.state.status, again.state.enqueued) == ("exists", "queued", True)
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 0  # submit does not publish it again
        requeued = client.requeue("rq-1")
        assert (requeued.outcome, requeued.state.attempt) == ("requeued", 1)
        assert (requeued.state.status, requeued.state.enqueued) == ("queued", True)
        assert raw.hget(keys.state("rq-1"), fields.ENQUEUE_CLAIM) is None  # given back
        [message] = raw.lrange("runs", 0, -1)
    body = json.loads(message)
    assert body["headers"]["task"] == queue.RUN_TASK
    assert body["headers"]["argsrepr"].startswith("[{'v': 1, 'job_id': 'rq-1'")


def test_requeue_leaves_a_running_or_settled_job_alone(client: Client, redis_url: str) -> None:
    _lose_message(client, redis_url, "rq-2")

    async def take_lease() -> None:
        aclient = aioredis.Redis.from_url(redis_url)
        try:
            got = await leases.acquire(aclient, "rq-2", worker_id="w", ttl=30, attempt=1)
            assert isinstance(got, leases.Lease)
        finally:
            await aclient.aclose()

    asyncio.run(take_lease())
    running = client.requeue("rq-2")
    assert (running.outcome, running.state.status) == ("not_queued", "running")
    _lose_message(client, redis_url, "rq-3")
    _run_attempt(redis_url, "rq-3", 1)
    settled = client.requeue("rq-3")
    assert (settled.outcome, settled.state.status) == ("not_queued", "succeeded")
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 0
    with pytest.raises(JobNotFound) as missing:
        client.requeue("never-was")
    assert missing.value.exit_code == 2


def test_requeues_and_submits_racing_publish_one_at_a_time(client: Client, redis_url: str) -> None:
    """The reclaim is the submit's claim less its ``enqueued`` test: while one caller holds
    the claim, every other requeue and submit of the attempt is refused."""
    _lose_message(client, redis_url, "rq-4")
    with redis.Redis.from_url(redis_url) as raw:
        assert jobs.reclaim_enqueue(raw, "rq-4", 1, "a")  # enqueued is not asked
        assert not jobs.reclaim_enqueue(raw, "rq-4", 1, "b")  # a's claim is live
        assert not jobs.claim_enqueue(raw, "rq-4", 1, "b")
        assert not jobs.reclaim_enqueue(raw, "rq-4", 2, "b")  # not the current attempt
        jobs.mark_enqueued(raw, "rq-4", 1, "a")
        assert jobs.reclaim_enqueue(raw, "rq-4", 1, "b", hold_ms=0)  # published: free again
        assert jobs.reclaim_enqueue(raw, "rq-4", 1, "c")  # a lapsed claim does not hold
        jobs.release_enqueue(raw, "rq-4", 1, "c")
        assert raw.hget(keys.state("rq-4"), fields.ENQUEUED) == b"1"  # a release keeps it
    # Eight requeues at once: the one that claims publishes while all the others answer.
    answered: list[str] = []
    publisher = threading.Event()
    real = queue.send_run

    def held_until_the_others_answered(*args: Any, **kwargs: Any) -> None:
        publisher.set()
        deadline = time.monotonic() + 30
        while len(answered) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        real(*args, **kwargs)

    start = threading.Barrier(8)
    settings = Settings(redis_url=redis_url, broker_url=redis_url)

    def requeue() -> None:
        with Client(redis_url, settings=settings) as own:
            start.wait()
            answered.append(own.requeue("rq-4").outcome)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(queue, "send_run", held_until_the_others_answered)
        threads = [threading.Thread(target=requeue) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert publisher.is_set()
    assert sorted(answered) == ["in_progress"] * 7 + ["requeued"]
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1


def test_a_failed_requeue_gives_the_claim_back(client: Client, redis_url: str) -> None:
    _lose_message(client, redis_url, "rq-5")

    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise kombu.exceptions.OperationalError("broker down")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(queue, "send_run", broker_down)
        with pytest.raises(ServiceUnavailable):
            client.requeue("rq-5")
    assert client.requeue("rq-5").outcome == "requeued"
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1
    nowhere = "redis://127.0.0.1:1/0"  # nothing listens there
    settings = Settings(redis_url=nowhere, broker_url=redis_url)
    with Client(nowhere, settings=settings) as down, pytest.raises(ServiceUnavailable):
        down.requeue("rq-5")


def _cli_requeue(redis_url: str, job_id: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env["ACPW_BROKER_URL"] = redis_url
    argv = [sys.executable, "-m", "worker.cli", "requeue", job_id, "--json", "--redis", redis_url]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def test_the_cli_requeue_says_what_it_did_and_exits_2_for_an_unknown_job(
    client: Client, redis_url: str
) -> None:
    _lose_message(client, redis_url, "rq-6")
    requeued = _cli_requeue(redis_url, "rq-6")
    assert requeued.returncode == 0, requeued.stderr
    said = json.loads(requeued.stdout)
    assert (said["requeue"], said["job_id"], said["attempt"], said["status"]) == (
        "requeued",
        "rq-6",
        1,
        "queued",
    )
    _run_attempt(redis_url, "rq-6", 1)
    settled = _cli_requeue(redis_url, "rq-6")
    assert settled.returncode == 0, settled.stderr
    assert json.loads(settled.stdout)["requeue"] == "not_queued"
    with redis.Redis.from_url(redis_url) as raw:
        assert raw.llen("runs") == 1  # the requeue's, once
    missing = _cli_requeue(redis_url, "never-was")
    assert (missing.returncode, missing.stdout) == (2, "")
    assert json.loads(missing.stderr.splitlines()[-1])["error"]["code"] == "job_not_found"
