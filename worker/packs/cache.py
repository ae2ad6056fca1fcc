"""The content-addressed closure cache: ``<cache_dir>/closures/<closure-hex>/``.

A closure appears at its final path only complete, verified and read-only: it is
extracted into ``<cache_dir>/tmp/<hex>.<random>/``, checked file by file against the
lock, sealed (files 0444/0555, directories 0555) and renamed into place in one
``rename``. Extraction is bounded by what the lock declares: its total is checked against
the operator's cap, the compression-ratio bound and the free space before a byte is
written; each file must be one the lock lists, with its size, before it is written; the
expanded tar stream may exceed the declared bytes only by the tar format's overhead; and
the files extracted must add up to the lock's count and bytes. A crash leaves at most a
stale temporary folder, removed by the next materialization of the same digest. A
per-digest ``flock`` on ``<cache_dir>/locks/<hex>.lock`` makes concurrent materializers
extract once; the others wait, then verify and reuse the result.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.errors import ArchiveRefused, DigestMismatch
from worker.packs.archive import DEFAULT_LIMITS, ArchiveFormat, ExtractLimits, extract_verified
from worker.packs.closure import ClosureLock, FileEntry, closure_digest, sort_entries
from worker.packs.manifest import LocalSource, Pack, PlatformTarget
from worker.packs.sources import fetch, touch
from worker.packs.verify import verify_closure
from worker.safetree import remove_tree

# Sealed closures are world-readable on purpose: sandboxes bind them read-only and may
# run the agent as another uid.
_SEALED_DIR = 0o555
_SEALED_EXEC = 0o555
_SEALED_FILE = 0o444
# What a tar stream may hold beyond its files' bytes: per file a header, padding and
# perhaps a long-name record (about 1 KiB in this repository's packs); plus the end
# marker, record padding and directory entries.
_TAR_OVERHEAD_PER_FILE = 16 * 1024
_TAR_OVERHEAD = 1024 * 1024
# Free space kept beyond the closure (blocks are counted at 4 KiB per file, dirs 4 KiB).
_BLOCK = 4096
_FREE_MARGIN = 64 * 1024 * 1024


def closure_path(cache_dir: Path, digest: str) -> Path:
    """Where the closure with *digest* (``sha256:<hex>``) lives in *cache_dir*."""
    return cache_dir / "closures" / digest.removeprefix("sha256:")


def verified_dir(cache_dir: Path) -> Path:
    """Where the verified records of closures live (``worker.packs.verified``)."""
    return cache_dir / "verified"


def materialize(
    pack: Pack,
    cache_dir: Path,
    *,
    platform: str | None = None,
    verify_existing: bool = True,
    limits: ExtractLimits = DEFAULT_LIMITS,
    lock: ClosureLock | None = None,
) -> Path:
    """The verified closure directory of *pack* for *platform*, extracting it if needed.

    An existing closure is verified (unless *verify_existing* is false, for callers that
    verify it themselves) and reused; a tampered one is refused, not repaired.

    Raises InvalidInput (bad platform, missing or malformed lock, unreadable archive),
    PlatformUnsupported, DigestMismatch (archive, lock or closure differs from the pins,
    a file the lock does not list or of another size) or ArchiveRefused (an entry the
    extractor refuses; an empty closure; a declared closure past *limits* or the free
    space, refused before a byte is written).
    """
    target = pack.for_platform(platform)
    if lock is None:  # a caller that holds the lock already passes it (reading costs)
        lock = pack.read_lock(target)
    final = closure_path(cache_dir, lock.closure_digest)
    if not _published(final):
        with _digest_lock(cache_dir, final.name):
            if not _published(final):
                _build(pack, target, lock, final, limits)
                return final
    if verify_existing:
        verify_closure(final, lock)
    touch(final)  # least-recent-use order for ``worker.packs.gc``
    return final


def _archive(pack: Pack, target: PlatformTarget, cache_dir: Path) -> Path:
    """The archive on this host: in the pack folder, or fetched into the cache."""
    source = target.pin.archive.source
    if isinstance(source, LocalSource):
        return pack.archive_path(target)
    archive = target.pin.archive
    return fetch(source, cache_dir, sha256=archive.sha256, size=archive.size).path


def _published(final: Path) -> bool:
    try:
        mode = final.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise DigestMismatch(
            f"cache entry {final} is not a directory",
            path=str(final),
            expected="directory",
            actual=stat.filemode(mode),
        )
    return True


def hold_closure(cache_dir: Path, closure: Path) -> int | None:
    """Mark *closure* in use: a shared ``flock`` on its digest lock, held until the
    returned descriptor is closed. ``worker.packs.gc`` keeps any closure whose lock it
    cannot take, so a job holds this from ``prepare_pack`` until its teardown.

    Returns ``None`` when the closure is gone (a gc removed it before the hold): prepare
    the pack again. Never call :func:`materialize` for the same digest while holding it
    (its exclusive lock would wait for this one).
    """
    fd = open_lock(lock_path(cache_dir, closure.name))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if _published(closure):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def lock_path(cache_dir: Path, hex_digest: str) -> Path:
    """The per-digest lock file: exclusive while a closure is built or removed, shared
    while a job uses it."""
    return cache_dir / "locks" / f"{hex_digest}.lock"


def open_lock(path: Path) -> int:
    """A descriptor on the lock file ``path`` (created, never through a symlink)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextmanager
def _digest_lock(cache_dir: Path, hex_digest: str) -> Iterator[None]:
    fd = open_lock(lock_path(cache_dir, hex_digest))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _build(
    pack: Pack, target: PlatformTarget, lock: ClosureLock, final: Path, limits: ExtractLimits
) -> None:
    """Extract, check, seal and publish; called with the digest lock held."""
    tmp_root = final.parent.parent / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    _remove_stale(tmp_root, final.name)
    final.parent.mkdir(parents=True, exist_ok=True)
    archive = target.pin.archive
    check_declared(lock, archive.size, archive.format, limits)
    check_room(tmp_root, lock)
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=tmp_root))
    try:
        overhead = _TAR_OVERHEAD + _TAR_OVERHEAD_PER_FILE * len(lock.files)
        entries = extract_verified(
            _archive(pack, target, final.parent.parent), tmp,
            sha256=archive.sha256, size=archive.size, fmt=archive.format, limits=limits,
            max_stream=lock.total_bytes + overhead, admit=_admit(tmp, lock),
        )  # fmt: skip
        check_inventory(tmp, entries, lock)
        _seal(tmp)
        _publish(tmp, final, lock)
    finally:
        if tmp.exists():
            remove_tree(tmp)


def check_declared(
    lock: ClosureLock, archive_size: int, fmt: ArchiveFormat, limits: ExtractLimits
) -> None:
    """Refuse, before anything is written, a lock that declares no file, or more bytes
    or files than *limits* allow for an archive of *archive_size* bytes."""
    declared, files = lock.total_bytes, len(lock.files)
    problem = None
    if not files:
        problem = "empty closure"
    elif files > limits.max_entries:
        problem = f"the lock declares {files} files, more than {limits.max_entries}"
    elif declared > limits.max_bytes:
        problem = f"the lock declares {declared} bytes, more than {limits.max_bytes}"
    elif fmt != "tar" and declared > limits.max_ratio * archive_size:
        problem = (
            f"the lock declares {declared} bytes from an archive of {archive_size}: more "
            f"than {limits.max_ratio} times its size"
        )
    elif fmt == "tar" and declared > archive_size:
        problem = f"the lock declares {declared} bytes from a tar of {archive_size}"
    if problem is not None:
        raise ArchiveRefused(
            f"closure of {lock.pack}/{lock.platform} refused: {problem}",
            pack=lock.pack,
            reason=problem,
            files=files,
            bytes=declared,
        )


def check_room(where: Path, lock: ClosureLock) -> None:
    """Refuse, before anything is written, a closure the filesystem of *where* has no
    room for (its blocks and inodes, with a margin)."""
    fs = os.statvfs(where)
    free = fs.f_bavail * fs.f_frsize
    dirs = {entry.path.rpartition("/")[0] for entry in lock.files}
    needed = sum(-(-entry.size // _BLOCK) * _BLOCK for entry in lock.files)
    needed += _BLOCK * len(dirs) + _FREE_MARGIN
    inodes = len(lock.files) + len(dirs)
    if needed > free or (fs.f_files and inodes > fs.f_favail):
        raise ArchiveRefused(
            f"no room for the closure of {lock.pack}/{lock.platform} in {where}: it needs "
            f"{needed} bytes and {inodes} inodes, {free} bytes and {fs.f_favail} are free",
            path=str(where),
            reason="not enough free space",
            needed=needed,
            free=free,
        )


def _admit(root: Path, lock: ClosureLock) -> Callable[[str, int], None]:
    """Before a file is written: the lock must list it, with that size."""
    listed = {entry.path: entry for entry in lock.files}

    def admit(path: str, size: int) -> None:
        expected = listed.get(path)
        if expected is None or expected.size != size:
            actual = FileEntry(path, expected.mode if expected else "0644", size, "unread")
            _inventory_mismatch(root, path, expected, actual)

    return admit


def check_inventory(root: Path, entries: list[FileEntry], lock: ClosureLock) -> None:
    """Compare what extraction wrote (hashed as written) with the lock: the file count
    and bytes first, then file by file.

    Raises DigestMismatch naming the first missing, extra or differing file.
    """
    count, total = len(entries), sum(entry.size for entry in entries)
    if (count, total) != (len(lock.files), lock.total_bytes):
        missing = sorted({e.path for e in lock.files} - {e.path for e in entries})
        raise DigestMismatch(
            f"archive does not match its lock: {count} files of {total} bytes extracted, "
            f"the lock lists {len(lock.files)} of {lock.total_bytes}",
            path=str(root),
            problem="file count or bytes differ",
            expected={"files": len(lock.files), "bytes": lock.total_bytes},
            actual={"files": count, "bytes": total},
            file=missing[0] if missing else None,
        )
    written = {entry.path: entry for entry in entries}
    for expected in lock.files:
        actual = written.pop(expected.path, None)
        if actual != expected:
            _inventory_mismatch(root, expected.path, expected, actual)
    for path in sorted(written):
        _inventory_mismatch(root, path, None, written[path])
    digest = closure_digest(sort_entries(entries))
    if digest != lock.closure_digest:  # unreachable when the files agree; kept as the pin
        raise DigestMismatch(
            f"closure {root} hashes to {digest}",
            path=str(root),
            expected=lock.closure_digest,
            actual=digest,
        )


def _inventory_mismatch(
    root: Path, path: str, expected: FileEntry | None, actual: FileEntry | None
) -> None:
    if actual is None:
        what = "missing file"
    elif expected is None:
        what = "unexpected file"
    else:
        what = next(
            f"{name} differs"
            for name in ("size", "sha256", "mode")
            if getattr(expected, name) != getattr(actual, name)
        )
    raise DigestMismatch(
        f"archive does not match its lock: {path}: {what}",
        path=str(root / path),
        file=path,
        problem=what,
        expected=_describe(expected),
        actual=_describe(actual),
    )


def _describe(entry: FileEntry | None) -> str:
    return "absent" if entry is None else f"{entry.mode} {entry.size} {entry.sha256}"


def _seal(root: Path) -> None:
    """Files 0444/0555 and directories below *root* 0555 (deepest first).

    The root itself stays writable until it is renamed: moving a directory to another
    parent updates its ``..`` entry, which needs write permission on it. The tree is our
    own fresh extraction, which never contains a symlink, so chmod follows none.
    """
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            executable = os.lstat(path).st_mode & 0o111
            os.chmod(path, _SEALED_EXEC if executable else _SEALED_FILE)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), _SEALED_DIR)


def _publish(tmp: Path, final: Path, lock: ClosureLock) -> None:
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        verify_closure(final, lock)  # another process won the race: keep theirs if sound
        return
    os.chmod(final, _SEALED_DIR)


def _remove_stale(tmp_root: Path, hex_digest: str) -> None:
    """Remove leftovers of crashed extractions of this digest (we hold its lock)."""
    for entry in tmp_root.iterdir():
        if entry.name.startswith(f"{hex_digest}."):
            remove_tree(entry)
