"""Run benchmarks one after the other, each to its end, then print one table of their
summary lines (figure, target, verdict): what ``make bench`` runs.

    python benchmarks/_run.py benchmarks/hello_job.py benchmarks/normalize.py ...

Each script runs as ``python benchmarks/<name>.py`` with the repository root on
``PYTHONPATH``; its output goes through as it comes. A script that exits without its
summary line (``_bench.summary``) is a failure, listed in the table; a target not met is
a verdict, not a failure. Exits 1 if any script failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bench import PREFIX

REPO = Path(__file__).resolve().parent.parent


def run(script: str) -> tuple[dict[str, str] | None, int, float]:
    """The script's summary (None without one), its exit code and its seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    print(f"== {script}", flush=True)
    start = time.monotonic()
    found: dict[str, str] | None = None
    with subprocess.Popen(
        [sys.executable, script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith(PREFIX):
                found = json.loads(line[len(PREFIX) :])
    return found, proc.returncode, time.monotonic() - start


def table(rows: list[tuple[str, str, str, str]]) -> str:
    head = ("script", "figure", "target", "verdict")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    lines = []
    for row in [head, *rows]:
        cells = [row[i].ljust(widths[i]) for i in range(3)]
        lines.append(" | ".join([*cells, row[3]]))
    lines.insert(1, "-" * min(160, len(lines[0]) + 10))
    return "\n".join(lines)


def main(scripts: list[str]) -> int:
    rows: list[tuple[str, str, str, str]] = []
    failed = False
    for script in scripts:
        found, code, seconds = run(script)
        name = Path(script).name
        if found is None:
            failed = True
            rows.append((name, "-", "-", f"FAILED (exit {code}, no summary, {seconds:.0f} s)"))
        else:
            rows.append((name, found["figure"], found["target"], found["verdict"]))
    print("\n" + table(rows), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
