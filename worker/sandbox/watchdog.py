"""A sandbox's lease watchdog: a tiny process that kills the sandbox once the job's
lease deadline passes unrenewed, whatever state the worker is in.

A worker that is frozen (SIGSTOP, a hung host) cannot kill its sandbox when its lease
expires, and another host's reaper settles the job ``lost`` and starts a new attempt
meanwhile. So each leased sandbox gets this watchdog: a ``/bin/sh`` loop (a few hundred
microseconds to start, nothing of the worker in it) started in its own session
(``setsid``: a signal to the worker's process group does not reach it).

It follows a *deadline file* the worker rewrites (atomically) on every lease renewal:
one integer, the deadline in hundredths of a second of ``/proc/uptime`` (a clock a shell
reads without forking; the worker converts from ``time.monotonic()`` through the same
file). Once a second it compares; when the deadline has passed it SIGKILLs every member
of the sandbox's cgroups until none is left (``cgroup.kill`` too on cgroup v2; removing
them stays ``destroy``'s job, or a reaper's) and exits. When the file is gone the
sandbox was destroyed: it exits. If the worker dies, the file keeps the last deadline,
which still holds.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHELL = "/bin/sh"

#: ``sh -c SCRIPT acpw-watchdog DEADLINE_FILE CGROUP_DIR...``
SCRIPT = r"""
f=$1; shift
while :; do
  read d < "$f" 2>/dev/null || exit 0
  read up rest < /proc/uptime
  up=${up%.*}${up#*.}
  [ "$up" -ge "$d" ] 2>/dev/null && break
  sleep 1
done
n=0
while [ "$n" -lt 500 ]; do
  left=0
  for g; do
    [ -e "$g/cgroup.kill" ] && { echo 1 > "$g/cgroup.kill"; } 2>/dev/null
    [ -r "$g/cgroup.procs" ] || continue
    while read p; do left=1; kill -9 "$p" 2>/dev/null; done < "$g/cgroup.procs"
  done
  [ "$left" = 0 ] && exit 0
  n=$((n + 1))
  sleep 0.01
done
exit 1
"""


def uptime_centis(monotonic_at: float) -> int:
    """``monotonic_at`` (a ``time.monotonic()`` instant) on the ``/proc/uptime`` clock,
    in hundredths of a second (rounded down: the watchdog never fires late for it).

    Read from ``/proc/uptime`` itself, as the watchdog reads it (a container's
    ``/proc/uptime`` may be virtualized, e.g. by LXCFS, and differ from the kernel's
    boot-time clock).

    Raises:
        OSError: ``/proc/uptime`` is unreadable.
    """
    with open("/proc/uptime", encoding="ascii") as uptime:
        up = float(uptime.read().split()[0])
    now = time.monotonic()  # after the read: the deadline errs early, never late
    return int((up + monotonic_at - now) * 100)


def write_deadline(path: Path, monotonic_at: float) -> None:
    """Atomically set the deadline the watchdog at ``path`` follows.

    Raises:
        OSError: the file could not be written.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{uptime_centis(monotonic_at)}\n")
    tmp.replace(path)


def remove_deadline(path: Path) -> None:
    """The sandbox is destroyed: its watchdog exits at its next look (within a second)."""
    for stale in (path, path.with_name(path.name + ".tmp")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
