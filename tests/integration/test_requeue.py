"""``requeue`` against a real worker (``acp-worker serve``): Redis came back from an older
snapshot, so a job's state says ``queued`` and ``enqueued`` while its broker message was
consumed after the snapshot (docs/durability.md). ``submit`` answers ``exists`` and
nothing runs it; ``requeue`` publishes its message again and it runs once. A requeue that
meets the old message still queued is harmless: the lease script refuses the second
delivery.

The worker is started here, after the jobs are set up, so that nothing consumes their
messages before the test has made the broker's queue what the rollback leaves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.test_service import (
    BROKER_URL,
    Worker,
    assert_contiguous,
    completed,
    events_of,
    job,
    sandboxes_left,
    wait_for,
)
from worker.client import Client
from worker.settings import Settings
from worker.store import fields

pytestmark = pytest.mark.integration

QUEUE = Settings().queue  # the Celery queue's list in the broker's database


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(BROKER_URL) as raw:
        raw.flushdb()
        yield raw
        raw.flushdb()


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _follow(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [dict(e.event) for e in client.events(job_id, follow=True, timeout=60)]


def test_a_job_whose_message_was_rolled_back_runs_once_when_requeued(
    redis_url: str, broker: redis.Redis, tmp_path: Path
) -> None:
    settings = Settings(redis_url=redis_url, broker_url=BROKER_URL)
    with Client(redis_url, settings=settings) as client:
        # rq-lost: queued and enqueued, its message consumed after the snapshot.
        first = client.submit(job("rq-lost"))
        assert (first.outcome, first.state.enqueued) == ("created", True)
        assert broker.llen(QUEUE) == 1
        broker.delete(QUEUE)
        again = client.submit(job("rq-lost"))
        assert (again.outcome, again.state.status, again.state.enqueued) == (
            "exists",
            "queued",
            True,
        )
        assert broker.llen(QUEUE) == 0  # submit does not publish it again
        # rq-twice: requeued with its first message still queued, so delivered twice.
        client.submit(job("rq-twice"))
        assert client.requeue("rq-twice").outcome == "requeued"
        assert broker.llen(QUEUE) == 2
        served = Worker(tmp_path / "worker.log", worker_id="it-requeue")
        try:
            twice = _follow(client, "rq-twice")
            wait_for(
                lambda: client.get("rq-twice").fields.get(fields.DUPLICATES) == "1",
                "the second delivery to be refused",
            )
            # The worker drained the queue and is idle: nothing runs the rolled-back job.
            assert broker.llen(QUEUE) == 0
            assert client.get("rq-lost").status == "queued"
            requeued = client.requeue("rq-lost")
            assert (requeued.outcome, requeued.state.attempt) == ("requeued", 1)
            lost = _follow(client, "rq-lost")
            # Requeuing a running job publishes nothing, and it runs once.
            client.submit(job("rq-running", "scenario: hang"))
            wait_for(
                lambda: "session.started" in _types(events_of(client, "rq-running")),
                "the hanging job to start",
            )
            running = client.requeue("rq-running")
            assert (running.outcome, running.state.status) == ("not_queued", "running")
            assert broker.llen(QUEUE) == 0
            client.cancel("rq-running")
            hung = _follow(client, "rq-running")
            settled = client.requeue("rq-lost")
            assert (settled.outcome, settled.state.status) == ("not_queued", "succeeded")
            assert broker.llen(QUEUE) == 0
        finally:
            served.stop()
        refused = client.get("rq-twice").fields
    for events, status in ((lost, "succeeded"), (twice, "succeeded"), (hung, "cancelled")):
        assert _types(events).count("job.accepted") == 1
        assert _types(events).count("job.started") == 1
        assert [(e["attempt"], e["data"]["status"]) for e in completed(events)] == [(1, status)]
        assert_contiguous(events)
    assert refused[fields.LAST_REFUSAL] in ("held", "settled")
    for job_id in ("rq-lost", "rq-twice", "rq-running"):
        assert sandboxes_left(job_id) == []
