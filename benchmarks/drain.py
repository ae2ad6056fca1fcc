"""What draining costs: SIGTERM → exit of ``acp-worker serve``, and hand-back → next attempt.

Per round, with real ``serve`` processes (Celery, Redis broker, bubblewrap, the emulator):

- **baseline**: an idle worker's SIGTERM → exit (Celery's own warm shutdown);
- **hand-back**: a worker busy with a job that waits for an answer gets SIGTERM with a
  grace of ``--grace`` seconds; measured are SIGTERM → exit, and the hand-back (attempt
  1's ``job.completed``) → attempt 2's ``job.started`` on a second, idle worker (both from
  the Redis stream ids, Redis's clock). Attempt 2 is then answered and must succeed.

    .venv/bin/python benchmarks/drain.py [--rounds 3] [--grace 1]

Uses Redis db 12 (events) and 11 (broker) unless ACPW_BENCH_REDIS_URL / _BROKER_URL say
otherwise; both are flushed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from _bench import dry_run, size, summary

from worker.client import Client
from worker.settings import Settings
from worker.store import keys

REPO = Path(__file__).resolve().parent.parent
URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
BROKER = os.environ.get("ACPW_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
QUESTION = {"questions": [{"id": "go", "prompt": "Go on?", "options": [{"id": "y", "label": "Y"}]}]}
ANSWER = {"outcome": "answered", "answers": [{"question_id": "go", "option_ids": ["y"]}]}
GATED = "#!scenario\nask-question " + json.dumps(QUESTION) + "\nsay done\n"


def job(job_id: str) -> dict[str, Any]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = job_id
    data["prompt"] = GATED
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    return data


def until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.02)
    sys.exit(f"timed out waiting for {what}")


def start(logs: Path, name: str, grace: float) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        ACPW_REDIS_URL=URL,
        ACPW_BROKER_URL=BROKER,
        ACPW_SECRETS_DIR=str(REPO / "examples" / "secrets"),
        ACPW_WORKER_ID=name,
        ACPW_DRAIN_GRACE_S=str(grace),
    )
    log = logs / f"{name}.log"
    acp_worker = str(Path(sys.executable).with_name("acp-worker"))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [acp_worker, "serve", "--concurrency", "1", "--no-reaper"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    until(lambda: " ready." in log.read_text() or proc.poll() is not None, f"worker {name}")
    if proc.poll() is not None:
        sys.exit(f"worker {name} did not start; see {log}")
    return proc


def term_to_exit_ms(proc: subprocess.Popen[bytes]) -> int:
    start_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    if proc.wait(120) != 0:
        sys.exit(f"serve exited {proc.returncode} after SIGTERM")
    return round((time.monotonic() - start_at) * 1000)


def stream_ms(r: redis.Redis, job_id: str, event_type: str, attempt: int) -> int | None:
    for entry_id, fields in r.xrange(keys.events(job_id)):
        event = json.loads(fields[b"event"])
        if (event["type"], event["attempt"]) == (event_type, attempt):
            return int(entry_id.split(b"-")[0])
    return None


def question(r: redis.Redis, job_id: str, attempt: int) -> str | None:
    for _, fields in r.xrange(keys.events(job_id)):
        event = json.loads(fields[b"event"])
        if (event["type"], event["attempt"]) == ("interaction.requested", attempt):
            return str(event["data"]["interaction_id"])
    return None


def hand_back_round(
    client: Client, r: redis.Redis, logs: Path, i: int, grace: float
) -> tuple[int, int]:
    """(SIGTERM → exit ms, hand-back → attempt 2 running ms)."""
    job_id = f"bench-drain-{i}"
    busy = start(logs, f"busy-{i}", grace)
    client.submit(job(job_id))
    until(lambda: question(r, job_id, 1), "attempt 1's question")
    standby = start(logs, f"standby-{i}", 60)
    exit_ms = term_to_exit_ms(busy)
    second = until(lambda: question(r, job_id, 2), "attempt 2's question")
    client.answer(job_id, second, ANSWER)
    until(lambda: client.get(job_id).status == "succeeded", "attempt 2 to succeed")
    handed = stream_ms(r, job_id, "job.completed", 1)
    running = stream_ms(r, job_id, "job.started", 2)
    if handed is None or running is None:
        sys.exit(f"{job_id}: no hand-back or no attempt 2 in its events")
    term_to_exit_ms(standby)
    return exit_ms, running - handed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=size(3, 1))
    parser.add_argument("--grace", type=float, default=1.0)
    args = parser.parse_args()
    dry_run("exit within terminationGracePeriodSeconds (30 s)")
    for url in (URL, BROKER):
        redis.Redis.from_url(url).flushdb()
    logs = Path(tempfile.mkdtemp(prefix="acpw-bench-drain-"))
    idle, exits, handoffs = [], [], []
    with Client(URL, settings=Settings(redis_url=URL, broker_url=BROKER)) as client:
        r = redis.Redis.from_url(URL)
        for i in range(args.rounds):
            idle.append(term_to_exit_ms(start(logs, f"idle-{i}", 60)))
            exit_ms, handoff = hand_back_round(client, r, logs, i, args.grace)
            exits.append(exit_ms)
            handoffs.append(handoff)
    median = statistics.median
    print(f"rounds: {args.rounds}, grace {args.grace:g} s (worker logs: {logs})")
    print(f"idle SIGTERM → exit (baseline):   median {median(idle):7.0f} ms  {idle}")
    print(f"busy SIGTERM → exit, handed back: median {median(exits):7.0f} ms  {exits}")
    print(f"  of which past the grace:        median {median(exits) - args.grace * 1000:7.0f} ms")
    print(f"hand-back → attempt 2 running:    median {median(handoffs):7.0f} ms  {handoffs}")
    summary(
        f"SIGTERM → exit idle {median(idle) / 1000:.1f} s, handed back "
        f"{median(exits) / 1000:.1f} s; hand-back → attempt 2 {median(handoffs):.0f} ms",
        "exit ≤ 30 s",
        max(exits) <= 30_000,
    )


if __name__ == "__main__":
    main()
