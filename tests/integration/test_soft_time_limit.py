"""Celery's soft time limit on a served job (``tasks.run_job``): the backstop beyond the
job's own timeout, raised in the pool process's main thread while the job runs on the
process's long-lived loop (``tasks.process_loop``).

The job is cancelled on its loop and its teardown runs there; the task must not return
before that teardown ended (bounded), or the next delivery of the process would start
beside a teardown still under way. The test publishes a job whose message carries a
soft limit of a few seconds (its own timeout is a minute), then a second job on the
same single pool process.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.integration.test_service import (
    BROKER_URL,
    Worker,
    _flush,
    _settings,
    assert_contiguous,
    completed,
    events_of,
    job,
    sandboxes_left,
    wait_for,
)
from worker.client import Client, queue

pytestmark = pytest.mark.integration

#: The soft limit the first job's message carries: past its agent's start (a hung one).
SOFT_S = 8.0
HUNG = "#!scenario\nsay running\nhang\n"


def _returns(log: Path) -> list[str]:
    """What each ``tasks.run_job`` returned, in order (Celery logs it)."""
    return re.findall(r"Task tasks\.run_job\[[^\]]+\] succeeded in [0-9.]+s: (.*)", log.read_text())


def test_a_soft_time_limit_ends_the_job_before_the_next_delivery(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job (its agent hung) passes its message's soft limit: its task returns
    ``time_limit`` only after the cancelled job's teardown ended (its last log line comes
    first), its sandbox is gone, its lease expires and serve's reaper settles it
    ``lost``, exactly once; the second job, on the same pool process, runs to
    ``succeeded`` undisturbed."""
    _flush(BROKER_URL)
    log = tmp_path / "worker.log"
    worker = Worker(log, worker_id="it-soft", concurrency=1)
    try:
        with Client(redis_url, settings=_settings()) as client:
            with monkeypatch.context() as patched:
                patched.setattr(queue, "time_limits", lambda timeout_s, s: (SOFT_S, SOFT_S + 60))
                client.submit(job("soft-1", HUNG, timeout_s=60))
            # At once a second job: the single pool process takes it after the first.
            client.submit(job("soft-2"))
            after = [e.event for e in client.events("soft-2", follow=True, timeout=120)]
            wait_for(lambda: completed(events_of(client, "soft-1")), "soft-1 settled", 60)
            wait_for(lambda: len(_returns(log)) >= 2, "both tasks' returns", 60)
            time.sleep(2)  # a second settlement, if any, would come within the reaper's pass
            first = events_of(client, "soft-1")
    finally:
        worker.stop()
        _flush(BROKER_URL)
    lines = log.read_text().splitlines()
    assert _returns(log)[0] == "{'outcome': 'time_limit'}", _returns(log)
    returned = next(i for i, line in enumerate(lines) if "'outcome': 'time_limit'" in line)
    torn_down = next(i for i, line in enumerate(lines) if "could not be settled" in line)
    assert torn_down < returned  # the teardown ended before the task returned
    assert not any("teardown has not ended" in line for line in lines)
    assert sandboxes_left("soft-1") == []
    assert [e["data"]["status"] for e in completed(first)] == ["lost"]
    assert_contiguous(first)
    # The next delivery, on the same process, as if nothing had happened before it.
    assert [e["data"]["status"] for e in completed(after)] == ["succeeded"]
    assert_contiguous(after)
    assert sandboxes_left("soft-2") == []
    pools = {
        line.split("/", 1)[1].split("]", 1)[0]
        for line in lines
        if "tasks.run_job[" in line and "succeeded in" in line
    }
    assert pools == {"ForkPoolWorker-1"}
