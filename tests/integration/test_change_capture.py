"""Change capture against real trees: exact statuses, and a patch `git apply` accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from worker.workspace.capture import snapshot
from worker.workspace.changes import capture, event_data, write_patch
from worker.workspace.stage import stage_local

OWNER = (os.getuid(), os.getgid())


def _tree(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "keep.py").write_text("a = 1\n")
    (root / "src" / "edit.py").write_text("line 1\nline 2\nline 3\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / "noeol.txt").write_text("no newline")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")


def _agent_edits(ws: Path) -> None:
    (ws / "src" / "edit.py").write_text("line 1\nline two\nline 3\nline 4\n")
    (ws / "gone.txt").unlink()
    (ws / "tool.sh").chmod(0o755)
    (ws / "new dir").mkdir()
    (ws / "new dir" / "added.md").write_text("# new\n")
    (ws / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    (ws / "noeol.txt").write_text("no newline, still")
    os.symlink("/etc/passwd", ws / "passwd")
    (ws / "big.dat").write_bytes(os.urandom(2 * 1024 * 1024))
    (ws / ".git" / "HEAD").write_text("tampered\n")  # not part of the capture


def test_capture_reports_exactly_what_changed_and_the_patch_applies(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _tree(source)
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    _agent_edits(staged.path)
    captured = capture(staged, inline_limit=1024 * 1024)
    status = {c.path: c.status for c in captured.changes}
    assert status == {
        "src/edit.py": "modified",
        "gone.txt": "deleted",
        "tool.sh": "mode_changed",
        "new dir": "added",
        "new dir/added.md": "added",
        "blob.bin": "modified",
        "noeol.txt": "modified",
        "passwd": "added",
        "big.dat": "added",
    }
    assert captured.patch.omitted == ("big.dat",)
    ref = write_patch(captured.patch, tmp_path / "out" / "changes.patch")
    data = event_data(captured, ref, max_paths=100)
    assert data["counts"] == {
        "added": 4,
        "modified": 3,
        "deleted": 1,
        "mode_changed": 1,
        "type_changed": 0,
    }
    link = next(p for p in data["paths"] if p["path"] == "passwd")
    assert link == {
        "path": "passwd",
        "status": "added",
        "kind": "link",
        "mode": "0777",
        "target": "/etc/passwd",
        "in_patch": True,
    }
    big = next(p for p in data["paths"] if p["path"] == "big.dat")
    assert big["size"] == 2 * 1024 * 1024
    assert big["in_patch"] is False
    # Apply the patch to a fresh copy of the source with git; the result equals the workspace.
    check = tmp_path / "check"
    shutil.copytree(source, check, symlinks=True)
    shutil.rmtree(check / ".git")
    subprocess.run(["git", "init", "-q", str(check)], check=True)
    subprocess.run(
        ["git", "-C", str(check), "apply", "--whitespace=nowarn", ref["path"]], check=True
    )
    (check / "big.dat").write_bytes((staged.path / "big.dat").read_bytes())  # omitted on purpose
    want = {k: v for k, v in snapshot(staged.path).items()}
    got = {k: v for k, v in snapshot(check).items()}
    assert got == want


def test_no_changes_gives_an_empty_patch(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _tree(source)
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    captured = capture(staged, inline_limit=1024)
    assert captured.changes == ()
    assert captured.patch.text == b""


def test_path_list_is_bounded_with_counts(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    for i in range(30):
        (staged.path / f"f{i:02}.txt").write_text(str(i))
    data = event_data(capture(staged, inline_limit=1024), None, max_paths=10)
    assert data["total"] == 30
    assert data["truncated"] is True
    assert len(data["paths"]) == 10
    assert data["counts"]["added"] == 30
