"""Extracting a tar stream someone else made, member by member, refusing what is unsafe.

Never ``tarfile.extractall``: only regular files and directories are accepted (links,
devices, FIFOs are refused, not skipped: an archive that holds them is not the one that
was meant); every member's name must be a canonical relative path
(:func:`~.names.path_problem`: no ``..``, not absolute); every path is created beneath
the destination through directory descriptors with ``O_NOFOLLOW`` (no link is ever
followed, even one already in the destination); files are created with ``O_EXCL``
(nothing existing is overwritten); setuid, setgid and sticky bits are refused, not
dropped; total size and entry count are bounded, and so is the expanded stream. Each file
is hashed while it is written. Empty directories are not extracted: directory members are
checked, and directories are made only as parents of files. Only a proper end of archive
ends one (:mod:`~.tarstream`): a truncated archive, an unreadable header or trailing data
is refused, never read as the shorter archive it looks like; a format we do not read is
refused as ``unsupported_format``. With no destination, members are checked and hashed
but nothing is written (an inventory).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from worker.errors import ArchiveRefused, UnsupportedFormat
from worker.safetree.bounds import Bounds, OverBound, Tally
from worker.safetree.names import path_problem
from worker.safetree.tarstream import Expanded, check_end, corrupt, foreign_format, open_reader
from worker.safetree.walk import OPEN_DIR

CHUNK: Final = 1024 * 1024
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (tarfile.TarError, EOFError, zlib.error)
_SPECIAL_BITS: Final = ((0o4000, "setuid"), (0o2000, "setgid"), (0o1000, "sticky"))
#: Called with each regular file's path and declared size before a byte of it is written;
#: raises to refuse it (e.g. a file its lock does not list, or of another size).
Admit = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class Written:
    """A file extracted: its canonical path, the mode it was given, its size and sha256."""

    path: str
    mode: int
    size: int
    sha256: str


def extract_tar(
    src: IO[bytes],
    dest: Path | None,
    *,
    compressed: bool,
    bounds: Bounds,
    file_mode: Callable[[int], int],
    max_stream: int | None = None,
    admit: Admit | None = None,
    symlinks: bool = False,
) -> list[Written]:
    """Extract the tar stream *src* (gzip-compressed with ``compressed``) beneath the
    existing directory *dest* (``None``: check and hash only, write nothing); each file
    gets ``file_mode(member.mode)``; *admit* may refuse a file before it is written.

    Returns the files written (in archive order). Raises UnsupportedFormat (zip, xz, …)
    or ArchiveRefused, with the member name and the reason, for: symlinks, hard links,
    devices, FIFOs and other non-regular entries; setuid, setgid or sticky bits; absolute
    paths, ``..`` components, empty or non-UTF-8 names; duplicate entries; anything that
    would overwrite an existing path; exceeding *bounds* (``max_bytes`` of file data,
    ``max_entries`` members) or *max_stream* bytes of expanded tar stream; a corrupt,
    truncated or trailing-garbage archive. Entries before a refused one may remain in
    *dest*.

    With ``symlinks`` a symbolic link entry is made as a link (its target kept as text,
    never followed; not in the returned list): nothing is written through it, as every
    directory is opened without following links and no later entry may lie below it.
    A workspace that comes back from a sandbox holds the links its agent made, as a
    host-side workspace would.
    """
    _sniff(src, compressed=compressed)
    stream = Expanded(src, compressed=compressed, max_bytes=max_stream)
    root = os.open(dest, OPEN_DIR) if dest is not None else None
    try:
        with open_reader(stream) as tar:
            written = _Extraction(tar, root, Tally(bounds), file_mode, admit, symlinks).run()
            check_end(tar, stream)
            return written
    except OverBound as exc:  # the expanded stream (a compression-ratio bound)
        reason = f"the tar stream expands beyond {exc.limit} bytes"
        raise ArchiveRefused(f"archive refused: {reason}", reason=reason) from None
    except _CORRUPT as exc:
        raise corrupt(str(exc) or type(exc).__name__) from exc
    finally:
        if root is not None:
            os.close(root)


def _sniff(src: IO[bytes], *, compressed: bool) -> None:
    """Refuse a format we do not read by its magic, and gzip declared as a plain tar."""
    if not src.seekable():
        return
    start = src.tell()
    head = src.read(8)
    src.seek(start)
    foreign = foreign_format(head)
    if foreign is not None:
        raise UnsupportedFormat(
            f"archive is {foreign}, which is not read: only tar and tar.gz",
            format=foreign,
            reason=f"unsupported format: {foreign}",
        )
    if not compressed and head.startswith(b"\x1f\x8b"):
        raise corrupt("gzip data where a plain tar was declared")


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
    root: int | None
    tally: Tally
    file_mode: Callable[[int], int]
    admit: Admit | None
    symlinks: bool = False
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=lambda: {""})
    explicit_dirs: set[str] = field(default_factory=set)
    written: list[Written] = field(default_factory=list)

    def run(self) -> list[Written]:
        for member in self.tar:
            self._count(member)
            path = member_path(member)
            _check_bits(member)
            if member.isdir():
                self._claim_dir(member.name, path)
            elif member.isreg():
                self._claim_file(member.name, path)
                if self.admit is not None:
                    self.admit(path, member.size)
                self.written.append(self._write(member, path))
            elif member.issym() and self.symlinks:
                self._claim_file(member.name, path)  # nothing may lie below it
                self._link(member, path)
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

    def _link(self, member: tarfile.TarInfo, path: str) -> None:
        target = member.linkname
        if not target or "\x00" in target or len(target.encode()) >= 4096:
            raise _refuse(member.name, "symbolic link with an invalid target")
        if self.root is None:
            return
        parts = path.split("/")
        parent = _open_dirs(self.root, parts[:-1], member.name)
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
        except FileExistsError:
            raise _refuse(member.name, f"would overwrite existing path {parts[-1]!r}") from None
        finally:
            os.close(parent)

    def _write(self, member: tarfile.TarInfo, path: str) -> Written:
        mode = self.file_mode(member.mode)
        if self.root is None:
            sha, size = _copy(self.tar, member, None, mode)
        else:
            parts = path.split("/")
            parent = _open_dirs(self.root, parts[:-1], member.name)
            try:
                fd = _create(parent, parts[-1], member.name)
            finally:
                os.close(parent)
            sha, size = _copy(self.tar, member, fd, mode)
        if size != member.size:
            raise _refuse(member.name, "truncated data")
        return Written(path, mode, size, sha)


def _check_bits(member: tarfile.TarInfo) -> None:
    bits = [name for bit, name in _SPECIAL_BITS if member.mode & bit]
    if bits:
        raise _refuse(member.name, f"{' and '.join(bits)} bit set")


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


def _copy(
    tar: tarfile.TarFile, member: tarfile.TarInfo, fd: int | None, mode: int
) -> tuple[str, int]:
    """Hash *member*'s data, writing it to *fd* (when given, then closed, with *mode*)."""
    digest = hashlib.sha256()
    size = 0
    data = tar.extractfile(member)
    if data is None:  # only for non-regular members, which never get here
        if fd is not None:
            os.close(fd)
        raise _refuse(member.name, "no data")
    if fd is None:
        while chunk := data.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size
    with os.fdopen(fd, "wb") as out:
        while chunk := data.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        os.fchmod(out.fileno(), mode)
    return digest.hexdigest(), size
