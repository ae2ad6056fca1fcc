"""Workspace prepare + change capture against plain git, same repository, same run.

A 10 000-file repository with 100 files changed by the "agent". Ours: clone (shallow,
hardened) + stage the private copy (hashing as it copies) + capture (walk, hash, compare,
binary-safe patch). Baseline: `git clone --depth 1` + `git status --porcelain` +
`git diff` of the same changes. Target: ours <= 1.5x the git baseline.
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

from worker.jobs.spec import GitWorkspace
from worker.workspace import git
from worker.workspace.changes import capture
from worker.workspace.stage import stage_local

FILES = int(os.environ.get("FILES", "10000"))
CHANGED = 100
RUNS = int(os.environ.get("RUNS", "3"))
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


def ours(origin: Path, work: Path) -> float:
    start = time.perf_counter()
    spec = GitWorkspace(kind="git", url=f"file://{origin}", ref="main")
    asyncio.run(git.clone(spec, work / "source", token=None, allowed_schemes=("file",),
                          timeout=300, max_bytes=10**10))  # fmt: skip
    staged = stage_local(work / "source", work / "ws", owner=(os.getuid(), os.getgid()))
    prepared = time.perf_counter() - start
    agent_edits(staged.path)  # not timed: the agent's work
    start = time.perf_counter()
    captured = capture(staged, inline_limit=1024 * 1024)
    assert len(captured.changes) == CHANGED, len(captured.changes)
    return prepared + time.perf_counter() - start


def baseline(origin: Path, work: Path) -> float:
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
    return prepared + time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        origin = make_repo(root)
        ours_s, git_s = [], []
        for run in range(RUNS):
            for name, fn, out in (("ours", ours, ours_s), ("git", baseline, git_s)):
                work = root / f"{name}-{run}"
                work.mkdir()
                out.append(fn(origin, work))
                shutil.rmtree(work)
    o, g = statistics.median(ours_s), statistics.median(git_s)
    print(f"{FILES} files, {CHANGED} changed, median of {RUNS}")
    print(f"  git clone --depth 1 + status + diff : {g * 1000:8.0f} ms")
    print(f"  ours: clone + stage + capture        : {o * 1000:8.0f} ms")
    print(f"  ratio {o / g:.2f}x   target <= 1.5x -> {'OK' if o / g <= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
