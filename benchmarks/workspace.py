"""A job's workspace work against plain git, same repository, same run.

A 10 000-file repository with 100 files changed by the "agent". Ours is what a job does,
through the job's own entry points: ``prepare_workspace`` (hardened shallow clone,
admission of the source, the workspace's own loop-mounted disk of ``limits.disk_mb`` when
``ACPW_WORKSPACE_DISK`` is ``loop`` — the default, and what production runs — then the
private copy, hashed as it is written) and, after the agent's edits, ``capture`` (walk,
hash, compare, patch with git's diff, bounded) and ``write_patch``. Baseline:
``git clone --depth 1`` + ``git status --porcelain`` + ``git diff`` of the same changes.
Target: ours <= 1.5x the git baseline. Removing the job's directory (unmount, delete) is
timed apart: the baseline has nothing to match it.

``DISK=off`` measures without the disk (as a worker with ``ACPW_WORKSPACE_DISK=off``);
the loop disk needs root and /dev/loop-control.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _bench import dry_run, size, summary

from worker.jobs.spec import GitWorkspace, Limits
from worker.sandbox.config import LocalConfig
from worker.settings import Settings
from worker.workspace.changes import capture, capture_limits, write_patch
from worker.workspace.prepare import Prepared, prepare_workspace

FILES = int(os.environ.get("FILES", str(size(10_000, 300))))
CHANGED = 100
RUNS = int(os.environ.get("RUNS", str(size(3, 1))))
DISK = os.environ.get("DISK", "loop")
DISK_MB = Limits().disk_mb
ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
       "GIT_COMMITTER_EMAIL": "b@b", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}  # fmt: skip


def make_repo(root: Path) -> Path:
    repo = root / "origin"
    for i in range(FILES):
        path = repo / f"pkg{i % 100:02}" / f"mod{i:05}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {i}\n" + "def f():\n    return 1\n" * 20)
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=ENV)
    return repo


def agent_edits(tree: Path) -> None:
    for i in range(0, FILES, FILES // CHANGED):
        path = tree / f"pkg{i % 100:02}" / f"mod{i:05}.py"
        path.write_text(path.read_text().replace("return 1", "return 2", 1))


def _settings(work: Path) -> Settings:
    return Settings(
        work_dir=work,
        results_dir=work / "results",
        git_allowed_schemes=("file",),
        workspace_disk="loop" if DISK == "loop" else "off",
    )


async def _prepare(origin: Path, settings: Settings, job_dir: Path, prepared: Prepared) -> Path:
    spec = GitWorkspace(kind="git", url=f"file://{origin}", ref="main")
    staged = await prepare_workspace(
        spec, prepared, settings=settings, job_dir=job_dir, base_dir=None, provider="cursor",
        owner=LocalConfig.from_settings(settings).host_owner(), secrets={}, disk_mb=DISK_MB,
    )  # fmt: skip
    return staged.path


def ours(origin: Path, work: Path) -> tuple[float, float, float]:
    """(prepare, capture, removal) seconds."""
    settings = _settings(work)
    job_dir = work / "job"
    job_dir.mkdir(mode=0o711)
    prepared = Prepared(cleanup=[job_dir])
    start = time.perf_counter()
    path = asyncio.run(_prepare(origin, settings, job_dir, prepared))
    prepared_s = time.perf_counter() - start
    assert prepared.staged is not None
    assert (prepared.disk is not None) == (DISK == "loop")
    agent_edits(path)  # not timed: the agent's work
    start = time.perf_counter()
    captured = capture(prepared.staged, limits=capture_limits(settings))
    write_patch(captured.patch, settings.results_dir / "changes.patch")
    assert len(captured.changes) == CHANGED, len(captured.changes)
    assert captured.patch.complete
    captured_s = time.perf_counter() - start
    start = time.perf_counter()
    asyncio.run(prepared.remove())
    return prepared_s, captured_s, time.perf_counter() - start


def baseline(origin: Path, work: Path) -> tuple[float, float, float]:
    start = time.perf_counter()
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{origin}", str(clone)],
                   check=True, env=ENV)  # fmt: skip
    prepared = time.perf_counter() - start
    agent_edits(clone)
    start = time.perf_counter()
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], check=True,
                            capture_output=True, env=ENV).stdout  # fmt: skip
    subprocess.run(["git", "-C", str(clone), "diff"], check=True, capture_output=True, env=ENV)
    assert len(status.splitlines()) == CHANGED
    return prepared, time.perf_counter() - start, 0.0


def main() -> None:
    dry_run("≤ 1.5x git clone + status + diff")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        origin = make_repo(root)
        times: dict[str, list[tuple[float, float, float]]] = {"ours": [], "git": []}
        for run in range(RUNS):
            for name, fn in (("ours", ours), ("git", baseline)):
                work = root / f"{name}-{run}"
                work.mkdir()
                times[name].append(fn(origin, work))
                shutil.rmtree(work)
    o, o_prep, o_capture, removal = _medians(times["ours"])
    g, g_clone, g_diff, _ = _medians(times["git"])
    disk = f"own {DISK_MB} MiB loop disk" if DISK == "loop" else "no disk (DISK=off)"
    print(f"{FILES} files, {CHANGED} changed, median of {RUNS}; ours with {disk}")
    print(f"  git clone --depth 1 + status + diff : {g * 1000:8.0f} ms"
          f"  (clone {g_clone * 1000:.0f} + status/diff {g_diff * 1000:.0f})")  # fmt: skip
    print(f"  ours: prepare + capture + patch     : {o * 1000:8.0f} ms"
          f"  (prepare {o_prep * 1000:.0f} + capture {o_capture * 1000:.0f})")  # fmt: skip
    print(f"  (not compared) removing the job dir : {removal * 1000:8.0f} ms")
    print(f"  ratio {o / g:.2f}x   target <= 1.5x -> {'OK' if o / g <= 1.5 else 'MISSED'}")
    summary(
        f"{FILES} files: {o / g:.2f}x git ({o * 1000:.0f} vs {g * 1000:.0f} ms)",
        "≤ 1.5x",
        o / g <= 1.5,
    )


def _medians(runs: list[tuple[float, float, float]]) -> tuple[float, float, float, float]:
    """Medians of the total (first two phases), of each phase, and of the third."""
    total = statistics.median(a + b for a, b, _ in runs)
    first, second, third = (statistics.median(phase) for phase in zip(*runs, strict=True))
    return total, first, second, third


if __name__ == "__main__":
    main()
