"""Closure verification speed against a raw sha256 stream over the same bytes.

Builds a synthetic closure shaped like Cursor's Linux archive (~450 files, ~200 MB: a
bundled node binary and a few other large files, some medium chunks, many small
JavaScript files), warms the page cache, then times in the same run (median of 3):

* baseline: one ``hashlib.sha256`` fed every file in order, 1 MiB reads, one thread;
* ``verify_closure`` with 1 worker and with ``os.cpu_count()`` workers (the default).

Prints both rates in MB/s and the ratio to the baseline. Targets: >= 80 % single-thread,
above 100 % with 2 cores.

    .venv/bin/python benchmarks/materialize.py [--scale 1.0]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _bench import QUICK, dry_run, summary

from worker.packs.closure import ClosureLock, FileEntry
from worker.packs.verify import hash_file, verify_closure

MB = 1024 * 1024
CHUNK = MB


def shape(scale: float) -> list[tuple[str, int]]:
    """(path, size) of a Cursor-like closure."""
    rng = random.Random(1)
    files = [("node", int(100 * MB * scale)), ("index.js", int(12 * MB * scale))]
    files += [(f"build/addon{i}.node", int(8 * MB * scale)) for i in range(3)]
    files += [(f"chunks/{1000 + i}.index.js", int(rng.uniform(1, 4) * MB * scale))
              for i in range(12)]  # fmt: skip
    for i in range(435):
        size = int(min(rng.lognormvariate(9.5, 1.3), 2 * MB) * scale)
        files.append((f"chunks/small/{i}.js" if i % 3 else f"assets/{i}.json", size))
    return files


def build(root: Path, scale: float) -> ClosureLock:
    rng = random.Random(2)
    entries = []
    for rel, size in shape(scale):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        mode = "0755" if rel == "node" or rel.endswith(".node") else "0644"
        path.chmod(0o755 if mode == "0755" else 0o644)
        entries.append(FileEntry(rel, mode, size, hash_file(path)))
    return ClosureLock.build(pack="bench", platform="any", archive_sha256="0" * 64, files=entries)


def raw_stream(root: Path, lock: ClosureLock) -> None:
    digest = hashlib.sha256()
    for entry in lock.files:
        with (root / entry.path).open("rb", buffering=0) as src:
            while chunk := src.read(CHUNK):
                digest.update(chunk)


def median_seconds(fn: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=0.01 if QUICK else 1.0, help="size multiplier"
    )
    args = parser.parse_args()
    dry_run("≥ 80 % single-thread, > 100 % on 2 cores")
    ratios = {}
    with tempfile.TemporaryDirectory(prefix="acpw-bench-") as tmp:
        root = Path(tmp)
        lock = build(root, args.scale)
        total = lock.total_bytes / 1e6
        cpus = os.cpu_count() or 1
        print(f"closure: {len(lock.files)} files, {total:.1f} MB, {cpus} CPUs")
        raw_stream(root, lock)  # warm the page cache
        base = median_seconds(lambda: raw_stream(root, lock))
        print(f"raw sha256 stream      : {total / base:8.1f} MB/s  ({base:.3f} s)")
        for workers in sorted({1, cpus}):
            secs = median_seconds(
                lambda w=workers: verify_closure(root, lock, read_only=False, workers=w)
            )
            print(
                f"verify_closure {workers:2d} thr  : {total / secs:8.1f} MB/s  ({secs:.3f} s)"
                f"  ratio {base / secs:6.1%}"
            )
            ratios[workers] = base / secs
    one, most = ratios[1], ratios[max(ratios)]
    summary(
        f"verification {one:.0%} of a raw sha256 stream (1 thread), {most:.0%} ({max(ratios)})",
        "≥ 80 %, > 100 % on 2 cores",
        one >= 0.8 and (max(ratios) < 2 or most > 1.0),
    )


if __name__ == "__main__":
    main()
