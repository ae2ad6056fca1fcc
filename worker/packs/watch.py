"""Closures watched with inotify: what lets a resident worker skip even the scan of a
closure it scanned before (``worker.packs.verify.unchanged``).

A launch checks a closure against its verified record by scanning it (one ``lstat`` per
entry: 18-25 ms for claude-agent-acp's 4,800 entries, on every job's critical path). A
process that scanned a closure and found it matching keeps an inotify instance with a
watch on each of its directories, added *before* that directory was listed, so any
change the scan did not see is an event: a write or truncate (``IN_MODIFY``), a mode,
owner, time or link-count change (``IN_ATTRIB``), an entry created, removed or renamed,
the directory itself removed, moved or unmounted. The kernel reports these for the inode,
through whatever path or mount namespace the change was made, the same changes that move
a ctime (the record's premise, ``worker.packs.verified``). The next check of that closure
reads the instance without blocking: no event (and no queue overflow) and the record
still the one the scan matched, and the scan is skipped. An event, an overflow, a failed
read or another process (a fork shares the instance, and one reader would take the
other's events) drops the watch, and the check scans again.

The one event that does not count is ``IN_ATTRIB`` on the closure directory itself: its
times move on every use (``worker.packs.sources.touch``), and what else an attribute
change there could mean (its mode, its identity) is checked with an ``lstat`` each time.

Without inotify (another OS, or the per-user watch or instance limits reached) nothing is
watched and every check scans, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import struct
import threading
from pathlib import Path
from typing import Final

_IN_MODIFY: Final = 0x002
_IN_ATTRIB: Final = 0x004
_IN_CLOSE_WRITE: Final = 0x008
_IN_MOVED_FROM: Final = 0x040
_IN_MOVED_TO: Final = 0x080
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_ISDIR: Final = 0x4000_0000  # in an event: its subject is a directory
_IN_ONLYDIR: Final = 0x0100_0000
_IN_DONT_FOLLOW: Final = 0x0200_0000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
#: Every change to a directory or to an entry in it (unmount, overflow and a removed
#: watch are reported whatever the mask says).
MASK: Final = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
    | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR | _IN_DONT_FOLLOW
)  # fmt: skip
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(ctypes.CDLL(name), "inotify_init1"):
        return None
    return ctypes.CDLL(name, use_errno=True)


_LIBC: Final = _libc()


class Watch:
    """One closure's inotify instance: ``add`` each directory before it is listed, then
    ``keep`` with the identity digest the scan matched; ``quiet`` says whether nothing
    happened since."""

    __slots__ = ("_fd", "_root_wd", "broken", "entries", "identity", "pid", "root")

    def __init__(self, fd: int, root: os.stat_result) -> None:
        self._fd = fd
        self._root_wd = -1
        self.pid = os.getpid()
        self.root = (root.st_dev, root.st_ino, root.st_mode)
        #: What the scan matched: its entry count and identity digest.
        self.entries = 0
        self.identity = ""
        #: A directory could not be watched (the per-user limit): nothing is kept.
        self.broken = False

    @classmethod
    def start(cls, root: Path) -> Watch | None:
        """An instance watching ``root`` (added first), or None where inotify cannot."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        try:
            info = os.lstat(root)
        except OSError:
            os.close(fd)
            return None
        watch = cls(fd, info)
        watch._root_wd = watch.add(os.fspath(root))
        if watch._root_wd < 0:
            watch.close()
            return None
        return watch

    def add(self, directory: str) -> int:
        """Watch ``directory`` (never following a link): its wd, or -1 when refused (the
        watch limit): the caller then gives the watch up."""
        path = os.fsencode(directory)
        wd = -1 if _LIBC is None else int(_LIBC.inotify_add_watch(self._fd, path, MASK))
        self.broken = self.broken or wd < 0
        return wd

    def quiet(self, root: Path) -> bool:
        """Whether nothing changed below ``root`` since its directories were watched (and
        ``root`` is still the directory that was watched)."""
        if self.pid != os.getpid():
            return False
        try:
            info = os.lstat(root)
        except OSError:
            return False
        if (info.st_dev, info.st_ino, info.st_mode) != self.root or not stat.S_ISDIR(info.st_mode):
            return False
        while True:
            try:
                raw = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not self._only_root_touched(raw):
                return False

    def _only_root_touched(self, raw: bytes) -> bool:
        """Whether every event in ``raw`` is an attribute change of the root itself."""
        offset = 0
        while offset + _EVENT.size <= len(raw):
            wd, mask, _cookie, length = _EVENT.unpack_from(raw, offset)
            if wd != self._root_wd or mask & ~_IN_ISDIR != _IN_ATTRIB or length:
                return False
            offset += _EVENT.size + length
        return True

    def close(self) -> None:
        """Close this process's descriptor (a fork's copy too: the parent's instance
        lives on in its own)."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


class Watches:
    """The watches of this process, one per closure path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_root: dict[str, Watch] = {}
        #: Closures a watch could not cover (the per-user watch limit): not tried again,
        #: so a launch does not add hundreds of watches only to give them up each time.
        self._unwatchable: set[str] = set()

    def start(self, root: Path) -> Watch | None:
        """A new watch of ``root`` (``Watch.start``), or None for one given up before."""
        if os.fspath(root) in self._unwatchable:
            return None
        return Watch.start(root)

    def give_up(self, root: Path) -> None:
        """``root`` could not be watched whole: scan it on every check from now on."""
        with self._lock:
            self._unwatchable.add(os.fspath(root))

    def take(self, root: Path) -> Watch | None:
        """The watch of ``root``, removed (the caller puts it back with ``keep``)."""
        with self._lock:
            return self._by_root.pop(os.fspath(root), None)

    def keep(self, root: Path, watch: Watch) -> None:
        with self._lock:
            old = self._by_root.pop(os.fspath(root), None)
            self._by_root[os.fspath(root)] = watch
        if old is not None:
            old.close()


#: This process's watches (``worker.packs.verify.unchanged``).
WATCHES: Final = Watches()

__all__ = ["MASK", "WATCHES", "Watch", "Watches"]
