"""Staging a workspace onto its own bounded disk vs staging it on the host disk, same run.

The bounded path is what a job pays for `limits.disk_mb`: a sparse copy of the 10 GiB
image formatted once under the worker's cache (``disk.template``), loop-mounted, the copy
staged (hashing as it copies), and at the end unmounted and deleted. ``mkfs`` is the same
with the image formatted for the job (how every job made its disk before the template),
for comparison. The baseline stages the same tree into a plain directory and deletes it.
An empty tree first isolates the fixed cost (image + mount + unmount).
Needs root and loop devices. Target: bounded <= 1.3x the baseline for a 5 000-file tree.

On a host filesystem whose file creation is slow (a VM disk: ~0.6 ms per create here),
the bounded disk can be *faster*: its metadata stays in memory until the unmount writes
it back in large blocks.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _bench import dry_run, size, summary

from worker.workspace import disk
from worker.workspace.stage import remove_staged, stage_local

FILES = int(os.environ.get("FILES", str(size(5000, 50))))
FILE_BYTES = int(os.environ.get("FILE_BYTES", "8192"))
RUNS = int(os.environ.get("RUNS", str(size(5, 1))))
DISK_MB = int(os.environ.get("DISK_MB", "10240"))
OWNER = (61000, 61000)


def make_tree(root: Path) -> Path:
    source = root / "source"
    for i in range(FILES):
        path = source / f"pkg{i % 100:02}" / f"mod{i:05}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(FILE_BYTES // 2).hex().encode())
    return source


def plain(source: Path, job: Path) -> tuple[float, float, float]:
    start = time.perf_counter()
    stage_local(source, job / "workspace", owner=OWNER)
    staged = time.perf_counter()
    remove_staged(job)
    return 0.0, staged - start, time.perf_counter() - staged


def bounded(source: Path, job: Path) -> tuple[float, float, float]:
    return _on_disk(source, job, templates=job.parent / "templates")


def mkfs(source: Path, job: Path) -> tuple[float, float, float]:
    return _on_disk(source, job, templates=None)


def _on_disk(source: Path, job: Path, *, templates: Path | None) -> tuple[float, float, float]:
    start = time.perf_counter()
    made = disk.mount_bounded(job, size_mb=DISK_MB, templates=templates)
    mounted = time.perf_counter()
    stage_local(source, made.mount / "workspace", owner=OWNER)
    staged = time.perf_counter()
    remove_staged(job)
    return mounted - start, staged - mounted, time.perf_counter() - staged


def measure(source: Path, root: Path) -> dict[str, list[tuple[float, float, float]]]:
    results: dict[str, list[tuple[float, float, float]]] = {"plain": [], "bounded": [], "mkfs": []}
    for run in range(RUNS + 1):  # the first round warms the caches (and makes the template)
        for name, fn in (("plain", plain), ("bounded", bounded), ("mkfs", mkfs)):
            job = root / f"{name}-{run}"
            job.mkdir()
            timing = fn(source, job)
            if run:
                results[name].append(timing)
            shutil.rmtree(job, ignore_errors=True)
    return results


def report(title: str, results: dict[str, list[tuple[float, float, float]]]) -> float:
    print(title)
    totals = {}
    for name, rows in results.items():
        setup, stage, cleanup = (statistics.median(col) * 1000 for col in zip(*rows, strict=True))
        totals[name] = statistics.median(sum(row) for row in rows) * 1000
        print(f"  {name:8} setup {setup:7.1f} ms  stage {stage:7.1f} ms  cleanup {cleanup:7.1f} ms"
              f"  total {totals[name]:7.1f} ms")  # fmt: skip
    ratio = totals["bounded"] / totals["plain"]
    print(f"  ratio bounded/plain {ratio:.2f}x ({totals['bounded'] - totals['plain']:+.0f} ms/job)")
    return ratio


def main() -> None:
    dry_run("bounded ≤ 1.3x plain")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        empty = root / "empty"
        empty.mkdir()
        report(f"empty workspace (fixed cost), disk {DISK_MB} MiB, median of {RUNS}",
               measure(empty, root))  # fmt: skip
        ratio = report(f"{FILES} files x {FILE_BYTES} B, disk {DISK_MB} MiB, median of {RUNS}",
                       measure(make_tree(root), root))  # fmt: skip
    print(f"target: bounded <= 1.3x plain for the {FILES}-file tree -> "
          f"{'OK' if ratio <= 1.3 else 'MISSED'}")  # fmt: skip
    summary(f"{FILES}-file tree staged on its own disk: {ratio:.2f}x plain", "≤ 1.3x", ratio <= 1.3)


if __name__ == "__main__":
    main()
