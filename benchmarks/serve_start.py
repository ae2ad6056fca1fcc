"""``acp-worker serve`` start → ready, against the same Celery worker with gossip and mingle.

Per round, interleaved (which goes first alternates), each timed from the process start to
Celery's ``ready.`` line in its log, then stopped with SIGTERM:

- **serve**: ``acp-worker serve --concurrency 1 --no-reaper`` as operators run it
  (``--without-gossip --without-mingle``, docs/operating.md);
- **baseline**: the very command line ``serve`` execs, without those two flags (Celery's
  defaults: mingle asks the other workers for their state at every start).

    .venv/bin/python benchmarks/serve_start.py [--rounds 5]

Uses Redis db 12 (events) and 11 (broker) unless ACPW_BENCH_REDIS_URL / _BROKER_URL say
otherwise; the broker is flushed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from _bench import dry_run, size, summary

from worker.cli.service import QUIET_CELERY

REPO = Path(__file__).resolve().parent.parent
URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
BROKER = os.environ.get("ACPW_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")


def start_to_ready(argv: list[str], log: Path) -> float:
    """Milliseconds from starting ``argv`` to its ``ready.`` line; then SIGTERM, wait."""
    env = dict(os.environ, ACPW_REDIS_URL=URL, ACPW_BROKER_URL=BROKER)
    env["ACPW_SECRETS_DIR"] = str(REPO / "examples" / "secrets")
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while " ready." not in log.read_text():
            if proc.poll() is not None or time.monotonic() - start > 120:
                sys.exit(f"{argv[:3]} did not get ready; see {log}")
            time.sleep(0.01)
        return (time.monotonic() - start) * 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=size(5, 1))
    args = parser.parse_args()
    dry_run("faster than the baseline (no mingle wait)")
    redis.Redis.from_url(BROKER).flushdb()
    acp_worker = str(Path(sys.executable).with_name("acp-worker"))
    serve = [acp_worker, "serve", "--concurrency", "1", "--no-reaper"]
    # What serve execs (worker.cli.service.serve_argv), Celery's defaults restored.
    celery = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "runs", "-O", "fair"]
    baseline = [*celery, "--loglevel", "INFO", "--concurrency", "1"]
    assert not set(QUIET_CELERY) & set(baseline)
    times: dict[str, list[float]] = {"serve": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="acpw-bench-serve-") as logs:
        for i in range(args.rounds):
            order = ("serve", "baseline") if i % 2 == 0 else ("baseline", "serve")
            for side in order:
                argv = serve if side == "serve" else baseline
                times[side].append(start_to_ready(argv, Path(logs) / f"{side}-{i}.log"))
    redis.Redis.from_url(BROKER).flushdb()
    ours, base = statistics.median(times["serve"]), statistics.median(times["baseline"])
    print(f"rounds: {args.rounds}, interleaved")
    print(f"serve start → ready (no gossip, no mingle): median {ours:7.0f} ms  {times['serve']}")
    print(f"baseline, gossip and mingle on:             median {base:7.0f} ms  {times['baseline']}")
    print(f"ratio serve/baseline {ours / base:.2f}  ({ours - base:+.0f} ms)")
    summary(
        f"serve start → ready {ours:.0f} ms = {ours / base:.2f}x Celery's defaults ({base:.0f} ms)",
        "< 1.0x the baseline",
        ours < base,
    )


if __name__ == "__main__":
    main()
