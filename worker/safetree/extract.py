"""Extracting a tar stream someone else made, member by member, refusing what is unsafe.

Never ``tarfile.extractall``: only regular files and directories are accepted (links,
devices, FIFOs are refused, not skipped: an archive that holds them is not the one that
was meant); every member's name must be a canonical relative path
(:func:`~.names.path_problem`: no ``..``, not absolute); every path is created beneath
the destination through directory descriptors with ``O_NOFOLLOW`` (no link is ever
followed, even one already in the destination); files are created with ``O_EXCL``
(nothing existing is overwritten); total size and entry count are bounded. Each file is
hashed while it is written. Empty directories are not extracted: directory members are
checked, and directories are made only as parents of files.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Literal

from worker.errors import ArchiveRefused
from worker.safetree.bounds import Bounds, OverBound, Tally
from worker.safetree.names import path_problem
from worker.safetree.walk import OPEN_DIR

CHUNK: Final = 1024 * 1024
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


@dataclass(frozen=True, slots=True)
class Written:
    """A file extracted: its canonical path, the mode it was given, its size and sha256."""

    path: str
    mode: int
    size: int
    sha256: str


def extract_tar(
    src: IO[bytes],
    dest: Path,
    *,
    compressed: bool,
    bounds: Bounds,
    file_mode: Callable[[int], int],
) -> list[Written]:
    """Extract the tar stream *src* (gzip-compressed with ``compressed``) beneath the
    existing directory *dest*; each file gets ``file_mode(member.mode)``.

    Returns the files written (in archive order). Raises ArchiveRefused, with the member
    name and the reason, for: symlinks, hard links, devices, FIFOs and other non-regular
    entries; absolute paths, ``..`` components, empty or non-UTF-8 names; duplicate
    entries; anything that would overwrite an existing path; exceeding *bounds*
    (``max_bytes`` of file data, ``max_entries`` members); a corrupt archive. Entries
    before a refused one may remain in *dest*.
    """
    mode: Literal["r|", "r|gz"] = "r|gz" if compressed else "r|"
    root = os.open(dest, OPEN_DIR)
    try:
        with tarfile.open(fileobj=src, mode=mode) as tar:
            return _Extraction(tar, root, Tally(bounds), file_mode).run()
    except _CORRUPT as exc:
        raise ArchiveRefused(f"corrupt archive: {exc}", reason="corrupt archive") from exc
    finally:
        os.close(root)


def _refuse(member: str, reason: str) -> ArchiveRefused:
    message = f"archive entry {member!r} refused: {reason}"
    return ArchiveRefused(message, member=member, reason=reason)


def member_path(member: tarfile.TarInfo) -> str:
    """The canonical relative path of *member* (``./a//b/`` → ``a/b``; root → ``""``).

    Raises ArchiveRefused for absolute or non-canonical names.
    """
    name = member.name
    if name.startswith("/"):
        raise _refuse(name, "absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    path = "/".join(parts)
    if not path:
        if member.isdir():
            return ""
        raise _refuse(name, "empty name")
    problem = path_problem(path)
    if problem:
        raise _refuse(name, problem)
    return path


@dataclass(slots=True)
class _Extraction:
    tar: tarfile.TarFile
    root: int
    tally: Tally
    file_mode: Callable[[int], int]
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=lambda: {""})
    explicit_dirs: set[str] = field(default_factory=set)
    written: list[Written] = field(default_factory=list)

    def run(self) -> list[Written]:
        for member in self.tar:
            self._count(member)
            path = member_path(member)
            if member.isdir():
                self._claim_dir(member.name, path)
            elif member.isreg():
                self._claim_file(member.name, path)
                self.written.append(self._write(member, path))
            else:
                raise _refuse(member.name, _kind(member))
        return self.written

    def _count(self, member: tarfile.TarInfo) -> None:
        try:
            self.tally.entry()
            self.tally.read(member.size if member.isreg() else 0)
        except OverBound as exc:
            reason = (
                f"expands beyond {exc.limit} bytes"
                if exc.what == "bytes"
                else f"more than {exc.limit} entries"
            )
            raise _refuse(member.name, reason) from None

    def _claim_dir(self, name: str, path: str) -> None:
        if path in self.files or path in self.explicit_dirs:
            raise _refuse(name, "duplicate entry")
        self._claim_parents(name, path)
        if path:
            self.explicit_dirs.add(path)

    def _claim_file(self, name: str, path: str) -> None:
        if path in self.files:
            raise _refuse(name, "duplicate entry")
        if path in self.dirs or path in self.explicit_dirs:
            raise _refuse(name, "duplicate entry: a directory of that name is in this archive")
        self._claim_parents(name, path)
        self.files.add(path)

    def _claim_parents(self, name: str, path: str) -> None:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/".join(parts[:depth])
            if parent in self.files:
                raise _refuse(name, f"parent {parent!r} is a file in this archive")
            self.dirs.add(parent)

    def _write(self, member: tarfile.TarInfo, path: str) -> Written:
        parts = path.split("/")
        parent = _open_dirs(self.root, parts[:-1], member.name)
        try:
            fd = _create(parent, parts[-1], member.name)
        finally:
            os.close(parent)
        mode = self.file_mode(member.mode)
        sha, size = _copy(self.tar, member, fd, mode)
        if size != member.size:
            raise _refuse(member.name, "truncated data")
        return Written(path, mode, size, sha)


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symbolic link"
    if member.islnk():
        return "hard link"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "FIFO"
    return f"unsupported entry type {member.type!r}"


def _open_dirs(root: int, parts: list[str], member: str) -> int:
    """A new fd of ``root/parts...``, creating missing directories, following no link."""
    fd = os.dup(root)
    for part in parts:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        except OSError:
            os.close(fd)
            raise
        try:
            child = os.open(part, OPEN_DIR, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            raise _refuse(member, f"would overwrite existing path {part!r}") from exc
        finally:
            os.close(fd)
        fd = child
    return fd


def _create(parent: int, leaf: str, member: str) -> int:
    try:
        return os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ELOOP, errno.EISDIR):
            raise
        raise _refuse(member, "would overwrite an existing path") from exc


def _copy(tar: tarfile.TarFile, member: tarfile.TarInfo, fd: int, mode: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "wb") as out:
        data = tar.extractfile(member)
        if data is None:  # only for non-regular members, which never get here
            raise _refuse(member.name, "no data")
        while chunk := data.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        os.fchmod(out.fileno(), mode)
    return digest.hexdigest(), size
