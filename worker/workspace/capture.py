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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["file", "dir", "link", "other"]
Status = Literal["added", "modified", "deleted", "mode_changed", "type_changed"]
SKIP_ROOT = frozenset({".git"})
_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of a snapshot (``sha256`` for files, ``target`` for links)."""

    kind: Kind
    mode: int
    size: int
    sha256: str | None = None
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    status: Status
    before: Entry | None
    after: Entry | None


Snapshot = Mapping[str, Entry]


def snapshot(root: Path) -> dict[str, Entry]:
    """Every path below ``root`` (relative, POSIX) with what it is; links not followed."""
    return dict(_walk(root, ""))


def _walk(directory: Path, prefix: str) -> Iterator[tuple[str, Entry]]:
    with os.scandir(directory) as entries:
        found = sorted(entries, key=lambda e: e.name)
    for item in found:
        if not prefix and item.name in SKIP_ROOT:
            continue
        rel = prefix + item.name
        entry = _entry(item)
        yield rel, entry
        if entry.kind == "dir":
            yield from _walk(Path(item.path), rel + "/")


def _entry(item: os.DirEntry[str]) -> Entry:
    info = item.stat(follow_symlinks=False)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISREG(info.st_mode):
        return Entry("file", mode, info.st_size, sha256=file_sha256(item.path))
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
