"""What ``acp-worker serve`` starts next to its jobs goes with it: its reaper, and the
folders its pool needs.

- **The reaper** (``reap --loop``) is the worker's child. The worker stops it when it
  shuts down (``stop_child``: SIGTERM, the reaper ends after the pass under way, then it
  is waited for, so it is neither left running nor left a zombie). A worker killed
  outright takes it along: the reaper asks the kernel for SIGTERM when its parent dies
  (``die_with_parent``), besides checking its parent between passes.
- **The pool's shared memory.** Celery's prefork pool (billiard) keeps a counter per pool
  process in shared memory, backed by a file it makes and unlinks at once in
  multiprocessing's temp folder, by default a new ``pymp-*`` folder in the temp dir that
  only a normal interpreter exit removes (a killed worker left one each time).
  ``keep_pool_files_in`` names the worker's own work dir instead: nothing of the pool
  stays in the temp dir, whatever ends the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing.process
import os
import signal
import time
from pathlib import Path

#: The pid of ``serve``'s reaper, for the worker it becomes (set by ``serve``).
REAPER_PID_ENV = "ACPW_SERVE_REAPER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def keep_pool_files_in(folder: Path) -> None:
    """Make multiprocessing (and billiard, which uses its temp folder) create its files in
    ``folder`` rather than in a ``pymp-*`` folder of its own in the temp dir. Call it in
    the worker's main process before the pool starts; the pool processes inherit it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o711)
    # The one knob multiprocessing.util.get_temp_dir reads.
    config: dict[str, object] = getattr(multiprocessing.process.current_process(), "_config")  # noqa: B009
    config["tempdir"] = str(folder)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``sig`` when this process's parent dies (Linux; elsewhere a
    no-op). The caller still checks its parent once after the call: one that died just
    before it sends nothing."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def stop_child(pid: int, *, grace: float) -> int | None:
    """SIGTERM child ``pid``, wait up to ``grace`` seconds, then SIGKILL; reap it.

    Returns its wait status, or None when it is not (or no longer) our child.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + grace
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            try:
                return os.waitpid(pid, 0)[1]
            except ChildProcessError:
                return None
        time.sleep(0.02)
