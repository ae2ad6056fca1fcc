"""Per-sandbox cgroups through cgroupfs, on v1 (one directory per controller) or v2.

A :class:`CgroupDriver` creates the cgroup(s) of one sandbox and writes its limits; what
it returns is a plain :class:`CgroupSet` (paths + where the OOM counter lives) that can be
saved as JSON and acted on by *another* process — the reaper — with the module functions
``members``, ``signal_all``, ``remove``, ``oom_kills`` and ``out_of_memory``, which work the
same on both versions.

No systemd here: we write cgroupfs directly. Limits go in before any process joins.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from worker.sandbox.base import ResourceLimits

CFS_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True, slots=True)
class CgroupSet:
    """The cgroup directories of one sandbox and its OOM-kill counter (``file``, ``key``)."""

    version: int
    paths: tuple[Path, ...]
    oom_file: Path
    oom_key: str = "oom_kill"

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(p / "cgroup.procs" for p in self.paths)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "paths": [str(p) for p in self.paths],
            "oom_file": str(self.oom_file),
            "oom_key": self.oom_key,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CgroupSet:
        return cls(
            version=int(data["version"]),
            paths=tuple(Path(p) for p in data["paths"]),
            oom_file=Path(data["oom_file"]),
            oom_key=str(data["oom_key"]),
        )


class CgroupDriver(Protocol):
    """Creates one sandbox's cgroups with its limits applied."""

    version: int

    def plan(self, name: str) -> CgroupSet:
        """Where ``create(name, ...)`` will put the cgroups (nothing is touched)."""
        ...

    def create(self, name: str, limits: ResourceLimits) -> CgroupSet:
        """Make the cgroups and write ``limits``.

        Raises:
            OSError: cgroupfs refused (missing controller, no permission).
        """
        ...


def v1_writes(limits: ResourceLimits) -> dict[str, list[tuple[str, str]]]:
    """Per v1 controller, the (file, value) writes for ``limits``, in order."""
    mem = str(limits.memory_bytes)
    return {
        # memsw must stay >= limit, so the plain limit goes first; memsw == limit means
        # no swap at all (the file exists only with swap accounting on).
        "memory": [
            ("memory.limit_in_bytes", mem),
            ("memory.memsw.limit_in_bytes?", mem),
            ("memory.swappiness", "0"),
        ],
        "pids": [("pids.max", str(limits.pids))],
        "cpu": [
            ("cpu.cfs_period_us", str(CFS_PERIOD_US)),
            ("cpu.cfs_quota_us", str(_quota(limits.cpus) or -1)),
        ],
    }


def v2_writes(limits: ResourceLimits) -> list[tuple[str, str]]:
    """The (file, value) writes for ``limits`` in a v2 cgroup, in order."""
    quota = _quota(limits.cpus)
    return [
        ("memory.max", str(limits.memory_bytes)),
        ("memory.swap.max?", "0"),
        ("pids.max", str(limits.pids)),
        ("cpu.max", f"{quota or 'max'} {CFS_PERIOD_US}"),
    ]


def _quota(cpus: float) -> int | None:
    # The kernel refuses quotas under 1 ms; 0 or negative cpus means "no cpu limit".
    return max(int(cpus * CFS_PERIOD_US), 1000) if cpus > 0 else None


def _apply(directory: Path, writes: Iterable[tuple[str, str]]) -> None:
    # A trailing "?" marks a file that exists only with some kernel options.
    for name, value in writes:
        optional = name.endswith("?")
        target = directory / name.rstrip("?")
        if optional and not target.exists():
            continue
        target.write_text(value)


class CgroupV1:
    """cgroup v1: ``<root>/<controller>/<parent>/<name>`` for memory, pids and cpu."""

    version = 1

    def __init__(self, root: Path, parent: str) -> None:
        self._root = root
        self._parent = parent

    def plan(self, name: str) -> CgroupSet:
        paths = tuple(self._root / c / self._parent / name for c in V1_CONTROLLERS)
        return CgroupSet(1, paths, paths[0] / "memory.oom_control")

    def create(self, name: str, limits: ResourceLimits) -> CgroupSet:
        planned = self.plan(name)
        writes = v1_writes(limits)
        for controller, path in zip(V1_CONTROLLERS, planned.paths, strict=True):
            if not (self._root / controller).is_dir():
                raise FileNotFoundError(f"cgroup v1 controller {controller} is not mounted")
            path.mkdir(parents=True, exist_ok=True)
            _apply(path, writes[controller])
        return planned


class CgroupV2:
    """cgroup v2: one ``<root>/<parent>/<name>`` with memory, pids and cpu enabled."""

    version = 2

    def __init__(self, root: Path, parent: str) -> None:
        self._root = root
        self._parent = parent

    def plan(self, name: str) -> CgroupSet:
        path = self._root / self._parent / name
        return CgroupSet(2, (path,), path / "memory.events")

    def create(self, name: str, limits: ResourceLimits) -> CgroupSet:
        available = (self._root / "cgroup.controllers").read_text().split()
        missing = [c for c in V2_CONTROLLERS if c not in available]
        if missing:
            raise FileNotFoundError(f"cgroup v2 controllers not available: {missing}")
        parent = self._root / self._parent
        parent.mkdir(exist_ok=True)
        enable = " ".join(f"+{c}" for c in V2_CONTROLLERS)
        for level in (self._root, parent):
            (level / "cgroup.subtree_control").write_text(enable)
        planned = self.plan(name)
        planned.paths[0].mkdir(exist_ok=True)
        _apply(planned.paths[0], v2_writes(limits))
        return planned


def detect(root: Path, parent: str) -> CgroupDriver:
    """v2 when ``root`` is a unified hierarchy (it has ``cgroup.controllers``), else v1."""
    if (root / "cgroup.controllers").exists():
        return CgroupV2(root, parent)
    return CgroupV1(root, parent)


def dynmods_favored(mountinfo: str) -> bool | None:
    """Whether a cgroup2 hierarchy in ``mountinfo`` (``/proc/self/mountinfo``'s text) is
    mounted with ``favordynmods``; None when there is no cgroup2 mount at all.

    The lock every task migration between cgroups takes (``cgroup_threadgroup_rwsem``)
    is one for all hierarchies, v1 included; ``favordynmods`` on any cgroup2 mount keeps
    it ready for writers, so a migration no longer waits out an RCU grace period first.
    """
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        if len(fields) != 2 or not fields[1].startswith("cgroup2 "):
            continue
        options = fields[1].split()[2].split(",") if len(fields[1].split()) > 2 else []
        found = found or "favordynmods" in options
    return found


def cgroup2_mounts(mountinfo: str) -> list[str]:
    """The mount points of the cgroup2 hierarchies in ``mountinfo``."""
    points = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        if sep and tail.startswith("cgroup2 ") and len(head.split()) > 4:
            points.append(head.split()[4].replace("\\040", " "))
    return points


def join(cgroups: CgroupSet, pid: int) -> None:
    """Move ``pid`` (a whole thread group) into every cgroup of the set.

    Blocking, and slow when the kernel has not migrated a task lately: the first write
    after an idle spell waits out an RCU grace period (6-19 ms measured on a 2-core VM),
    later ones are cheap; with ``favordynmods`` (:func:`dynmods_favored`) every one is
    (0.2 ms).

    Raises:
        OSError: a cgroup is gone, or the process is.
    """
    text = str(pid)
    for procs in cgroups.procs_files:
        with procs.open("w") as f:
            f.write(text)


def members(cgroups: CgroupSet) -> set[int]:
    """Host pids currently in any of the sandbox's cgroups (empty when they are gone)."""
    pids: set[int] = set()
    for procs in cgroups.procs_files:
        with contextlib.suppress(FileNotFoundError):
            pids.update(int(line) for line in procs.read_text().split())
    return pids


def signal_all(cgroups: CgroupSet, sig: signal.Signals) -> int:
    """Send ``sig`` to every member; returns how many there were."""
    found = members(cgroups)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(found)


#: ``PF_EXITING`` in the flags of ``/proc/<pid>/task/<tid>/stat``: the thread is in the
#: kernel's exit path and can never run user code again.
_PF_EXITING = 0x4


def exiting(pid: int) -> bool:
    """Whether every thread of ``pid`` is exiting (or gone): it can never run again,
    though the kernel may still be tearing it down (closing its files, dropping its
    namespaces) and it still counts as a member until then."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # reaped
        if not int(fields[6]) & _PF_EXITING:  # after the name: state, ppid, …, flags
            return False
    return True


def remove(cgroups: CgroupSet) -> bool:
    """rmdir every cgroup; True when none is left (EBUSY while members are being reaped)."""
    done = True
    for path in cgroups.paths:
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            done = False
    return done


def oom_kills(cgroups: CgroupSet) -> int:
    """How many processes the kernel OOM-killed in this sandbox (0 once it is removed)."""
    try:
        text = cgroups.oom_file.read_text()
    except FileNotFoundError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == cgroups.oom_key:
            return int(value)
    return 0


def out_of_memory(cgroups: CgroupSet) -> bool:
    """Whether the kernel OOM-killed a process of this sandbox (False once it is removed).

    The ``oom_kill`` counter says so (v2 ``memory.events``; v1 ``memory.oom_control``
    since Linux 4.13). A v1 kernel without that counter tells only how often usage hit
    the limit (``memory.failcnt``): asked about a process that SIGKILL ended, that is
    the best evidence it has, so a hit counts.
    """
    try:
        text = cgroups.oom_file.read_text()
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == cgroups.oom_key:
            return int(value) > 0
    if cgroups.version != 1:
        return False
    try:
        return int((cgroups.oom_file.parent / "memory.failcnt").read_text()) > 0
    except (FileNotFoundError, ValueError):
        return False


#: The v1 hierarchies whose cgroup of a process holds all of a container's processes.
_V1_KILLABLE = ("pids", "memory", "freezer")


def of_process(pid: int, root: Path = Path("/sys/fs/cgroup")) -> tuple[Path, ...]:
    """The cgroup directories of another process (a container's init), as this process
    sees them: the unified one on v2; on v1 those of the pids, memory and freezer
    hierarchies that are mounted under ``root``.

    A cgroup is left out when it is a hierarchy's root or also holds this process: killing
    its members would kill far more than the container (an engine that runs containers
    without cgroups of their own, or one outside our cgroup namespace).

    Raises:
        OSError: the process is gone or its cgroups are unreadable.
    """
    theirs = _cgroup_lines(Path(f"/proc/{pid}/cgroup").read_text())
    ours = _cgroup_lines(Path("/proc/self/cgroup").read_text())
    unified = (root / "cgroup.controllers").exists()
    found: list[Path] = []
    for controllers, path in theirs.items():
        names = controllers.split(",") if controllers else []
        if unified != (controllers == ""):
            continue
        if not unified and not set(names) & set(_V1_KILLABLE):
            continue
        if path == "/" or path.startswith("/..") or ours.get(controllers) == path:
            continue
        mount = (
            root
            if unified
            else next((root / n for n in (controllers, *names) if (root / n).is_dir()), None)
        )
        if mount is not None and (mount / path.lstrip("/")).is_dir():
            found.append(mount / path.lstrip("/"))
    return tuple(found)


def _cgroup_lines(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` as {controllers ('' for v2): path}."""
    lines: dict[str, str] = {}
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if path:
            lines[controllers] = path
    return lines
