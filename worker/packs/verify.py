"""Checking a closure directory against its lock, before every launch.

The tree is scanned first (cheap: one ``lstat`` per entry) so structural differences
fail fast; then every file is re-hashed on a thread pool, largest files first. hashlib
releases the GIL while hashing large buffers, so the threads really run in parallel.

With a :class:`~worker.packs.verified.Recheck` (every launch), the re-hash is skipped
when the scan finds every entry exactly as it was when the closure was last verified in
full (its verified record, :mod:`worker.packs.verified`, says why that is safe and when
it is not used).
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
from worker.packs import verified
from worker.packs.closure import ClosureLock, FileEntry, normalize_mode
from worker.packs.verified import Identities, Recheck
from worker.packs.watch import WATCHES, Watch

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
    #: Bytes re-hashed: ``bytes`` after a full verification, 0 when the verified record
    #: showed the closure unchanged.
    hashed_bytes: int = 0


def verify_closure(
    path: Path,
    lock: ClosureLock,
    *,
    read_only: bool = True,
    workers: int | None = None,
    recheck: Recheck | None = None,
) -> VerifyStats:
    """Check that the tree at *path* is exactly the closure *lock* describes.

    Every listed file must exist as a regular file with the locked size, normalized mode
    and sha256; nothing else may exist: no extra file, no symlink or special file, and
    directories only as parents of listed files. With *read_only* (closures in the cache)
    no file or directory below the root may be writable. *workers* threads hash (default
    ``os.cpu_count()``). With *recheck*, the hashes are not computed again when the
    closure's verified record matches the scan, and the record is written after a full
    verification. Raises DigestMismatch naming the path and what differs.
    """
    started = time.perf_counter()
    scanned_ns = time.time_ns()
    recheck = recheck if read_only else None  # records are of sealed closures only
    try:
        identities = _scan(path)
        if recheck is not None and verified.matches(recheck, lock.closure_digest, path, identities):
            # Every entry is the one a full verification checked (kinds, modes, the tree
            # against the lock, the hashes): nothing to check again.
            elapsed = time.perf_counter() - started
            return VerifyStats(len(lock.files), lock.total_bytes, elapsed, hashed_bytes=0)
        _compare_tree(path, lock, _found(path, identities, read_only=read_only))
        _compare_hashes(path, lock.files, workers or os.cpu_count() or 1)
    except DigestMismatch:
        if recheck is not None:
            verified.forget(recheck, lock.closure_digest)
        raise
    if recheck is not None:
        verified.write(recheck, lock.closure_digest, path, identities, scanned_ns)
    elapsed = time.perf_counter() - started
    return VerifyStats(len(lock.files), lock.total_bytes, elapsed, lock.total_bytes)


def unchanged(
    path: Path, closure_digest: str, files: int, size: int, recheck: Recheck
) -> VerifyStats | None:
    """The stats of a closure its verified record shows unchanged, else None.

    The check ``verify_closure`` makes first, without the lock: the record names the
    closure digest it was verified against, and that digest pins every file, so a launch
    whose pin has that digest needs neither the lock's entries (parsing a large lock
    costs more than the scan) nor the hashes. ``files`` and ``size`` are the pin's
    (reported, not checked: the record's verification checked them). None when the
    closure is absent or differs in any way from the record: verify in full.
    """
    started = time.perf_counter()
    if not recheck.usable():
        return None
    watch = WATCHES.take(path)
    if watch is not None:  # scanned by this process before: skip the scan if nothing moved
        if watch.quiet(path) and verified.current(
            recheck, closure_digest, path, watch.entries, watch.identity
        ):
            WATCHES.keep(path, watch)
            return VerifyStats(files, size, time.perf_counter() - started, hashed_bytes=0)
        watch.close()
    watch = WATCHES.start(path)
    try:
        identities = _scan(path, watch)
        if watch is not None and watch.broken:
            WATCHES.give_up(path)
        if not verified.matches(recheck, closure_digest, path, identities):
            return None
        if watch is not None and not watch.broken:
            watch.entries, watch.identity = identities.count, identities.digest()
            WATCHES.keep(path, watch)
            watch = None
    except DigestMismatch:
        return None
    finally:
        if watch is not None:
            watch.close()
    return VerifyStats(files, size, time.perf_counter() - started, hashed_bytes=0)


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


def _scan(root: Path, watch: Watch | None = None) -> Identities:
    """The identity of every entry below *root* (:mod:`worker.packs.verified`): one
    ``lstat`` each, nothing followed. Written for the fast path of every launch (about
    9,000 entries for the larger packs): string paths and a flat array of numbers, no
    object per entry. With *watch* (which watches *root* already), each directory below
    is watched before it is listed (:mod:`worker.packs.watch`)."""
    try:
        top = root.lstat()
    except OSError:
        top = None
    if top is None or not stat.S_ISDIR(top.st_mode):
        raise _mismatch(root, "", "closure directory is missing", "directory", "absent")
    identities = Identities(top)
    names, numbers = identities.names.append, identities.numbers.extend
    pending = [""]
    base = os.fspath(root)
    while pending:
        rel_dir = pending.pop()
        prefix = f"{rel_dir}/" if rel_dir else ""
        where = os.path.join(base, rel_dir) if rel_dir else base
        if watch is not None and rel_dir:
            watch.add(where)
        with os.scandir(where) as it:
            for entry in it:
                rel = prefix + entry.name
                info = entry.stat(follow_symlinks=False)
                names(rel)
                numbers(
                    (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns,
                     info.st_ctime_ns, info.st_mode)
                )  # fmt: skip
                if stat.S_ISDIR(info.st_mode):
                    pending.append(rel)
    return identities


def _found(
    root: Path, identities: Identities, *, read_only: bool
) -> dict[str, tuple[int, int] | None]:
    """Files map to their (size, st_mode), directories to None; a link, a special file
    or (with *read_only*) a writable entry is refused."""
    found: dict[str, tuple[int, int] | None] = {}
    writable = 0o222 if read_only else 0
    numbers = identities.numbers
    for index, rel in enumerate(identities.names):
        size, mode = numbers[6 * index + 2], numbers[6 * index + 5]
        if mode & writable or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            _refuse_kind(root, rel, mode)
        found[rel] = None if stat.S_ISDIR(mode) else (size, mode)
    return found


def _refuse_kind(root: Path, rel: str, st_mode: int) -> None:
    if not (stat.S_ISDIR(st_mode) or stat.S_ISREG(st_mode)):
        kind = "symbolic link" if stat.S_ISLNK(st_mode) else "special file"
        raise _mismatch(root, rel, f"unexpected {kind}", "regular file or directory", kind)
    actual = oct(stat.S_IMODE(st_mode))
    raise _mismatch(root, rel, "writable in a read-only closure", "read-only", actual)


def _parents(lock: ClosureLock) -> set[str]:
    parents: set[str] = set()
    for entry in lock.files:
        parent = entry.path.rpartition("/")[0]
        while parent and parent not in parents:  # its own parents are in already
            parents.add(parent)
            parent = parent.rpartition("/")[0]
    return parents


def _compare_tree(root: Path, lock: ClosureLock, found: dict[str, tuple[int, int] | None]) -> None:
    parents = _parents(lock)
    for entry in lock.files:
        facts = found.pop(entry.path, None)
        if facts is None:
            raise _mismatch(root, entry.path, "missing file", entry.sha256, "absent")
        _compare_facts(root, entry, *facts)
    for rel, facts in sorted(found.items()):
        if facts is not None:
            raise _mismatch(root, rel, "unexpected file", "absent", facts[0])
        if rel not in parents:
            raise _mismatch(root, rel, "unexpected directory", "absent", "directory")


def _compare_facts(root: Path, entry: FileEntry, size: int, st_mode: int) -> None:
    if size != entry.size:
        raise _mismatch(root, entry.path, "size differs", entry.size, size)
    mode = normalize_mode(st_mode)
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
