"""The verified record of a closure: what lets an unchanged closure skip its re-hash.

After a full verification (every file re-hashed against the lock) the worker writes, in
``<cache_dir>/verified/<closure-hex>.json``, a digest of the identity of every entry of
the closure as the scan before the hashes saw it: path, device, inode, size, mtime,
ctime and mode of each file and directory, and of the closure directory itself. Before
each launch the closure is scanned again (one ``lstat`` per entry, which the full
verification does as well) and the digest of those identities compared with the record:
equal, the files are the ones that were hashed, and no file is read; different, or the
record missing, unreadable, untrusted or older than ``pack_rehash_s``, the closure is
re-hashed in full (and the record written again when it passes).

Why the identities are enough (the threat model, docs/security.md "Pack closures"): any
change to a file's content, through any path (write, truncate, a rename over it, a new
inode) changes its ctime or its inode, and the kernel sets ctime to the current time on
every such change; no system call sets it to a chosen value, so a process that can write
the file cannot make it look unchanged again (``utimensat`` restores mtime, and moves
ctime). What it does not catch: root on the host (who can set the clock back or write
the block device) and a change within the timestamp granularity of the scan itself; the
latter is why a record is not written while any entry changed less than
:data:`RACY_NS` before the scan (the closure is re-hashed next time instead).

The record is trusted only if the worker wrote it: a regular file with one link, owned
by the worker's effective uid and writable by no one else, in a directory with the same
properties, and only when no sandbox runs as the worker's uid (a non-root worker's
sandboxes do: then every launch re-hashes). It is written atomically (a private
temporary file renamed over it), so a reader sees the old record or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import time
from array import array
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: Entries whose ctime or mtime is this close to the scan (or later) make the scan
#: "racy": a change within the same timestamp tick would keep them. Coarse kernel
#: timestamps tick in milliseconds; 2 s also covers filesystems with 1 s or 2 s stamps.
RACY_NS: Final = 2_000_000_000
_VERSION: Final = 1
_MAX_RECORD: Final = 64 * 1024
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Recheck:
    """How a launch may check a closure against its verified record.

    ``records``: the directory of records (``<cache_dir>/verified``); ``max_age_s``: a
    record older than this is not used (``pack_rehash_s``; 0: always re-hash);
    ``sandbox_uids``: the host uids sandboxes run as (a record is never trusted when the
    worker's own uid is one of them).
    """

    records: Path
    max_age_s: float
    sandbox_uids: Collection[int]

    def usable(self) -> bool:
        return self.max_age_s > 0 and os.geteuid() not in self.sandbox_uids


class Identities:
    """The identity of every scanned entry below a closure, and of the closure directory
    itself. The scan appends each entry's path to ``names`` and its device, inode, size,
    mtime_ns, ctime_ns and st_mode to ``numbers`` (six integers an entry)."""

    __slots__ = ("names", "numbers", "root")

    def __init__(self, root: os.stat_result) -> None:
        # The closure directory by device, inode and mode only: its times move on every
        # use (``worker.packs.sources.touch``, the cache's least-recent-use order), and
        # what they would tell (an entry added or removed) the listing tells.
        self.root = array("q", (root.st_dev, root.st_ino, root.st_mode))
        self.names: list[str] = []
        self.numbers = array("q")

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def newest_ns(self) -> int:
        """The latest ctime or mtime of any entry."""
        return max(max(self.numbers[3::6], default=0), max(self.numbers[4::6], default=0))

    def digest(self) -> str:
        """sha256 over the entries in scan order (directory order, which only a change
        to a directory moves; a different order only costs a re-hash)."""
        digest = hashlib.sha256(self.root.tobytes())
        digest.update(self.numbers.tobytes())
        digest.update("\0".join(self.names).encode("utf-8", "surrogateescape"))
        return digest.hexdigest()


def matches(recheck: Recheck, closure_digest: str, root: Path, identities: Identities) -> bool:
    """Whether a trusted, current record says these identities were verified."""
    return current(recheck, closure_digest, root, identities.count, identities.digest())


def current(recheck: Recheck, closure_digest: str, root: Path, entries: int, identity: str) -> bool:
    """Whether a trusted, current record says the scan of ``entries`` entries whose
    identity digest is ``identity`` was verified."""
    if not recheck.usable():
        return False
    record = _read(recheck, closure_digest)
    if record is None:
        return False
    age = time.time() - record.verified_at
    return (
        0 <= age <= recheck.max_age_s
        and record.closure == closure_digest
        and record.root == str(root)
        and record.entries == entries
        and record.identity == identity
    )


def write(
    recheck: Recheck, closure_digest: str, root: Path, identities: Identities, scanned_ns: int
) -> bool:
    """Record a full verification of the entries scanned at ``scanned_ns`` (wall clock).

    Nothing is written (False) when the scan was racy, records cannot be trusted here,
    or the directory is not the worker's own: the next launch re-hashes, which is safe.
    """
    if not recheck.usable() or identities.newest_ns >= scanned_ns - RACY_NS:
        forget(recheck, closure_digest)
        return False
    record = {
        "v": _VERSION,
        "closure": closure_digest,
        "root": str(root),
        "verified_at": scanned_ns / 1e9,
        "entries": identities.count,
        "identity": identities.digest(),
    }
    try:
        recheck.records.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _own_directory(recheck.records):
            return False
        fd, tmp = tempfile.mkstemp(dir=recheck.records, prefix=".record.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(record, out)
            os.replace(tmp, _path(recheck, closure_digest))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


def forget(recheck: Recheck, closure_digest: str) -> None:
    """Remove the closure's record (it failed, or changed): best effort."""
    with contextlib.suppress(OSError):
        _path(recheck, closure_digest).unlink()


def _path(recheck: Recheck, closure_digest: str) -> Path:
    return recheck.records / f"{closure_digest.removeprefix('sha256:')}.json"


def _own_directory(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and _owned(info)


def _owned(info: os.stat_result) -> bool:
    """Owned by the worker's effective uid and writable by no group or other."""
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


@dataclass(frozen=True, slots=True)
class _Record:
    closure: str
    root: str
    verified_at: float
    entries: int
    identity: str


def _read(recheck: Recheck, closure_digest: str) -> _Record | None:
    """The record, if it is one the worker wrote and well formed; else None."""
    raw = _own_bytes(recheck, closure_digest)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not _well_formed(record):
        return None
    return _Record(
        record["closure"],
        record["root"],
        record["verified_at"],
        record["entries"],
        record["identity"],
    )


def _own_bytes(recheck: Recheck, closure_digest: str) -> bytes | None:
    """The record's bytes, if the worker's own file in the worker's own directory."""
    if not _own_directory(recheck.records):
        return None
    try:
        fd = os.open(_path(recheck, closure_digest), _READ_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        trusted = stat.S_ISREG(info.st_mode) and _owned(info) and info.st_nlink == 1
        if not trusted or info.st_size > _MAX_RECORD:
            return None
        return os.read(fd, _MAX_RECORD + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _well_formed(record: object) -> bool:
    if not isinstance(record, dict) or record.get("v") != _VERSION:
        return False
    types = {
        "closure": str,
        "root": str,
        "verified_at": float,
        "entries": int,
        "identity": str,
    }
    return all(type(record.get(key)) is kind for key, kind in types.items())
