"""Verified, refusing extraction of pack archives.

The archive's sha256 and size are checked before a single entry is read, and the bytes
extracted come from the same open file that was hashed. Extraction is
:func:`worker.safetree.extract_tar`'s, member by member, never ``tarfile.extractall``:
only regular files and directories are accepted, every path is created beneath the
destination through directory file descriptors with ``O_NOFOLLOW`` (no symlink is ever
followed), files are created with ``O_EXCL`` (nothing existing is overwritten) and total
size and entry count are bounded. Each file is hashed while it is written, so extraction
returns the closure inventory, with modes normalized as a closure's are. Empty
directories are not part of a closure: directory entries are checked, and directories
are created only as parents of files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Literal, cast

from worker import safetree
from worker.errors import DigestMismatch, InvalidInput
from worker.packs.closure import FileEntry, normalize_mode
from worker.safetree import Bounds

ArchiveFormat = Literal["tar", "tar.gz", "tgz"]
FORMATS: Final[tuple[ArchiveFormat, ...]] = ("tar", "tar.gz", "tgz")
CHUNK: Final = 1024 * 1024


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
            return cast("ArchiveFormat", fmt)
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

    Returns the inventory of the files written (unsorted), each file's mode normalized
    (``0755`` or ``0644``). Raises ArchiveRefused, with the member name and the reason,
    for: symlinks, hard links, devices, FIFOs and other non-regular entries; absolute
    paths, ``..`` components, empty or non-UTF-8 names; duplicate entries; anything that
    would overwrite an existing path; exceeding *limits*; a corrupt archive
    (:func:`worker.safetree.extract_tar`). Entries before a refused one may remain in
    *dest*.
    """
    written = safetree.extract_tar(
        src,
        dest,
        compressed=fmt in ("tar.gz", "tgz"),
        bounds=Bounds(max_bytes=limits.max_bytes, max_entries=limits.max_entries),
        file_mode=_normalized,
    )
    return [FileEntry(w.path, normalize_mode(w.mode), w.size, w.sha256) for w in written]


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
