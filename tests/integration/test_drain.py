"""Draining ``acp-worker serve`` on SIGTERM, for real: Celery worker processes, Redis,
bubblewrap sandboxes and the Cursor emulator pack.

A job is held busy by a question only the test answers (``ask-question`` waits), so what
runs when is decided by the test, never by a sleep. SIGTERM goes to the ``serve`` process
alone, as Kubernetes (and systemd's ``KillMode=mixed``) send it. The figures (SIGTERM →
exit, hand-back → next attempt running, an idle worker's SIGTERM → exit as the baseline)
are printed; ``-s`` shows them. No assertion is on elapsed time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

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
    sandboxes_of,
    wait_for,
)
from worker.client import Client
from worker.store import keys

pytestmark = pytest.mark.integration

QUESTION = {
    "questions": [{"id": "go", "prompt": "Go on?", "options": [{"id": "yes", "label": "Yes"}]}]
}
ANSWER = {"outcome": "answered", "answers": [{"question_id": "go", "option_ids": ["yes"]}]}
GATED = "#!scenario\nsay gated\nask-question " + json.dumps(QUESTION) + "\nsay done\n"
FIGURES: dict[str, float] = {}


class Serve:
    """``acp-worker serve --concurrency 1``; ``term`` signals the serve process only."""

    def __init__(self, log: Path, worker_id: str, *, grace: float) -> None:
        self.worker_id = worker_id
        self.log = log
        env = _env(worker_id) | {"ACPW_DRAIN_GRACE_S": str(grace)}
        argv = [ACP_WORKER, "serve", "--concurrency", "1", "--no-reaper", "--loglevel", "INFO"]
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

    def exited(self, timeout: float = 60) -> tuple[int, float]:
        """The exit code, and milliseconds from SIGTERM to exit."""
        code = self.proc.wait(timeout)
        assert self.termed_at is not None
        return code, (time.monotonic() - self.termed_at) * 1000

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve(tmp_path: Path, redis_url: str) -> Iterator[Any]:
    """Starts workers; any still running at the end is killed."""
    _flush(BROKER_URL)
    started: list[Serve] = []

    def start(worker_id: str, grace: float) -> Serve:
        started.append(Serve(tmp_path / f"{worker_id}.log", worker_id, grace=grace))
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
    first = serve("drain-a", grace=60)
    client.submit(job("busy-1", GATED))
    question = _question(client, "busy-1", 1)
    first.term()
    client.submit(job("after-1"))  # queued after the signal: not for the draining worker
    second = serve("drain-b", grace=60)
    after = list(client.events("after-1", follow=True, timeout=60))
    assert [e.event["data"]["status"] for e in after if e.event["type"] == "job.completed"] == [
        "succeeded"
    ]
    assert _worker_of([e.event for e in after], 1) == "drain-b"
    assert first.proc.poll() is None  # still draining: busy-1 waits for its answer
    client.answer("busy-1", question, ANSWER)
    code, term_to_exit = first.exited()
    events = events_of(client, "busy-1")
    assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [(1, "succeeded")]
    assert _worker_of(events, 1) == "drain-a"
    assert code == 0
    assert "duplicates" not in client.get("after-1").fields
    assert sandboxes_of("busy-1") == []
    FIGURES["busy_sigterm_to_exit_incl_waiting_for_the_answer"] = round(term_to_exit)
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
    assert sandboxes_of("long-1") == []
    with redis.Redis.from_url(REDIS_URL) as r:
        assert r.hget(keys.settled("long-1"), "attempt") == b"2"  # attempt 1 never settled
    FIGURES["handback_sigterm_to_exit_grace_1s"] = round(term_to_exit)
    FIGURES["handback_to_attempt_2_running"] = _stream_ms("long-1", "job.started", 2) - _stream_ms(
        "long-1", "job.completed", 1
    )
