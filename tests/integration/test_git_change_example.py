"""`examples/git_change.py` (`make demo-git`) end to end: real git, bubblewrap, emulator.

The example makes a repository, runs `examples/git-change.json` on a clone of it and
prints what the worker captured. This test checks the printout against what the
scenario in that job did, worked out here independently: every row of the change table,
the patch (byte-equal to the file the event references, and applying with `git apply`
to a fresh clone gives exactly the tree the agent left), and that the worker left
nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_run_job import _check_stream

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "git_change.py"
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}

GREET = 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n'
TEST_GREET = (
    "from src.greet import greet\n\n\n"
    'def test_greet() -> None:\n    assert greet("Ada") == "Hello, Ada!"\n'
)
ICON = b"\x89PNG\r\n\x1a\n\x00"
OLD_GREET = 'def greet(name):\n    return "Hello, " + name\n'
TODO = "- type hints\n- a test\n"
CHECK_SH = "#!/bin/sh\nexec python3 -m py_compile src/greet.py\n"
README = "# greeter\n\nSays hello.\n"

#: The tree the scenario leaves: path -> (bytes, mode) for files, str for a link's target.
AFTER: dict[str, tuple[bytes, int] | str] = {
    "README.md": (README.encode(), 0o644),
    "docs/README.md": "../README.md",
    "docs/icon.png": (ICON, 0o644),
    "scripts/check.sh": (CHECK_SH.encode(), 0o755),
    "src/greet.py": (GREET.encode(), 0o644),
    "tests/test_greet.py": (TEST_GREET.encode(), 0o644),
}


def _sha12(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:12]


def _row(status: str, kind: str, mode: str, size: str, sha: str, path: str) -> dict[str, str]:
    return {"STATUS": status, "KIND": kind, "MODE": mode, "SIZE": size, "SHA256": sha, "PATH": path}


#: The change table the example must print, in the worker's order (sorted by path).
ROWS = [
    _row("added", "link", "0777", "", "", "docs/README.md -> ../README.md"),
    _row("deleted", "file", "", "", "", "docs/TODO.txt"),
    _row("added", "file", "0644", str(len(ICON)), _sha12(ICON), "docs/icon.png"),
    _row(
        "mode_changed",
        "file",
        "0644→0755",
        str(len(CHECK_SH)),
        _sha12(CHECK_SH),
        "scripts/check.sh",
    ),
    _row(
        "modified",
        "file",
        "0644",
        f"{len(OLD_GREET)}→{len(GREET)}",
        f"{_sha12(OLD_GREET)}→{_sha12(GREET)}",
        "src/greet.py",
    ),
    _row("added", "dir", "0755", "", "", "tests"),
    _row("added", "file", "0644", str(len(TEST_GREET)), _sha12(TEST_GREET), "tests/test_greet.py"),
]
# What a deleted path's row may say about the file that was there (capture may report
# its last mode, size and digest; then as `old→`).
DELETED_OLD = {"MODE": "0644→", "SIZE": f"{len(TODO)}→", "SHA256": f"{_sha12(TODO)}→"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=GIT_ENV
    ).stdout


def _run_example(tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        ACPW_CACHE_DIR=str(tmp_path / "cache"),
        ACPW_WORK_DIR=str(tmp_path / "work"),
        ACPW_SHUTDOWN_EOF_GRACE="1",
    )
    demo = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dir", str(demo)],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=90,
        check=False,
    )
    return done, demo


def _table(lines: list[str]) -> list[dict[str, str]]:
    """The change table's rows, cut at the header's column starts."""
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("STATUS"))
    header = lines[start]
    names = header.split()
    cuts = [header.index(name) for name in names] + [None]
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append({n: line[a:b].strip() for n, a, b in zip(names, cuts, cuts[1:], strict=False)})
    return rows


def _between(out: bytes, first: bytes, last: bytes) -> bytes:
    head, _, rest = out.partition(first + b"\n")
    body, found, _ = rest.partition(last + b"\n")
    assert head, "no start marker"
    assert found, "no end marker"
    return body


def _tree(root: Path) -> dict[str, tuple[bytes, int] | str]:
    found: dict[str, tuple[bytes, int] | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/") or (path.is_dir() and not path.is_symlink()):
            continue
        if path.is_symlink():
            found[rel] = os.readlink(path)
        else:
            found[rel] = (path.read_bytes(), stat.S_IMODE(path.lstat().st_mode))
    return found


def _check_rows(printed: list[dict[str, str]]) -> None:
    assert [r["PATH"] for r in printed] == [r["PATH"] for r in ROWS]
    for row, want in zip(printed, ROWS, strict=True):
        got = row
        if want["STATUS"] == "deleted":
            # Blank, or the deleted file's own facts: never anything else.
            got = {k: ("" if DELETED_OLD.get(k) == v else v) for k, v in row.items()}
        assert got == want


def _events(demo: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (demo / "events.jsonl").read_text().splitlines()]


def test_git_change_example_prints_exactly_what_the_scenario_did(tmp_path: Path) -> None:
    done, demo = _run_example(tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = done.stdout.decode().splitlines()
    assert "job.completed: succeeded (end_turn), result bundle: null" in lines
    counts = "added 4, modified 1, deleted 1, mode_changed 1, type_changed 0"
    assert f"workspace.changed: 7 changes ({counts})" in lines
    _check_rows(_table(lines))
    assert "  omitted (listed above, not inlined): none" in lines

    # The printed patch is the file the event references, byte for byte.
    events = _events(demo)
    _check_stream(events)
    ref = next(e["data"] for e in events if e["type"] == "workspace.changed")["patch"]
    printed = _between(done.stdout, b"----- changes.patch", b"----- end of changes.patch")
    assert printed == Path(ref["path"]).read_bytes()
    assert hashlib.sha256(printed).hexdigest() == ref["sha256"]
    assert Path(ref["path"]).is_relative_to(demo / "results")

    # Applied to a fresh clone of the same commit, it gives exactly the agent's tree.
    origin = demo / "origin"
    check = tmp_path / "check"
    _git(tmp_path, "clone", "-q", "--branch", "main", origin.as_uri(), str(check))
    (tmp_path / "printed.patch").write_bytes(printed)
    _git(check, "apply", str(tmp_path / "printed.patch"))
    assert _tree(check) == AFTER
    assert _tree(demo / "applied") == AFTER  # the example's own `git apply`
    status = lines[lines.index("git apply on a fresh clone of main (git status --short):") + 1 :]
    assert status == [
        "  A  docs/README.md",
        "  D  docs/TODO.txt",
        "  A  docs/icon.png",
        "  M  scripts/check.sh",
        "  M  src/greet.py",
        "  A  tests/test_greet.py",
    ]

    # The origin is untouched and the worker kept nothing of the job.
    assert _git(origin, "status", "--porcelain") == ""
    assert _git(origin, "rev-list", "--count", "HEAD").strip() == "1"
    assert os.listdir(tmp_path / "work") == []
