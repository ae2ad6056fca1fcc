"""What every benchmark shares: the tiny-size mode and the summary line ``make bench`` reads.

- ``ACPW_BENCH_QUICK=1``: every script runs a tiny size (a round or two, small inputs), to
  check that it runs to the end; its figures mean nothing then.
- ``ACPW_BENCH_DRY=1``: a script imports what it needs, prints its summary line (verdict
  ``dry``) and exits without measuring: the check that it starts.
- Each script ends by printing one line ``BENCH-SUMMARY {"script", "figure", "target",
  "verdict"}`` (JSON); ``make bench`` (``scripts/bench.sh``) collects them into one table.

The scripts run as ``python benchmarks/<name>.py`` with the repository root on
``PYTHONPATH`` (the make target sets it), so ``tests`` and ``worker`` import as in the suite.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

QUICK = os.environ.get("ACPW_BENCH_QUICK") == "1"
DRY = os.environ.get("ACPW_BENCH_DRY") == "1"
PREFIX = "BENCH-SUMMARY "


def size(full: int, quick: int) -> int:
    """``full``, or ``quick`` in the tiny-size mode."""
    return quick if QUICK else full


def verdict(met: bool | None) -> str:
    """``met`` / ``not met``; ``quick`` whatever the figure in the tiny-size mode (its
    figures mean nothing); ``measured`` for a figure without a target."""
    if QUICK:
        return "quick"
    if met is None:
        return "measured"
    return "met" if met else "not met"


def summary(figure: str, target: str, met: bool | None, *, note: str = "") -> None:
    """Print the script's summary line; ``note`` is appended to the verdict (what it could
    not measure, say), but not in the tiny-size mode."""
    script = Path(sys.argv[0]).name
    said = verdict(met) + (f" ({note})" if note and not QUICK else "")
    line = {"script": script, "figure": figure, "target": target, "verdict": said}
    print(PREFIX + json.dumps(line, ensure_ascii=False), flush=True)


def dry_run(target: str) -> None:
    """In ``ACPW_BENCH_DRY`` mode: print the summary line and exit 0 (called once the
    script's imports are done)."""
    if DRY:
        script = Path(sys.argv[0]).name
        line = {"script": script, "figure": "-", "target": target, "verdict": "dry"}
        print(PREFIX + json.dumps(line, ensure_ascii=False), flush=True)
        sys.exit(0)
