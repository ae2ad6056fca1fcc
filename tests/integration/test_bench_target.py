"""``make bench`` runs every benchmark to its end and prints one table.

The scripts are the target's own list (``make bench-list``), run by its own runner
(``benchmarks/_run.py``) as the target runs them: each starts (its imports resolve from
the repository root, as the suite's do) and prints its summary line; the fast ones run to
the end at the tiny size. The full sizes are ``make bench``'s (minutes; docs/figures.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.test_service import BROKER_URL

pytestmark = pytest.mark.integration

PREFIX = "BENCH-SUMMARY "
NOT_RUN = {"compare_revisions.py", "workloads.py"}  # a tool needing --base, its workloads
#: Seconds each at the tiny size on a loaded 2-core machine: run to the end here.
FAST = ("normalize.py", "event_throughput.py", "materialize.py", "emulator_start.py")
RUNNERS = 3


def bench_list() -> list[str]:
    out = subprocess.run(
        ["make", "-s", "bench-list"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def run(scripts: list[str], redis_url: str, **mode: str) -> tuple[str, list[dict[str, str]]]:
    env = dict(os.environ, ACPW_BENCH_REDIS_URL=redis_url, ACPW_BENCH_BROKER_URL=BROKER_URL)
    env.pop("PYTHONPATH", None)  # as on a fresh clone: the runner gives the root itself
    done = subprocess.run(
        [sys.executable, "benchmarks/_run.py", *scripts],
        cwd=REPO,
        env=env | mode,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    lines = [json.loads(x[len(PREFIX) :]) for x in done.stdout.splitlines() if x.startswith(PREFIX)]
    return done.stdout, lines


def test_the_target_lists_every_benchmark() -> None:
    listed = [Path(p).name for p in bench_list()]
    scripts = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))
    assert listed == [s for s in scripts if s not in NOT_RUN and not s.startswith("_")]
    assert "serve_start.py" in listed


def test_every_benchmark_starts_and_prints_its_summary(redis_url: str) -> None:
    scripts = bench_list()
    chunks = [scripts[i::RUNNERS] for i in range(RUNNERS)]  # imports dominate: in parallel
    with ThreadPoolExecutor(RUNNERS) as pool:
        runs = list(pool.map(lambda chunk: run(chunk, redis_url, ACPW_BENCH_DRY="1"), chunks))
    for chunk, (out, lines) in zip(chunks, runs, strict=True):
        assert [line["script"] for line in lines] == [Path(p).name for p in chunk]
        assert {line["verdict"] for line in lines} == {"dry"}
        assert all(line["target"] for line in lines)
        table = out[out.rindex("script ") :]  # the table at the end: one row per script
        assert all(Path(p).name in table for p in chunk)


def test_the_fast_benchmarks_run_to_the_end_at_the_tiny_size(redis_url: str) -> None:
    scripts = [p for p in bench_list() if Path(p).name in FAST]
    assert len(scripts) == len(FAST)
    _, lines = run(scripts, redis_url, ACPW_BENCH_QUICK="1")
    assert [line["script"] for line in lines] == [Path(p).name for p in scripts]
    assert {line["verdict"] for line in lines} == {"quick"}
    assert all(line["figure"] not in {"", "-"} for line in lines)
