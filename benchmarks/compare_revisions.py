"""One benchmark on two revisions of the worker, interleaved, in the same run: did a change
cost anything?

The base revision is extracted from git (``git archive``) into a temporary tree that
borrows this checkout's built pack closures (``provider_packs/*/dist``); then each round
runs the benchmark once in each tree, alternating which goes first, and the medians and
the head/base ratio of its figure are printed. Interleaving matters on a noisy machine:
load that comes and goes hits both sides alike.

With ``--instructions`` the figure is exact instead: the instructions a fixed workload
(``workloads.py``, this checkout's copy, run against each tree) executes in the worker's
own process under ``valgrind --tool=callgrind``, for N events or jobs minus for none, so
the interpreter's start is left out. Child processes (the agent, bubblewrap) are not
counted. Counts do not depend on what else the machine does; one round is enough.

Figures (the benchmark's own output, parsed):
  hello_job         the hello job's TOTAL (ms, lower is better)
  event_throughput  events/s through normalizer, emitter and fenced sink (higher is
                    better), and the same as a ratio to raw XADD measured in that run

    .venv/bin/python benchmarks/compare_revisions.py --base 7109b86 hello_job --rounds 7
    .venv/bin/python benchmarks/compare_revisions.py --base 7109b86 event_throughput \
        --instructions
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: benchmark → (script args, {figure name: (regex on its output, higher is better)})
BENCHMARKS: dict[str, tuple[list[str], dict[str, tuple[str, bool]]]] = {
    "hello_job": (
        ["benchmarks/hello_job.py"],
        {"total_ms": (r"TOTAL\s+([\d.]+)", False)},
    ),
    "event_throughput": (
        ["benchmarks/event_throughput.py", "--events", "30000"],
        {
            "events_per_s": (r"fenced sink\): ([\d,]+) events/s", True),
            "ratio_to_raw": (r"ratio ours/raw: ([\d.]+)", True),
        },
    ),
}


def extract(rev: str, into: Path) -> Path:
    """``rev``'s tree in ``into``, with this checkout's built pack closures linked in."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for dist in (REPO / "provider_packs").glob("*/dist"):
        target = into / "provider_packs" / dist.parent.name / "dist"
        if target.parent.is_dir() and not target.exists():
            target.symlink_to(dist)
    return into


def run_once(tree: Path, args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"benchmark failed in {tree}:\n{done.stdout}\n{done.stderr[-3000:]}")
    return done.stdout


def figures(output: str, wanted: dict[str, tuple[str, bool]]) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, (pattern, _) in wanted.items():
        match = re.search(pattern, output)
        if match is None:
            sys.exit(f"no {name} in the benchmark's output:\n{output}")
        found[name] = float(match.group(1).replace(",", ""))
    return found


#: benchmark → (workload, count) for ``--instructions``
WORKLOADS = {"hello_job": ("hello", 3), "event_throughput": ("events", 5000)}


def instructions(tree: Path, workload: str, count: int, env: dict[str, str]) -> int:
    """Instructions ``workloads.py WORKLOAD COUNT`` executes in its own process."""
    with tempfile.TemporaryDirectory(prefix="acpw-callgrind-") as out:
        out_file = Path(out) / "callgrind.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
             sys.executable, str(REPO / "benchmarks" / "workloads.py"), workload, str(count)],
            cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"workload failed in {tree}:\n{done.stderr[-3000:]}")
        match = re.search(r"^summary: (\d+)", out_file.read_text(), re.MULTILINE)
    if match is None:
        sys.exit("callgrind wrote no summary")
    return int(match.group(1))


def compare_instructions(benchmark: str, trees: dict[str, Path], env: dict[str, str]) -> None:
    workload, count = WORKLOADS[benchmark]
    per: dict[str, float] = {}
    for side, tree in trees.items():
        work = instructions(tree, workload, count, env) - instructions(tree, workload, 0, env)
        per[side] = work / count
        print(f"{side}: {per[side]:,.0f} instructions per {workload} unit", flush=True)
    print(f"  head/base {per['head'] / per['base']:.3f}  cost {per['head'] / per['base'] - 1:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (callgrind)"
    )
    opts = parser.parse_args()
    args, wanted = BENCHMARKS[opts.benchmark]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="acpw-bench-base-") as tmp:
        trees = {"base": extract(opts.base, Path(tmp)), "head": REPO}
        if opts.instructions:
            print(f"{opts.benchmark}: base {opts.base} vs head (this checkout), instructions")
            compare_instructions(opts.benchmark, trees, env)
            return
        seen: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for rnd in range(opts.rounds):
            order = ("base", "head") if rnd % 2 == 0 else ("head", "base")
            for side in order:
                seen[side].append(figures(run_once(trees[side], args, env), wanted))
            print(f"round {rnd + 1}/{opts.rounds}: " + "  ".join(
                f"{side} {seen[side][-1]}" for side in ("base", "head")
            ), flush=True)  # fmt: skip
    print(f"\n{opts.benchmark}: base {opts.base} vs head (this checkout), {opts.rounds} rounds")
    for name, (_, higher_better) in wanted.items():
        base = statistics.median(r[name] for r in seen["base"])
        head = statistics.median(r[name] for r in seen["head"])
        cost = (base / head - 1) if higher_better else (head / base - 1)
        print(
            f"  {name:<14} base {base:12,.2f}  head {head:12,.2f}  head/base {head / base:.3f}"
            f"  cost {cost:+.1%}"
        )


if __name__ == "__main__":
    main()
