"""Filesystem probes that never follow a symbolic link and bound what they read.

Everything below a level directory is reached through ``*at`` calls on an open directory
descriptor (``fstatat(AT_SYMLINK_NOFOLLOW)``, ``openat(O_NOFOLLOW)``), so a component
swapped for a symlink between two calls is seen, not followed.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from pathlib import Path

# O_PATH: a directory is only ever used as the base of *at calls, which needs search (x)
# permission, not read; a 0711 parent must not turn into a spurious refusal.
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 64 * 1024


class Kind(enum.Enum):
    MISSING = "missing"
    SYMLINK = "symlink"
    DIR = "dir"
    FILE = "file"
    FIFO = "fifo"
    SOCKET = "socket"
    CHAR_DEVICE = "char_device"
    BLOCK_DEVICE = "block_device"
    OTHER = "other"  # not a regular file, kind not known (changed after it was checked)


_WORDS = {
    Kind.MISSING: "nothing",
    Kind.SYMLINK: "a symbolic link",
    Kind.DIR: "a directory",
    Kind.FILE: "a regular file",
    Kind.FIFO: "a FIFO",
    Kind.SOCKET: "a socket",
    Kind.CHAR_DEVICE: "a character device",
    Kind.BLOCK_DEVICE: "a block device",
    Kind.OTHER: "something other than a regular file",
}


def kind_words(kind: Kind) -> str:
    """``kind`` in words, with its article: "a FIFO", "a symbolic link"."""
    return _WORDS[kind]


class SymlinkRace(OSError):
    """A path checked as a non-link was a symlink when opened."""


class NotRegular(OSError):
    """A path checked as a regular file was something else when opened."""


class TooLarge(OSError):
    """A file is larger than the read bound."""


def classify(dir_fd: int, name: str) -> Kind:
    """The kind of ``name`` in ``dir_fd`` without following it; OSError if unknowable."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return Kind.MISSING
    return kind_of(st.st_mode)


def kind_of(mode: int) -> Kind:
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISREG(mode):
        return Kind.FILE
    for test, kind in _SPECIAL:
        if test(mode):
            return kind
    return Kind.OTHER


_SPECIAL = (
    (stat.S_ISFIFO, Kind.FIFO),
    (stat.S_ISSOCK, Kind.SOCKET),
    (stat.S_ISCHR, Kind.CHAR_DEVICE),
    (stat.S_ISBLK, Kind.BLOCK_DEVICE),
)


def open_dir(path: Path | str, *, dir_fd: int | None = None) -> int:
    """Open a directory (the caller closes it); below ``dir_fd`` a link is never followed."""
    flags = _DIR_FLAGS if dir_fd is None else _DIR_FLAGS | os.O_NOFOLLOW
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _translate(exc) from exc


_MAX_LINKS = 40  # as the kernel's own bound on links followed in one lookup


def open_dir_in_root(root_fd: int, rel: str) -> int:
    """Open directory ``rel`` below ``root_fd`` as if ``root_fd`` were ``/``.

    Every component is reached with ``*at`` calls; a symbolic link is resolved by hand
    inside that root (an absolute target restarts at ``root_fd``, ``..`` never climbs
    above it), like ``openat2(RESOLVE_IN_ROOT)``. This is how a container's root seen
    through ``/proc/PID/root`` is walked without landing on the host's own files.

    Raises:
        FileNotFoundError: a component is missing.
        NotRegular: a component is not a directory.
        OSError: a component cannot be examined, or links loop.
    """
    walk = _InRoot(root_fd)
    try:
        walk.run(rel)
        return walk.stack.pop()
    finally:
        walk.close()


def _parts(path: str) -> list[str]:
    """Components of ``path`` in pop order (the first one last)."""
    return [p for p in path.split("/") if p not in ("", ".")][::-1]


class _InRoot:
    def __init__(self, root_fd: int) -> None:
        self.stack = [os.dup(root_fd)]
        self.links = 0

    def run(self, rel: str) -> None:
        pending = _parts(rel)
        while pending:
            part = pending.pop()
            if part == "..":
                if len(self.stack) > 1:
                    os.close(self.stack.pop())
                continue
            kind = classify(self.stack[-1], part)
            if kind is Kind.SYMLINK:
                pending += self._link(part, rel)
            elif kind is Kind.DIR:
                self.stack.append(open_dir(part, dir_fd=self.stack[-1]))
            elif kind is Kind.MISSING:
                raise FileNotFoundError(errno.ENOENT, "no such directory", rel)
            else:
                raise NotRegular(errno.ENOTDIR, "not a directory", rel)

    def _link(self, part: str, rel: str) -> list[str]:
        self.links += 1
        if self.links > _MAX_LINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", rel)
        target = os.readlink(part, dir_fd=self.stack[-1])
        if target.startswith("/"):
            while len(self.stack) > 1:
                os.close(self.stack.pop())
        return _parts(target)

    def close(self) -> None:
        for fd in self.stack:
            os.close(fd)
        self.stack.clear()


def read_bounded(dir_fd: int, name: str, limit: int) -> bytes:
    """Read a regular file of at most ``limit`` bytes, never following a link."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _translate(exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", name)
        if st.st_size > limit:
            raise TooLarge(errno.EFBIG, f"{st.st_size} bytes", name)
        return _read_upto(fd, limit, name)
    finally:
        os.close(fd)


def _read_upto(fd: int, limit: int, name: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # grew after fstat
            raise TooLarge(errno.EFBIG, f"more than {limit} bytes", name)
    return b"".join(chunks)


def _translate(exc: OSError) -> OSError:
    # O_NOFOLLOW on a symlink fails with ELOOP; O_DIRECTORY on a non-directory with ENOTDIR.
    if exc.errno == errno.ELOOP:
        return SymlinkRace(exc.errno, "is a symbolic link", exc.filename)
    if exc.errno == errno.ENOTDIR:
        return NotRegular(exc.errno, "not a directory", exc.filename)
    return exc
