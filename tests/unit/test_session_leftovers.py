"""The session's own checks (``tests/conftest.py``): a worker process it started that is
still running at its end is found, however it was started; another session's is not. And
what a session leaves in its temp dir fails it, named; a clean one is removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import REPO, SESSION_MARK, SESSION_TMPDIR, left_running, settle_tmpdir


def _leftover(mark: str) -> subprocess.Popen[bytes]:
    """A process named like the worker (its argv[0] is ``acp-worker``), marked ``mark``."""
    env = dict(os.environ, **{SESSION_MARK: mark})
    return subprocess.Popen(["bash", "-c", "exec -a acp-worker sleep 60"], env=env)


def _named(proc: subprocess.Popen[bytes], found: list[str]) -> bool:
    return any(line.startswith(f"{proc.pid}: ") for line in found)


def test_a_worker_process_of_this_session_still_running_is_found() -> None:
    ours = _leftover(os.environ[SESSION_MARK])
    theirs = _leftover("another-session")
    try:
        deadline = time.monotonic() + 10
        while not _named(ours, left_running(os.environ[SESSION_MARK])):
            assert time.monotonic() < deadline, "the leftover was never found"
            time.sleep(0.05)
        assert not _named(theirs, left_running(os.environ[SESSION_MARK]))
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()
    assert not _named(ours, left_running(os.environ[SESSION_MARK]))


INNER = """
import socket, tempfile

def test_leaks(tmp_path):
    assert not str(tmp_path).startswith(tempfile.gettempdir())  # pytest's basetemp: its own
    tempfile.mkdtemp(prefix="leaked-")
    socket.socket(socket.AF_UNIX).bind(tempfile.gettempdir() + "/leaked.sock")
"""


def test_what_a_session_leaves_in_its_temp_dir_fails_it_named(tmp_path: Path) -> None:
    """A session (this suite's conftest, one test that leaks) under this one's temp dir:
    it passes its test, yet fails, naming what it left in a temp dir of its own."""
    (tmp_path / "test_inner.py").write_text(INNER)
    before = set(SESSION_TMPDIR.iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    [folder] = set(SESSION_TMPDIR.iterdir()) - before
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1 passed" in done.stdout
        assert f"left in the session's temp dir {folder}" in done.stdout
        [made] = folder.glob("leaked-*")
        assert f"folder: {made} (0 entries)" in done.stdout.splitlines()
        assert f"socket: {folder}/leaked.sock" in done.stdout.splitlines()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_clean_temp_dir_is_removed_and_leftovers_are_named_and_kept() -> None:
    clean = Path(tempfile.mkdtemp())
    assert settle_tmpdir(clean) == []
    assert not clean.exists()
    left = Path(tempfile.mkdtemp())
    try:
        (left / "pymp-x").mkdir()
        (left / "pymp-x" / "listener").write_text("")
        (left / "tmpfile").write_text("")
        assert settle_tmpdir(left) == [
            f"folder: {left}/pymp-x (1 entries)",
            f"file: {left}/tmpfile",
        ]
        assert left.is_dir()
    finally:
        shutil.rmtree(left)
