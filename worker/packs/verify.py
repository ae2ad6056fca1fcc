"""Checking a closure directory against its lock, before every launch.

The tree is scanned first (cheap: one ``lstat`` per entry) so structural differences
fail fast; then every file is re-hashed on a thread pool, largest files first. hashlib
releases the GIL while hashing large buffers, so the threads really run in parallel.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from worker.errors import DigestMismatch
from worker.packs.closure import ClosureLock, FileEntry, normalize_mode

CHUNK: Final = 1024 * 1024
# O_NONBLOCK: a FIFO swapped in after the scan must not hang the open.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_buffers = threading.local()


@dataclass(frozen=True, slots=True)
class VerifyStats:
    """What a successful verification covered."""

    files: int
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Found:
    size: int
    st_mode: int


def verify_closure(
    path: Path, lock: ClosureLock, *, read_only: bool = True, workers: int | None = None
) -> VerifyStats:
    """Check that the tree at *path* is exactly the closure *lock* describes.

    Every listed file must exist as a regular file with the locked size, normalized mode
    and sha256; nothing else may exist: no extra file, no symlink or special file, and
    directories only as parents of listed files. With *read_only* (closures in the cache)
    no file or directory below the root may be writable. *workers* threads hash (default
    ``os.cpu_count()``). Raises DigestMismatch naming the path and what differs.
    """
    started = time.perf_counter()
    found = _scan(path, read_only=read_only)
    _compare_tree(path, lock, found)
    _compare_hashes(path, lock.files, workers or os.cpu_count() or 1)
    elapsed = time.perf_counter() - started
    return VerifyStats(len(lock.files), lock.total_bytes, elapsed)


def _mismatch(root: Path, rel: str, what: str, expected: object, actual: object) -> DigestMismatch:
    return DigestMismatch(
        f"closure {root}: {rel or '.'}: {what}",
        path=str(root / rel) if rel else str(root),
        closure=str(root),
        file=rel,
        problem=what,
        expected=expected,
        actual=actual,
    )


def _scan(root: Path, *, read_only: bool) -> dict[str, _Found | None]:
    """Every entry below *root*: files map to their lstat facts, directories to None."""
    if not root.is_dir() or root.is_symlink():
        raise _mismatch(root, "", "closure directory is missing", "directory", "absent")
    found: dict[str, _Found | None] = {}
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as it:
            for entry in it:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                info = entry.stat(follow_symlinks=False)
                _check_kind(root, rel, info.st_mode, read_only=read_only)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(rel)
                    found[rel] = None
                else:
                    found[rel] = _Found(info.st_size, info.st_mode)
    return found


def _check_kind(root: Path, rel: str, st_mode: int, *, read_only: bool) -> None:
    if not (stat.S_ISDIR(st_mode) or stat.S_ISREG(st_mode)):
        kind = "symbolic link" if stat.S_ISLNK(st_mode) else "special file"
        raise _mismatch(root, rel, f"unexpected {kind}", "regular file or directory", kind)
    if read_only and st_mode & 0o222:
        actual = oct(stat.S_IMODE(st_mode))
        raise _mismatch(root, rel, "writable in a read-only closure", "read-only", actual)


def _parents(lock: ClosureLock) -> set[str]:
    parents: set[str] = set()
    for entry in lock.files:
        parts = entry.path.split("/")[:-1]
        parents.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return parents


def _compare_tree(root: Path, lock: ClosureLock, found: dict[str, _Found | None]) -> None:
    parents = _parents(lock)
    for entry in lock.files:
        facts = found.pop(entry.path, None)
        if facts is None:
            raise _mismatch(root, entry.path, "missing file", entry.sha256, "absent")
        _compare_facts(root, entry, facts)
    for rel, facts in sorted(found.items()):
        if facts is not None:
            raise _mismatch(root, rel, "unexpected file", "absent", facts.size)
        if rel not in parents:
            raise _mismatch(root, rel, "unexpected directory", "absent", "directory")


def _compare_facts(root: Path, entry: FileEntry, facts: _Found) -> None:
    if facts.size != entry.size:
        raise _mismatch(root, entry.path, "size differs", entry.size, facts.size)
    mode = normalize_mode(facts.st_mode)
    if mode != entry.mode:
        raise _mismatch(root, entry.path, "mode differs", entry.mode, mode)


def _compare_hashes(root: Path, files: tuple[FileEntry, ...], workers: int) -> None:
    by_size = sorted(files, key=lambda entry: entry.size, reverse=True)
    if workers <= 1 or len(by_size) <= 1:
        digests = [hash_file(root / entry.path) for entry in by_size]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(by_size))) as pool:
            digests = list(pool.map(lambda e: hash_file(root / e.path), by_size))
    for entry, actual in zip(by_size, digests, strict=True):
        if actual != entry.sha256:
            raise _mismatch(root, entry.path, "sha256 differs", entry.sha256, actual)


def hash_file(path: Path) -> str:
    """sha256 hex of the regular file *path* (not following a final symlink).

    Reads in 1 MiB chunks into a per-thread buffer (a small file in one read). A path
    that is unreadable or no longer a regular file hashes to a marker that never equals
    a real digest, so the caller reports it as a mismatch.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
        with os.fdopen(fd, "rb", buffering=0) as src:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "not a regular file"
            digest = hashlib.sha256()
            view = _buffer()
            while count := src.readinto(view):
                digest.update(view[:count])
            return digest.hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _buffer() -> memoryview:
    view: memoryview | None = getattr(_buffers, "view", None)
    if view is None:
        view = memoryview(bytearray(CHUNK))
        _buffers.view = view
    return view
