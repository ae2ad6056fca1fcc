"""``favordynmods``: whether a task joins its cgroups without waiting for the kernel.

Every migration of a task between cgroups (the first process of each sandbox joins the
sandbox's cgroups: ``worker.sandbox.local.process``) write-locks one kernel lock for all
hierarchies, ``cgroup_threadgroup_rwsem``. Unless a cgroup2 hierarchy is mounted with
``favordynmods``, that lock is kept fast for its readers (every fork and exit) and a
writer first waits out an RCU grace period: 6-19 ms on a 2-core VM, on the path of every
cold job's agent start, against 0.2 ms with the option. The option costs forks and exits
a little (their side of the lock leaves its per-CPU fast path), host-wide.

The worker does not change the host by default: once per process it reads
``/proc/self/mountinfo``, and says (once, at INFO) what the option would save. With
``ACPW_CGROUP_FAVORDYNMODS=true`` a root worker remounts the cgroup2 hierarchy with it
(``mount -o remount,favordynmods``, which keeps the mount's other options); a host booted
with ``cgroup_favordynmods=true`` (Linux 6.7 and later, v1 included) needs neither.

Without the option the worker still keeps the join off the wait (``ACPW_CGROUP_PRIME``,
on by default): :data:`PRIMER`, held from a sandbox's creation until its first process
joined, rewrites the worker's own cgroup membership (the cgroup it is already in: a
migration that moves nothing) every :data:`PRIME_EVERY_S`. The first rewrite waits out
the grace period in a thread, beside the rest of the creation; the kernel keeps the lock
ready for writers until a grace period after the last writer, so each later rewrite, and
the sandbox's own join, is cheap (0.1 ms instead of 7 ms measured). While it runs, forks
and exits pay what ``favordynmods`` makes them pay, host-wide: tens of milliseconds per
cold sandbox.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from worker.sandbox import cgroups

log = logging.getLogger(__name__)

_checked = threading.Event()
#: Whether migrations are fast without priming (``favordynmods``), once ``check`` knows.
_favored: list[bool] = []
#: How often :data:`PRIMER` rewrites the membership: well inside one grace period.
PRIME_EVERY_S: Final = 0.002
#: A hold not released by then lapses (a creation that failed before its first spawn).
PRIME_FOR_AT_MOST_S: Final = 1.0


def check(
    favor: bool,
    *,
    privileged: bool,
    prime: bool = True,
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> bool | None:
    """Once per process (None on later calls): whether migrations are fast now (a cgroup2
    hierarchy mounted with ``favordynmods``), after remounting one with it when ``favor``
    and ``privileged``; None as well when there is no cgroup2 hierarchy to say. ``prime``
    (``ACPW_CGROUP_PRIME``) only changes what it says when they are not."""
    if _checked.is_set():
        return None
    _checked.set()
    try:
        text = mountinfo.read_text()
    except OSError:
        return None
    state = cgroups.dynmods_favored(text)
    _favored[:] = [state is None or state]  # no cgroup2: nothing to prime either
    if state is None or state:
        return state
    if not favor:
        if prime:
            log.info(
                "cgroup2 is mounted without favordynmods: the worker primes cgroup "
                "migrations while each sandbox starts (ACPW_CGROUP_PRIME); "
                "ACPW_CGROUP_FAVORDYNMODS=true remounts it instead (docs/operating.md)"
            )
        else:
            log.info(
                "cgroup2 is mounted without favordynmods: each sandbox's first process "
                "waits out an RCU grace period (several ms) to join its cgroups; "
                "ACPW_CGROUP_FAVORDYNMODS=true remounts it (docs/operating.md)"
            )
        return False
    if not privileged:
        log.warning("ACPW_CGROUP_FAVORDYNMODS is set, but only root can remount cgroup2")
        return False
    return _remount(cgroups.cgroup2_mounts(text))


def _remount(points: list[str]) -> bool:
    """Remount the first of ``points`` that takes ``favordynmods``: whether one did."""
    for point in points:
        done = subprocess.run(
            ["mount", "-o", "remount,favordynmods", point],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            log.info("remounted %s with favordynmods (ACPW_CGROUP_FAVORDYNMODS)", point)
            _favored[:] = [True]
            return True
        log.warning("could not remount %s with favordynmods: %s", point, done.stderr.strip())
    return False


def own_procs_file(
    cgroup: Path = Path("/proc/self/cgroup"), mountinfo: Path = Path("/proc/self/mountinfo")
) -> Path | None:
    """The ``cgroup.procs`` of the cgroup2 cgroup this process is in, or None (no cgroup2
    hierarchy, or the cgroup lies outside every cgroup2 mount this process sees)."""
    try:
        lines = cgroup.read_text().splitlines()
        mounts = mountinfo.read_text()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if own is None or not own.startswith("/"):
        return None
    for line in mounts.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or not tail.startswith("cgroup2 ") or len(fields) < 5:
            continue
        root, point = fields[3].replace("\\040", " "), fields[4].replace("\\040", " ")
        if root == "/":
            relative = own
        elif own == root or own.startswith(root + "/"):
            relative = own[len(root) :]
        else:
            continue
        return Path(point, relative.lstrip("/"), "cgroup.procs")
    return None


class Primer:
    """While held (``hold``), keeps migrations cheap where ``favordynmods`` is off: a
    thread rewrites this process's own membership (the module's docstring). Holds are
    counted; the thread ends once none is left, or each lapsed. A rewrite that fails
    (no cgroup2, a non-root worker, a cgroup it may not write) stops the priming in this
    process for good: the joins then wait, as without it."""

    def __init__(self, procs: Callable[[], Path | None] = own_procs_file) -> None:
        self._procs = procs
        self._lock = threading.Lock()
        self._holds: dict[int, float] = {}
        self._serial = 0
        self._thread: threading.Thread | None = None
        self.broken = False

    def hold(self, *, for_at_most_s: float = PRIME_FOR_AT_MOST_S) -> Callable[[], None]:
        """Prime until the returned release is called (idempotent) or ``for_at_most_s``."""
        with self._lock:
            if self.broken:
                return _nothing
            self._serial += 1
            key = self._serial
            self._holds[key] = time.monotonic() + for_at_most_s
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="acpw-prime", daemon=True)
                self._thread.start()

        def release() -> None:
            with self._lock:
                self._holds.pop(key, None)

        return release

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                self._holds = {k: until for k, until in self._holds.items() if until > now}
                if not self._holds or self.broken:
                    self._thread = None
                    return
            try:
                self._prime()
            except OSError as exc:
                log.info("cgroup migrations are not primed in this process: %s", exc)
                with self._lock:
                    self.broken = True
            time.sleep(PRIME_EVERY_S)

    def _prime(self) -> None:
        """Write this process's pid into the ``cgroup.procs`` of the cgroup it is in.

        Raises:
            OSError: there is none, or the write was refused.
        """
        procs = self._procs()
        if procs is None:
            raise FileNotFoundError("no cgroup2 cgroup of this process to rewrite")
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def forked(self) -> None:
        """In a forked child, which has no thread: it starts its own at its first hold."""
        self._lock = threading.Lock()
        self._holds = {}
        self._thread = None


def _nothing() -> None:
    return None


#: This process's primer (a pool process forked from a parent that primed starts afresh).
PRIMER = Primer()
os.register_at_fork(after_in_child=PRIMER.forked)


def prime(*, enabled: bool, for_at_most_s: float = PRIME_FOR_AT_MOST_S) -> Callable[[], None]:
    """A hold on :data:`PRIMER` while a sandbox starts (release it once its first process
    joined), unless ``enabled`` is off or migrations are fast without it (``check``
    found ``favordynmods``, or no cgroup2 at all)."""
    if not enabled or not _favored or _favored[0]:
        return _nothing
    return PRIMER.hold(for_at_most_s=for_at_most_s)


__all__ = ["PRIMER", "Primer", "check", "own_procs_file", "prime"]
