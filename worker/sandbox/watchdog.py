"""A sandbox's lease watchdog: a small process that kills the sandbox once the job's
lease deadline passes unrenewed, whatever state the worker is in.

A worker that is frozen (SIGSTOP, a hung host) cannot kill its sandbox when its lease
expires, and another host's reaper settles the job ``lost`` and starts a new attempt
meanwhile. So each leased sandbox gets this watchdog, started in its own session
(``setsid``: a signal to the worker's process group does not reach it) and run as a
separate interpreter on the standard library only (``-I -S``: nothing of the worker is
imported, so it costs a few milliseconds to start).

Protocol, on its stdin, one line each: a new deadline (``time.monotonic()`` seconds:
that clock is the host's, shared by every process) or ``done`` (the sandbox was
destroyed normally: exit). At end of input without ``done`` (the worker died) it keeps
the last deadline. When the deadline passes it SIGKILLs every member of the cgroups
named on its command line until none is left (as ``destroy`` does; removing them stays
``destroy``'s job, or a reaper's), and exits. Cgroups already gone count as empty.

Usage: ``python -I -S watchdog.py DEADLINE CGROUP_DIR...``
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

_KILL_ROUNDS = 500  # x 10 ms: bound on the kill loop (pids.max bounds the forking)


def members(paths: list[Path]) -> set[int]:
    """Pids in the ``cgroup.procs`` of ``paths`` (a cgroup gone counts as empty)."""
    pids: set[int] = set()
    for path in paths:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
    return pids


def kill_all(paths: list[Path]) -> int:
    """SIGKILL every member of ``paths`` until none is left; how many rounds had some."""
    rounds = 0
    for _ in range(_KILL_ROUNDS):
        pids = members(paths)
        if not pids:
            break
        rounds += 1
        for path in paths:  # cgroup v2: the kernel kills the whole subtree at once
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return rounds


def follow(deadline: float, fd: int) -> bool:
    """Read deadlines from ``fd`` until ``deadline`` passes (True) or ``done`` (False)."""
    pending = b""
    open_ = True
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        if not open_:
            time.sleep(left)
            continue
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            open_ = False  # the worker is gone: the last deadline stands
            continue
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip() == b"done":
                return False
            with contextlib.suppress(ValueError):
                deadline = float(line)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: watchdog.py DEADLINE CGROUP_DIR...\n")
        return 2
    paths = [Path(p) for p in argv[1:]]
    if follow(float(argv[0]), sys.stdin.fileno()):
        kill_all(paths)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main(sys.argv[1:]))
