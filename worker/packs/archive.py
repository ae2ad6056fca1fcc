"""Verified, refusing extraction of pack archives.

The archive's sha256 and size are checked before a single entry is read, and the bytes
extracted come from the same open file that was hashed. Extraction is
:func:`worker.safetree.extract_tar`'s, member by member, never ``tarfile.extractall``:
only regular files and directories are accepted, every path is created beneath the
destination through directory file descriptors with ``O_NOFOLLOW`` (no symlink is ever
followed), files are created with ``O_EXCL`` (nothing existing is overwritten) and total
size and entry count are bounded, and so is the expanded stream, by a compression ratio
over the archive's size. Only a proper end of archive ends one: a truncated archive, an
unreadable header or trailing data is refused; setuid, setgid and sticky bits are refused,
not dropped; zip, xz and other formats are refused as ``unsupported_format``. Each file
is hashed while it is written, so extraction returns the closure inventory, with modes
normalized as a closure's are. Empty directories are not part of a closure: directory
entries are checked, and directories are created only as parents of files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Literal, cast

from worker import safetree
from worker.errors import DigestMismatch, InvalidInput, UnsupportedFormat
from worker.packs.closure import FileEntry, normalize_mode
from worker.safetree import Bounds
from worker.safetree.extract import Admit
from worker.safetree.tarstream import foreign_format

ArchiveFormat = Literal["tar", "tar.gz", "tgz"]
FORMATS: Final[tuple[ArchiveFormat, ...]] = ("tar", "tar.gz", "tgz")
CHUNK: Final = 1024 * 1024


_FOREIGN_SUFFIXES: Final = (
    (".zip", "zip"), (".tar.xz", "xz"), (".txz", "xz"), (".xz", "xz"),
    (".tar.bz2", "bzip2"), (".tbz2", "bzip2"), (".bz2", "bzip2"),
    (".tar.zst", "zstd"), (".zst", "zstd"), (".7z", "7z"), (".rar", "rar"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ExtractLimits:
    """Bounds against tar bombs: total bytes of file data, number of entries, and the
    expanded tar stream as a multiple of the archive's size (``max_ratio``)."""

    max_bytes: int = 4 * 1024**3
    max_entries: int = 100_000
    max_ratio: int = 100

    def stream_bound(self, archive_size: int | None) -> int | None:
        """The most bytes the tar stream of an archive of *archive_size* may expand to."""
        if archive_size is None:
            return None
        return self.max_ratio * max(archive_size, 1)


DEFAULT_LIMITS: Final = ExtractLimits()


def detect_format(path: Path) -> ArchiveFormat:
    """The format from the file name (``.tar``, ``.tar.gz``, ``.tgz``), else its magic.

    Raises UnsupportedFormat for a format that is not read (zip, xz, …), by its name or
    its magic, InvalidInput when it cannot be opened.
    """
    name = path.name.lower()
    with _open_archive(path) as src:
        head = src.read(8)
    foreign = foreign_format(head) or next(
        (fmt for suffix, fmt in _FOREIGN_SUFFIXES if name.endswith(suffix)), None
    )
    if foreign is not None:
        raise UnsupportedFormat(
            f"archive {path} is {foreign}, which is not read: only tar and tar.gz",
            path=str(path),
            format=foreign,
            reason=f"unsupported format: {foreign}",
        )
    for suffix, fmt in ((".tar.gz", "tar.gz"), (".tgz", "tgz"), (".tar", "tar")):
        if name.endswith(suffix):
            return cast("ArchiveFormat", fmt)
    return "tar.gz" if head.startswith(b"\x1f\x8b") else "tar"


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
    max_stream: int | None = None,
    admit: Admit | None = None,
) -> list[FileEntry]:
    """Verify *archive* against its pins, then extract it into *dest*.

    *max_stream* tightens the expanded stream's bound (default: ``limits.max_ratio``
    times *size*); *admit* sees each file before it is written (:func:`extract_tar`).

    Raises InvalidInput (archive unreadable), DigestMismatch (pins differ: nothing is
    extracted) or ArchiveRefused (a refused entry, a bound exceeded, a corrupt archive).
    """
    with _open_archive(archive) as src:
        verify_stream(src, sha256=sha256, size=size, label=str(archive))
        bound = limits.stream_bound(size)
        if max_stream is not None and bound is not None:
            bound = min(bound, max_stream)
        return extract_tar(src, dest, fmt=fmt, limits=limits, max_stream=bound, admit=admit)


def extract_tar(
    src: IO[bytes],
    dest: Path | None,
    *,
    fmt: ArchiveFormat,
    limits: ExtractLimits = DEFAULT_LIMITS,
    max_stream: int | None = None,
    admit: Admit | None = None,
) -> list[FileEntry]:
    """Extract the tar stream *src* beneath the existing directory *dest* (``None``: check
    and hash every member, write nothing: an inventory).

    The expanded tar stream is bounded by *max_stream*, by default ``limits.max_ratio``
    times what is left of *src* when it is seekable. *admit* is called with each
    file's path and size before a byte of it is written, and may raise to refuse it.

    Returns the inventory of the files written (unsorted), each file's mode normalized
    (``0755`` or ``0644``). Raises UnsupportedFormat (zip, xz, …) or ArchiveRefused, with
    the member name and the reason, for: symlinks, hard links, devices, FIFOs and other
    non-regular entries; setuid, setgid or sticky bits; absolute paths, ``..``
    components, empty or non-UTF-8 names; duplicate entries; anything that would
    overwrite an existing path; exceeding *limits*; a corrupt or truncated archive, or
    one with trailing data (:func:`worker.safetree.extract_tar`). Entries before a
    refused one may remain in *dest*.
    """
    if max_stream is None:
        max_stream = limits.stream_bound(_remaining(src))
    max_bytes = limits.max_bytes if max_stream is None else min(limits.max_bytes, max_stream)
    written = safetree.extract_tar(
        src,
        dest,
        compressed=fmt in ("tar.gz", "tgz"),
        bounds=Bounds(max_bytes=max_bytes, max_entries=limits.max_entries),
        file_mode=_normalized,
        max_stream=max_stream,
        admit=admit,
    )
    return [FileEntry(w.path, normalize_mode(w.mode), w.size, w.sha256) for w in written]


def _remaining(src: IO[bytes]) -> int | None:
    """How many bytes are left in *src*, when it can seek."""
    if not src.seekable():
        return None
    start = src.tell()
    end = src.seek(0, os.SEEK_END)
    src.seek(start)
    return end - start


def _normalized(st_mode: int) -> int:
    return int(normalize_mode(st_mode), 8)


@contextmanager
def _open_archive(path: Path) -> Iterator[IO[bytes]]:
    try:
        src = path.open("rb")
    except OSError as exc:
        raise InvalidInput(f"cannot open archive {path}: {exc}", path=str(path)) from exc
    with src:
        yield src
