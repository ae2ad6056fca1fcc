"""What the queue path adds to a job: submit → first event → job.completed.

Runs the emulator's shortest scenario (``scenario: hello``) N times through a real
``acp-worker serve`` (Celery, Redis broker, leases, fenced sink), and N times in-process
(the ``acp-worker run`` path: ``worker.job.run_job`` with an in-memory sink) as the
baseline, in the same run, alternating so machine noise hits both alike.
Target (issue 3): the queue path adds ≤ 100 ms at the median.

    .venv/bin/python benchmarks/job_overhead.py [--jobs 20]

Uses Redis db 12 (events) and 11 (broker) unless ACPW_BENCH_REDIS_URL / _BROKER_URL say
otherwise; both are flushed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from _bench import dry_run, size, summary

from worker.client import Client
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox import backend_config, get_backend
from worker.settings import Settings

REPO = Path(__file__).resolve().parent.parent
URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
BROKER = os.environ.get("ACPW_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
SECRETS = REPO / "examples" / "secrets"


def job(i: int, tag: str) -> dict[str, Any]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = f"bench-{tag}-{i}"
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    return data


def start_worker(log: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, ACPW_REDIS_URL=URL, ACPW_BROKER_URL=BROKER, ACPW_SECRETS_DIR=str(SECRETS)
    )
    acp_worker = str(Path(sys.executable).with_name("acp-worker"))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [acp_worker, "serve", "--concurrency", "1"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit(f"the worker did not start; see {log}")
        time.sleep(0.1)
    return proc


def queued(client: Client, i: int) -> tuple[float, float]:
    """(first event, completed) seconds after submit."""
    start = time.perf_counter()
    client.submit(job(i, "q"))
    first = None
    for item in client.events(f"bench-q-{i}", follow=True):
        first = first or time.perf_counter() - start
        last = item.event
    assert last["data"]["status"] == "succeeded", last
    return first or 0.0, time.perf_counter() - start


def in_process(settings: Settings, i: int) -> tuple[float, float]:
    sink = MemorySink()
    start = time.perf_counter()
    outcome = asyncio.run(
        run_job(
            parse_job(job(i, "p")),
            settings=settings,
            backend=get_backend(backend_config(settings, "local")),
            sinks=[sink],
            environ={},
        )
    )
    assert outcome.status == "succeeded", outcome
    return 0.0, time.perf_counter() - start


def report(queue: list[tuple[float, float]], local: list[tuple[float, float]]) -> None:
    q_first = statistics.median(x[0] for x in queue) * 1000
    q_done = statistics.median(x[1] for x in queue) * 1000
    p_done = statistics.median(x[1] for x in local) * 1000
    print(f"jobs: {len(queue)} queued, {len(local)} in-process (scenario: hello)")
    print(f"queued:     median submit→first event {q_first:.1f} ms, →job.completed {q_done:.1f} ms")
    print(f"in-process: median run→job.completed {p_done:.1f} ms")
    print(
        f"queue path adds {q_done - p_done:.1f} ms at the median "
        f"(ratio {q_done / p_done:.2f}; target ≤ 100 ms)"
    )
    summary(
        f"queue path adds {q_done - p_done:.0f} ms ({q_done:.0f} vs {p_done:.0f} ms)",
        "≤ 100 ms",
        q_done - p_done <= 100,
    )


def main(n: int) -> None:
    dry_run("≤ 100 ms added by the queue path")
    for url in (URL, BROKER):
        redis.Redis.from_url(url).flushdb()
    settings = Settings(redis_url=URL, secrets_dir=SECRETS)
    log = Path(tempfile.mkdtemp(prefix="acpw-bench-")) / "worker.log"
    worker = start_worker(log)
    queue: list[tuple[float, float]] = []
    local: list[tuple[float, float]] = []
    try:
        with Client(URL, settings=Settings(redis_url=URL, broker_url=BROKER)) as client:
            queued(client, -1)  # warm-up: imports and pool start in the worker
            for i in range(n):
                queue.append(queued(client, i))
                local.append(in_process(settings, i))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        for url in (URL, BROKER):
            redis.Redis.from_url(url).flushdb()
    report(queue, local)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=size(20, 1))
    main(parser.parse_args().jobs)
