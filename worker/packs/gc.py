"""Garbage collection of the pack cache: least-recent use under a byte budget.

What the cache holds (``cache.py`` and ``sources.py`` write it)::

    closures/<hex>/                verified closures, ``touch``ed on every use
    archives/<sha256>              downloaded archives, ``touch``ed on every use
    tmp/<hex>.<suffix>/            leftovers of crashed extractions (or of a gc removal)
    archives/.<sha256>.<pid>.part  leftovers of crashed downloads

``gc`` first removes leftovers nobody is writing, then closures and archives, least
recently used first, until what is left fits the budget. An entry *in use* is never
removed, whatever the budget:

- **locked**: a process holds its lock (``locks/<hex>.lock`` while a closure is extracted,
  ``locks/archive-<sha256>.lock`` while an archive downloads); gc takes the same lock
  without waiting, and removes only while holding it;
- **mounted**: it is bind-mounted in some mount namespace on this host — a running
  sandbox (bubblewrap, the root worker's staging namespace, a container bind mount).
  Every ``/proc/<pid>/mountinfo`` is read and matched by device and path inside the
  filesystem, so a mount made from another namespace is recognised too.

A closure is removed by renaming it into ``tmp/`` first (under its lock), so a reader
finds it either complete or absent, never half deleted.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from worker.mountinfo import Mount, read_mountinfo
from worker.packs.cache import open_lock
from worker.safetree import remove_tree

DEFAULT_BUDGET = 10 * 1024**3

Kind = Literal["closure", "archive", "leftover"]
Action = Literal["removed", "would_remove", "kept"]
Reason = Literal["over budget", "leftover", "within budget", "in use: locked", "in use: mounted"]

_TMP_RE = re.compile(r"^(?P<key>[0-9a-f]{64})\.")
_PART_RE = re.compile(r"^\.(?P<key>[0-9a-f]{64})\.\d+\.part$")
_HEX_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One removable thing in the cache, with the lock that guards it."""

    kind: Kind
    name: str
    path: Path
    bytes: int
    last_used: float
    lock: Path


@dataclass(frozen=True, slots=True)
class GcDecision:
    entry: CacheEntry
    action: Action
    reason: Reason

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.entry.kind,
            "name": self.entry.name,
            "path": str(self.entry.path),
            "bytes": self.entry.bytes,
            "last_used": _iso(self.entry.last_used),
            "action": self.action,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class GcResult:
    """Every entry gc looked at, what it did with it, and why."""

    decisions: tuple[GcDecision, ...]
    budget_bytes: int
    dry_run: bool

    @property
    def removed(self) -> tuple[str, ...]:
        """Names of the closures and archives removed (or that would be, in a dry run)."""
        return tuple(d.entry.name for d in self._gone() if d.entry.kind != "leftover")

    @property
    def freed_bytes(self) -> int:
        return sum(d.entry.bytes for d in self._gone())

    @property
    def kept_bytes(self) -> int:
        return sum(d.entry.bytes for d in self.decisions if d.action == "kept")

    @property
    def over_budget(self) -> bool:
        """Still over budget: entries in use could not be removed."""
        return self.kept_bytes > self.budget_bytes

    def _gone(self) -> Iterator[GcDecision]:
        return (d for d in self.decisions if d.action != "kept")

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "budget_bytes": self.budget_bytes,
            "freed_bytes": self.freed_bytes,
            "kept_bytes": self.kept_bytes,
            "over_budget": self.over_budget,
            "entries": [d.to_json() for d in self.decisions],
        }


MountCheck = Callable[[Path], bool]


def gc(
    cache_dir: Path,
    budget_bytes: int,
    *,
    dry_run: bool = False,
    mounted: MountCheck | None = None,
) -> GcResult:
    """Remove leftovers, then least-recently-used entries until under ``budget_bytes``.

    ``mounted`` tells whether a path is mounted somewhere (default: read every
    ``/proc/*/mountinfo`` once). With ``dry_run`` nothing is removed; the result says
    what would be.
    """
    is_mounted = mounted if mounted is not None else MountTable.read().contains
    decisions = [_collect(e, dry_run, is_mounted) for e in _leftovers(cache_dir)]
    entries = sorted(_entries(cache_dir), key=lambda e: (e.last_used, e.name))
    excess = sum(e.bytes for e in entries) - budget_bytes
    for entry in entries:
        if excess <= 0:
            decisions.append(GcDecision(entry, "kept", "within budget"))
            continue
        decision = _collect(entry, dry_run, is_mounted)
        if decision.action != "kept":
            excess -= entry.bytes
        decisions.append(decision)
    return GcResult(tuple(decisions), budget_bytes, dry_run)


def _collect(entry: CacheEntry, dry_run: bool, mounted: MountCheck) -> GcDecision:
    reason: Reason = "leftover" if entry.kind == "leftover" else "over budget"
    if mounted(entry.path):
        return GcDecision(entry, "kept", "in use: mounted")
    with _try_lock(entry.lock) as held:
        if not held:
            return GcDecision(entry, "kept", "in use: locked")
        if dry_run:
            return GcDecision(entry, "would_remove", reason)
        _remove(entry)
    return GcDecision(entry, "removed", reason)


@contextmanager
def _try_lock(path: Path) -> Iterator[bool]:
    fd = open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _remove(entry: CacheEntry) -> None:
    if entry.kind != "closure":
        remove_tree(entry.path)
        return
    # Its verified record would never match a closure extracted again (new inodes), but
    # need not outlive it.
    (entry.path.parent.parent / "verified" / f"{entry.name}.json").unlink(missing_ok=True)
    # Out of closures/ in one rename, then deleted: never seen half removed there.
    aside = entry.path.parent.parent / "tmp" / f"{entry.name}.gc-{os.getpid()}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(entry.path, aside)
    except FileNotFoundError:  # another gc removed it after we listed it
        return
    remove_tree(aside)


# --- what is in the cache ------------------------------------------------------------


def _entries(cache_dir: Path) -> Iterator[CacheEntry]:
    locks = cache_dir / "locks"
    for path in _children(cache_dir / "closures"):
        if _HEX_RE.match(path.name):
            yield from _entry("closure", path, locks / f"{path.name}.lock")
    for path in _children(cache_dir / "archives"):
        if _HEX_RE.match(path.name):
            yield from _entry("archive", path, locks / f"archive-{path.name}.lock")


def _leftovers(cache_dir: Path) -> Iterator[CacheEntry]:
    locks = cache_dir / "locks"
    for path in _children(cache_dir / "tmp"):
        if match := _TMP_RE.match(path.name):
            yield from _entry("leftover", path, locks / f"{match['key']}.lock")
    for path in _children(cache_dir / "archives"):
        if match := _PART_RE.match(path.name):
            yield from _entry("leftover", path, locks / f"archive-{match['key']}.lock")


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except FileNotFoundError:
        return []


def _entry(kind: Kind, path: Path, lock: Path) -> Iterator[CacheEntry]:
    try:
        yield CacheEntry(kind, path.name, path, tree_bytes(path), path.lstat().st_mtime, lock)
    except FileNotFoundError:  # removed meanwhile (another gc, a finished extraction)
        return


def tree_bytes(path: Path) -> int:
    """Apparent size of a file, or of every file below a directory (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return total


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


# --- mounts in every namespace ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MountTable:
    """Our own mounts (to map a path to device + path in its filesystem) and the mounts
    of every mount namespace visible in ``/proc``."""

    own: tuple[Mount, ...]
    everywhere: frozenset[tuple[str, str]]

    @classmethod
    def read(cls, proc: Path = Path("/proc")) -> MountTable:
        own = tuple(read_mountinfo(proc / "self" / "mountinfo"))
        seen: set[tuple[str, str]] = {(m.device, m.root) for m in own}
        for info in _other_mountinfos(proc):
            seen.update((m.device, m.root) for m in read_mountinfo(info))
        return cls(own, frozenset(seen))

    def contains(self, path: Path) -> bool:
        """Whether ``path`` (or something below it) is mounted in any namespace."""
        where = self.locate(path)
        if where is None:
            return False
        device, inside = where
        prefix = inside.rstrip("/") + "/"
        return any(
            d == device and (r == inside or r.startswith(prefix)) for d, r in self.everywhere
        )

    def locate(self, path: Path) -> tuple[str, str] | None:
        """``(device, path inside that filesystem)`` of ``path`` as this process sees it."""
        real = os.path.realpath(path)
        best: Mount | None = None
        for mount in self.own:
            inside = real == mount.point or real.startswith(mount.point.rstrip("/") + "/")
            if inside and (best is None or len(mount.point) >= len(best.point)):
                best = mount
        if best is None:
            return None
        rest = os.path.relpath(real, best.point)
        return best.device, os.path.normpath(os.path.join(best.root, rest))


def _other_mountinfos(proc: Path) -> Iterator[Path]:
    """One ``mountinfo`` per mount namespace (by the namespace's inode when readable)."""
    namespaces: set[int] = set()
    for pid in _pids(proc):
        try:
            namespace = os.stat(proc / pid / "ns" / "mnt").st_ino
        except OSError:
            namespace = None
        if namespace is not None:
            if namespace in namespaces:
                continue
            namespaces.add(namespace)
        yield proc / pid / "mountinfo"


def _pids(proc: Path) -> Iterable[str]:
    try:
        return [name for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


__all__ = [
    "DEFAULT_BUDGET",
    "CacheEntry",
    "GcDecision",
    "GcResult",
    "Mount",
    "MountTable",
    "gc",
]
