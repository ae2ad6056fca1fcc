"""``acp-worker serve``'s Celery worker start → ready, against the same worker with Celery's
gossip and mingle.

Per round, interleaved (which goes first alternates), each then stopped with SIGTERM:

- **ours**: the command line ``serve`` execs (``worker.cli.service.serve_argv``, with
  ``--without-gossip --without-mingle``, docs/operating.md);
- **baseline**: the same command line without those two flags (Celery's defaults: mingle
  asks the other workers for their state at every start and waits for their replies).

Two figures each: process start → Celery's ``ready.`` line (mostly imports, which on a
loaded machine swing by seconds), and Celery's ``Connected to redis`` → ``ready.`` (both
from the log's own timestamps: what the worker does once connected, where mingle waits).
Also printed: ``acp-worker serve`` itself, start → ready (its CLI, then the exec).

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
from datetime import datetime
from pathlib import Path

import redis
from _bench import dry_run, size, summary

from worker.cli.service import QUIET_CELERY, serve_argv
from worker.settings import Settings

REPO = Path(__file__).resolve().parent.parent
URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
BROKER = os.environ.get("ACPW_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")


def start_to_ready(argv: list[str], log: Path) -> tuple[float, float]:
    """Milliseconds from starting ``argv`` to its ``ready.`` line, and from its ``Connected
    to`` line to that one (log timestamps); then SIGTERM and wait."""
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
        total = (time.monotonic() - start) * 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    return total, (_stamp(text, " ready.") - _stamp(text, "Connected to ")) * 1000


def _stamp(text: str, marker: str) -> float:
    """Seconds (epoch) of the first log line holding ``marker``: ``[YYYY-mm-dd HH:MM:SS,mmm: …``."""
    line = next(x for x in text.splitlines() if marker in x and x.startswith("["))
    when = datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")  # noqa: DTZ007 - local, both
    return when.timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=size(5, 1))
    args = parser.parse_args()
    dry_run("connected → ready below the baseline's (no mingle wait)")
    redis.Redis.from_url(BROKER).flushdb()
    options = argparse.Namespace(concurrency=1, loglevel="INFO")
    ours = serve_argv(options, Settings(redis_url=URL, broker_url=BROKER))
    baseline = [arg for arg in ours if arg not in QUIET_CELERY]
    assert len(baseline) == len(ours) - len(QUIET_CELERY)
    serve = [str(Path(sys.executable).with_name("acp-worker")), "serve", "--concurrency", "1"]
    sides = {"ours": ours, "baseline": baseline, "serve": [*serve, "--no-reaper"]}
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="acpw-bench-serve-") as logs:
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                log = Path(logs) / f"{side}-{i}.log"
                times[side].append(start_to_ready(sides[side], log))
    redis.Redis.from_url(BROKER).flushdb()
    med = {
        side: (statistics.median(t for t, _ in got), statistics.median(c for _, c in got))
        for side, got in times.items()
    }
    print(f"rounds: {args.rounds}, interleaved; medians, ms: start → ready, connected → ready")
    for side, label in (
        ("ours", "serve's Celery worker, no gossip/mingle"),
        ("baseline", "the same with gossip and mingle"),
        ("serve", "acp-worker serve (CLI, then the exec)"),
    ):
        total, connected = med[side]
        print(f"  {label:<40} {total:7.0f}  {connected:6.0f}  {[round(t) for t, _ in times[side]]}")
    ratio = med["ours"][1] / med["baseline"][1]
    print(f"connected → ready: ours/baseline {ratio:.2f}; start → ready "
          f"{med['ours'][0] / med['baseline'][0]:.2f}")  # fmt: skip
    summary(
        f"connected → ready {med['ours'][1]:.0f} ms vs {med['baseline'][1]:.0f} ms with "
        f"gossip and mingle ({ratio:.2f}x); serve start → ready {med['serve'][0]:.0f} ms",
        "< 1.0x the baseline",
        ratio < 1.0,
    )


if __name__ == "__main__":
    main()
