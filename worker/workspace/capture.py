"""Change capture: exactly what the agent changed in its workspace, as data and a patch.

The worker compares two snapshots it took itself — the pristine source and the
workspace after the turn — walking without following links and hashing every regular
file. Nothing the agent controls is executed or trusted: no ``git`` runs over the
agent's ``.git`` (its config and hooks could run code on the host), symlinks are
reported with their target and never followed, and sizes and digests are measured, not
taken from the agent.

The root ``.git`` directory is left out of the comparison, as ``git status`` leaves it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Kind = Literal["file", "dir", "link", "other"]
Status = Literal["added", "modified", "deleted", "mode_changed", "type_changed"]
SKIP_ROOT = frozenset({".git"})
_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of a snapshot (``sha256`` for files, ``target`` for links).

    ``seen`` is (inode, ctime_ns, size) when the worker measured the file: a later file
    with the same triple has the same content, because no process can set a file's
    ctime (only the kernel does, on every change), so capture need not read it again.
    """

    kind: Kind
    mode: int
    size: int
    sha256: str | None = None
    target: str | None = None
    seen: tuple[int, int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    status: Status
    before: Entry | None
    after: Entry | None


Snapshot = Mapping[str, Entry]


def snapshot(root: Path, known: Snapshot | None = None) -> dict[str, Entry]:
    """Every path below ``root`` (relative, POSIX) with what it is; links not followed.

    A file whose (inode, ctime, size) matches its entry in ``known`` keeps that entry's
    digest without being read again.
    """
    return dict(_walk(root, known or {}))


def _walk(root: Path, known: Snapshot) -> Iterator[tuple[str, Entry]]:
    """Depth first, names sorted, each directory before what it holds. An explicit
    stack, not recursion: the agent may nest directories deeper than Python's stack.

    By path, unlike :class:`worker.safetree.Walk`: the patch and the result bundle open
    the files it lists by path, so a tree past ``PATH_MAX`` must fail here (a
    ``capture_failed`` notice), not half-way through them."""
    stack = [("", _listing(root, skip=SKIP_ROOT))]
    while stack:
        prefix, items = stack[-1]
        item = next(items, None)
        if item is None:
            stack.pop()
            continue
        rel = prefix + item.name
        entry = _entry(item, known.get(rel))
        yield rel, entry
        if entry.kind == "dir":
            stack.append((rel + "/", _listing(Path(item.path), skip=frozenset())))


def _listing(directory: Path, *, skip: frozenset[str]) -> Iterator[os.DirEntry[str]]:
    with os.scandir(directory) as entries:
        found = sorted((e for e in entries if e.name not in skip), key=lambda e: e.name)
    return iter(found)


def seen_key(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_ctime_ns, info.st_size)


def _entry(item: os.DirEntry[str], previous: Entry | None) -> Entry:
    info = item.stat(follow_symlinks=False)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISREG(info.st_mode):
        key = seen_key(info)
        if previous is not None and previous.seen == key and previous.kind == "file":
            return Entry("file", mode, info.st_size, sha256=previous.sha256, seen=key)
        return Entry("file", mode, info.st_size, sha256=file_sha256(item.path), seen=key)
    if stat.S_ISDIR(info.st_mode):
        return Entry("dir", mode, 0)
    if stat.S_ISLNK(info.st_mode):
        return Entry("link", mode, 0, target=os.readlink(item.path))
    return Entry("other", mode, 0)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def compare(before: Snapshot, after: Snapshot) -> list[Change]:
    """What changed from ``before`` to ``after``, sorted by path (directories are
    reported only when added, deleted or re-moded)."""
    changes = []
    for path in sorted(before.keys() | after.keys()):
        status = _status(before.get(path), after.get(path))
        if status is not None:
            changes.append(Change(path, status, before.get(path), after.get(path)))
    return changes


def _status(old: Entry | None, new: Entry | None) -> Status | None:
    if old is None:
        return "added"
    if new is None:
        return "deleted"
    if old.kind != new.kind:
        return "type_changed"
    if (old.sha256, old.target) != (new.sha256, new.target):
        return "modified"
    if old.mode != new.mode and old.kind != "link":
        return "mode_changed"
    return None
