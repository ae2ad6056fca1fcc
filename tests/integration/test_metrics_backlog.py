"""The autoscaling signal's gauges, read from a real Redis at scrape time: the queue's
length on the broker and the leases held (running jobs), and no sample at all when
Redis does not answer (a wrong zero would tell an autoscaler to scale in)."""

from __future__ import annotations

import time

import redis
from prometheus_client.parser import text_string_to_metric_families

from worker import metrics
from worker.store.keys import LEASES


def _samples(body: bytes) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_backlog_counts_queued_messages_and_held_leases(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as r:
        r.rpush("runs-test", "m1", "m2", "m3")
        r.zadd(LEASES, {"job-a": 1.0, "job-b": time.time() + 3600})
    assert metrics.backlog(redis_url, redis_url, "runs-test") == metrics.Backlog(
        queued=3, running=2, expired=1
    )
    samples = _samples(
        metrics.exposition(lambda: metrics.backlog(redis_url, redis_url, "runs-test"))
    )
    assert samples["acpw_queue_depth"] == 3
    assert samples["acpw_jobs_running"] == 2
    assert samples["acpw_leases_expired"] == 1
    assert "acpw_events_written_total" in samples  # the process's own metrics stay


def test_backlog_is_absent_while_redis_does_not_answer() -> None:
    unreachable = "redis://127.0.0.1:1/0"
    assert metrics.backlog(unreachable, unreachable, "runs") is None
    samples = _samples(metrics.exposition(lambda: None))
    assert "acpw_queue_depth" not in samples
    assert "acpw_jobs_running" not in samples
    assert "acpw_leases_expired" not in samples
