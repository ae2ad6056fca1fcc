"""Copying a directory an agent wrote, without trusting anything in it.

Only directories and regular files with a single link are copied; symlinks are never
followed (every open is ``O_NOFOLLOW`` relative to an already opened directory), and
symlinks, FIFOs, sockets, devices and hard-linked files are skipped and reported. The copy
is bounded in bytes, entries (files and directories) and depth: past a bound it stops
with :class:`OverBound`, leaving a partial destination for the caller to remove.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the stat must not block the open.
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1024 * 1024
MAX_DEPTH = 32


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one copy may hold."""

    max_bytes: int
    max_entries: int
    max_depth: int = MAX_DEPTH


class OverBound(Exception):
    """The tree is larger than its bounds (``what``: bytes, entries or depth)."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"more than {limit} {what}")
        self.what = what
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry that was not copied: ``kind`` is symlink, fifo, socket, device, hardlink."""

    path: str
    kind: str


@dataclass(slots=True)
class CopyReport:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)


def copy_tree(
    source: Path, dest: Path, bounds: Bounds, *, owner: tuple[int, int] | None = None
) -> CopyReport:
    """Copy the directory ``source`` (itself not a symlink) to the new directory ``dest``.

    ``owner`` (uid, gid) is given to everything made; directories are made 0700, files
    keep their permission bits without set-id or sticky bits.

    Raises:
        OverBound: the tree exceeds ``bounds`` (``dest`` is left partial).
        OSError: ``source`` is missing, a symlink or not a directory, or a copy failed.
    """
    fd = os.open(source, _DIR_OPEN)
    try:
        copier = _Copier(bounds, owner)
        copier.directory(fd, dest, "", depth=0)
    finally:
        os.close(fd)
    return copier.report


class _Copier:
    def __init__(self, bounds: Bounds, owner: tuple[int, int] | None) -> None:
        self.bounds = bounds
        self.owner = owner
        self.report = CopyReport()

    def _count(self) -> None:
        report = self.report
        if report.files + report.dirs >= self.bounds.max_entries:
            raise OverBound("entries", self.bounds.max_entries)

    def directory(self, src: int, dst: Path, rel: str, *, depth: int) -> None:
        self._count()
        os.mkdir(dst, 0o700)
        if self.owner is not None:
            os.chown(dst, *self.owner, follow_symlinks=False)
        self.report.dirs += 1
        with os.scandir(src) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            self.entry(src, entry, dst / entry.name, rel + entry.name, depth=depth)

    def entry(self, src: int, entry: os.DirEntry[str], dst: Path, rel: str, *, depth: int) -> None:
        info = entry.stat(follow_symlinks=False)
        kind = _kind(info)
        if kind == "dir":
            if depth + 1 > self.bounds.max_depth:
                raise OverBound("levels of directories", self.bounds.max_depth)
            child = os.open(entry.name, _DIR_OPEN, dir_fd=src)
            try:
                _same(child, info)
                self.directory(child, dst, rel + "/", depth=depth + 1)
            finally:
                os.close(child)
        elif kind == "file":
            self.file(src, entry.name, dst, info)
        else:
            self.report.skipped.append(Skipped(rel, kind))

    def file(self, src: int, name: str, dst: Path, info: os.stat_result) -> None:
        self._count()
        if self.report.bytes + info.st_size > self.bounds.max_bytes:
            raise OverBound("bytes", self.bounds.max_bytes)
        fd = os.open(name, _FILE_OPEN, dir_fd=src)
        try:
            _same(fd, info)
            out = os.open(dst, _NEW_FILE, 0o600)
            try:
                self._copy_bytes(fd, out)
                os.fchmod(out, stat.S_IMODE(info.st_mode) & 0o777)
                if self.owner is not None:
                    os.fchown(out, *self.owner)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        self.report.files += 1

    def _copy_bytes(self, src: int, dst: int) -> None:
        # Counted as read, not as stat said: the bound holds even for a changing file.
        while chunk := os.read(src, _CHUNK):
            self.report.bytes += len(chunk)
            if self.report.bytes > self.bounds.max_bytes:
                raise OverBound("bytes", self.bounds.max_bytes)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file" if info.st_nlink == 1 else "hardlink"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def _same(fd: int, info: os.stat_result) -> None:
    """The opened object is the one that was inspected (nothing swapped in between)."""
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino) or _kind(now) != _kind(info):
        raise OSError(errno.EBUSY, "an entry changed while it was copied")
