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
"""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path

from worker.sandbox import cgroups

log = logging.getLogger(__name__)

_checked = threading.Event()


def check(
    favor: bool, *, privileged: bool, mountinfo: Path = Path("/proc/self/mountinfo")
) -> bool | None:
    """Once per process (None on later calls): whether migrations are fast now (a cgroup2
    hierarchy mounted with ``favordynmods``), after remounting one with it when ``favor``
    and ``privileged``; None as well when there is no cgroup2 hierarchy to say."""
    if _checked.is_set():
        return None
    _checked.set()
    try:
        text = mountinfo.read_text()
    except OSError:
        return None
    state = cgroups.dynmods_favored(text)
    if state is None or state:
        return state
    if not favor:
        log.info(
            "cgroup2 is mounted without favordynmods: each sandbox's first process waits "
            "out an RCU grace period (several ms) to join its cgroups; "
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
            return True
        log.warning("could not remount %s with favordynmods: %s", point, done.stderr.strip())
    return False


__all__ = ["check"]
