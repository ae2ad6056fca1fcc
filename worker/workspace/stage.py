"""Staging a workspace: a private per-job copy the sandbox may write.

The source (the caller's directory, or the worker's own clone or extraction) is never
mounted into the sandbox: the agent works on a copy owned by the sandbox's host uid, so
it never writes as host root and never touches the source behind the worker's back.
Links are copied as links, never followed; sockets, FIFOs and devices are not copied and
are reported; set-id bits are dropped. The copy is hashed as it is written: that
snapshot is the "before" of change capture.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from worker.errors import WorkspaceUnavailable
from worker.workspace.capture import SKIP_ROOT, Entry, seen_key
from worker.workspace.disk import unmount_below
from worker.workspace.tree import remove_tree

_CHUNK = 1024 * 1024
#: ``Settings.workspace_max_depth``'s default: far deeper than any real project nests.
MAX_DEPTH = 256


@dataclass(frozen=True, slots=True)
class StagedWorkspace:
    """The agent's copy (``path``), where it came from, and what it held at the start."""

    path: Path
    source: Path
    files: int
    bytes: int
    skipped: tuple[str, ...]
    before: dict[str, Entry] = field(repr=False)


def stage_local(
    source: Path, dest: Path, *, owner: tuple[int, int], max_depth: int = MAX_DEPTH
) -> StagedWorkspace:
    """Copy ``source`` into the new directory ``dest``, owned by ``owner`` (uid, gid).

    ``max_depth``: the most directory levels below ``source``; the copy stops at the
    first directory deeper (before making it) and the caller removes ``dest``.

    Raises:
        WorkspaceUnavailable: ``source`` is not a readable directory, nests directories
            deeper than ``max_depth``, or copying failed.
    """
    try:
        if not stat.S_ISDIR(os.stat(source).st_mode):
            raise WorkspaceUnavailable(f"workspace {source} is not a directory", path=str(source))
        dest.mkdir(mode=0o755, parents=False)
        copier = _Copier(owner, source, max_depth)
        copier.tree(source, dest)
    except OSError as exc:
        raise WorkspaceUnavailable(
            f"cannot stage workspace {source}: {exc.strerror}", path=str(source), errno=exc.errno
        ) from exc
    return StagedWorkspace(
        dest, source, copier.files, copier.bytes, tuple(copier.skipped), copier.before
    )


@dataclass(frozen=True, slots=True)
class _Level:
    """A directory being copied: its entries still to copy, and what to record once
    they are (``None`` for the root)."""

    src: Path
    dst: Path
    rel: str
    entries: Iterator[os.DirEntry[str]]
    record: tuple[bool, str, Entry] | None


class _Copier:
    def __init__(self, owner: tuple[int, int], source: Path, max_depth: int) -> None:
        self.uid, self.gid = owner
        self.source, self.max_depth = source, max_depth
        self.files = 0
        self.bytes = 0
        self.skipped: list[str] = []
        self.before: dict[str, Entry] = {}
        # An explicit stack, not recursion: depth is bounded by max_depth, not Python's stack.
        self.levels: list[_Level] = []

    def tree(self, src: Path, dst: Path) -> None:
        self.directory(src, dst, "", None)
        while self.levels:
            level = self.levels[-1]
            entry = next(level.entries, None)
            if entry is not None:
                self.entry(entry, level.dst / entry.name, f"{level.rel}{entry.name}")
                continue
            self.levels.pop()  # a directory's times and mode once its entries are in
            shutil.copystat(level.src, level.dst, follow_symlinks=False)
            if level.record is not None:
                self._record(*level.record)

    def directory(
        self, src: Path, dst: Path, rel: str, record: tuple[bool, str, Entry] | None
    ) -> None:
        os.chown(dst, self.uid, self.gid)
        with os.scandir(src) as entries:
            found = list(entries)
        self.levels.append(_Level(src, dst, rel, iter(found), record))

    def entry(self, entry: os.DirEntry[str], dst: Path, rel: str) -> None:
        info = entry.stat(follow_symlinks=False)
        mode = info.st_mode & 0o777  # set-id and sticky bits are not carried over
        tracked = rel.split("/", 1)[0] not in SKIP_ROOT
        if stat.S_ISDIR(info.st_mode):
            self._check_depth()
            dst.mkdir(mode=0o755)
            self.directory(Path(entry.path), dst, rel + "/", (tracked, rel, Entry("dir", mode, 0)))
        elif stat.S_ISREG(info.st_mode):
            digest = _copy_file(entry.path, dst, mode)
            os.chown(dst, self.uid, self.gid)
            self.files += 1
            self.bytes += info.st_size
            seen = seen_key(os.lstat(dst))  # after the last metadata change we make
            entry_ = Entry("file", mode, info.st_size, sha256=digest, seen=seen)
            self._record(tracked, rel, entry_)
        elif stat.S_ISLNK(info.st_mode):
            target = os.readlink(entry.path)
            os.symlink(target, dst)
            os.chown(dst, self.uid, self.gid, follow_symlinks=False)
            self._record(tracked, rel, Entry("link", 0o777, 0, target=target))
        else:
            self.skipped.append(rel)

    def _check_depth(self) -> None:
        if len(self.levels) > self.max_depth:  # the directory at hand is this deep
            raise WorkspaceUnavailable(
                f"workspace {self.source} nests directories more than {self.max_depth} "
                "levels deep (ACPW_WORKSPACE_MAX_DEPTH); it was not staged",
                path=str(self.source),
                max_depth=self.max_depth,
            )

    def _record(self, tracked: bool, rel: str, entry: Entry) -> None:
        if tracked:
            self.before[rel] = entry


def _copy_file(src: str, dst: Path, mode: int) -> str:
    digest = hashlib.sha256()
    src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(src_fd, "rb", buffering=0) as reader, os.fdopen(dst_fd, "wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
    os.chmod(dst, mode)  # the umask may have narrowed O_CREAT's mode
    return digest.hexdigest()


def remove_staged(path: Path) -> None:
    """Delete a staged copy (whatever the agent left in it); missing is fine.

    A workspace disk mounted inside (``worker.workspace.disk``) is unmounted first, so
    this never empties a mounted filesystem through its mount point and never leaves one
    mounted; an unmount that fails raises before anything is deleted. The removal itself
    (:func:`~worker.workspace.tree.remove_tree`) follows no link, crosses into no other
    filesystem, and copes with any depth.

    Raises:
        OSError: something could not be unmounted or removed.
    """
    if path.exists():
        unmount_below(path)
        remove_tree(path)
