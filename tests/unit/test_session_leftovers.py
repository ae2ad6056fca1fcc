"""The session's own check (``tests/conftest.py``): a worker process it started that is
still running at its end is found, however it was started; another session's is not."""

from __future__ import annotations

import os
import subprocess
import time

from tests.conftest import SESSION_MARK, left_running


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
