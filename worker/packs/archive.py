"""Verified, refusing extraction of pack archives.

The archive's sha256 and size are checked before a single entry is read, and the bytes
extracted come from the same open file that was hashed. Extraction is done here, member
by member, never with ``tarfile.extractall``: only regular files and directories are
accepted, every path is created beneath the destination through directory file
descriptors with ``O_NOFOLLOW`` (no symlink is ever followed), files are created with
``O_EXCL`` (nothing existing is overwritten) and total size and entry count are bounded.
Each file is hashed while it is written, so extraction returns the closure inventory.
Empty directories are not part of a closure: directory entries are checked, and
directories are created only as parents of files.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Literal, cast

from worker.errors import ArchiveRefused, DigestMismatch, InvalidInput
from worker.packs.closure import FileEntry, normalize_mode
from worker.packs.names import path_problem

ArchiveFormat = Literal["tar", "tar.gz", "tgz"]
FORMATS: Final[tuple[ArchiveFormat, ...]] = ("tar", "tar.gz", "tgz")
CHUNK: Final = 1024 * 1024
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


@dataclass(frozen=True, slots=True)
class ExtractLimits:
    """Bounds against tar bombs: total bytes of file data and number of entries."""

    max_bytes: int = 4 * 1024**3
    max_entries: int = 100_000


DEFAULT_LIMITS: Final = ExtractLimits()


def detect_format(path: Path) -> ArchiveFormat:
    """The format from the file name (``.tar``, ``.tar.gz``, ``.tgz``), else its magic."""
    name = path.name.lower()
    for suffix, fmt in ((".tar.gz", "tar.gz"), (".tgz", "tgz"), (".tar", "tar")):
        if name.endswith(suffix):
            return cast(ArchiveFormat, fmt)
    with _open_archive(path) as src:
        return "tar.gz" if src.read(2) == b"\x1f\x8b" else "tar"


def sha256_stream(src: IO[bytes]) -> tuple[str, int]:
    """(sha256 hex, size) of everything left in *src*, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def verify_stream(src: IO[bytes], *, sha256: str, size: int, label: str) -> None:
    """Hash *src* and rewind it; raises DigestMismatch when size or sha256 differ."""
    actual, actual_size = sha256_stream(src)
    if actual_size != size:
        raise DigestMismatch(
            f"archive {label} is {actual_size} bytes, pinned {size}",
            path=label,
            expected=size,
            actual=actual_size,
        )
    if actual != sha256:
        raise DigestMismatch(
            f"archive {label} has sha256 {actual}, pinned {sha256}",
            path=label,
            expected=sha256,
            actual=actual,
        )
    src.seek(0)


def extract_verified(
    archive: Path,
    dest: Path,
    *,
    sha256: str,
    size: int,
    fmt: ArchiveFormat,
    limits: ExtractLimits = DEFAULT_LIMITS,
) -> list[FileEntry]:
    """Verify *archive* against its pins, then extract it into *dest*.

    Raises InvalidInput (archive unreadable), DigestMismatch (pins differ: nothing is
    extracted) or ArchiveRefused (a refused entry, a bound exceeded, a corrupt archive).
    """
    with _open_archive(archive) as src:
        verify_stream(src, sha256=sha256, size=size, label=str(archive))
        return extract_tar(src, dest, fmt=fmt, limits=limits)


def extract_tar(
    src: IO[bytes], dest: Path, *, fmt: ArchiveFormat, limits: ExtractLimits = DEFAULT_LIMITS
) -> list[FileEntry]:
    """Extract the tar stream *src* beneath the existing directory *dest*.

    Returns the inventory of the files written (unsorted). Raises ArchiveRefused, with
    the member name and the reason, for: symlinks, hard links, devices, FIFOs and other
    non-regular entries; absolute paths, ``..`` components, empty or non-UTF-8 names;
    duplicate entries; anything that would overwrite an existing path; exceeding
    *limits*; a corrupt archive. Entries before a refused one may remain in *dest*.
    """
    mode: Literal["r|", "r|gz"] = "r|gz" if fmt in ("tar.gz", "tgz") else "r|"
    root = os.open(dest, _DIR_FLAGS)
    try:
        with tarfile.open(fileobj=src, mode=mode) as tar:
            return _Extraction(tar, root, limits).run()
    except _CORRUPT as exc:
        raise ArchiveRefused(f"corrupt archive: {exc}", reason="corrupt archive") from exc
    finally:
        os.close(root)


@contextmanager
def _open_archive(path: Path) -> Iterator[IO[bytes]]:
    try:
        src = path.open("rb")
    except OSError as exc:
        raise InvalidInput(f"cannot open archive {path}: {exc}", path=str(path)) from exc
    with src:
        yield src


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
    limits: ExtractLimits
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=lambda: {""})
    explicit_dirs: set[str] = field(default_factory=set)
    entries: int = 0
    total: int = 0
    inventory: list[FileEntry] = field(default_factory=list)

    def run(self) -> list[FileEntry]:
        for member in self.tar:
            self._count(member)
            path = member_path(member)
            if member.isdir():
                self._claim_dir(member.name, path)
            elif member.isreg():
                self._claim_file(member.name, path)
                self.inventory.append(self._write(member, path))
            else:
                raise _refuse(member.name, _kind(member))
        return self.inventory

    def _count(self, member: tarfile.TarInfo) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise _refuse(member.name, f"more than {self.limits.max_entries} entries")
        self.total += member.size if member.isreg() else 0
        if self.total > self.limits.max_bytes:
            raise _refuse(member.name, f"expands beyond {self.limits.max_bytes} bytes")

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

    def _write(self, member: tarfile.TarInfo, path: str) -> FileEntry:
        parts = path.split("/")
        parent = _open_dirs(self.root, parts[:-1], member.name)
        try:
            fd = _create(parent, parts[-1], member.name)
        finally:
            os.close(parent)
        mode = normalize_mode(member.mode)
        sha, size = _copy(self.tar, member, fd, mode)
        if size != member.size:
            raise _refuse(member.name, "truncated data")
        return FileEntry(path, mode, size, sha)


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
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
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
        return os.open(leaf, _FILE_FLAGS, 0o600, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ELOOP, errno.EISDIR):
            raise
        raise _refuse(member, "would overwrite an existing path") from exc


def _copy(tar: tarfile.TarFile, member: tarfile.TarInfo, fd: int, mode: str) -> tuple[str, int]:
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
        os.fchmod(out.fileno(), int(mode, 8))
    return digest.hexdigest(), size
