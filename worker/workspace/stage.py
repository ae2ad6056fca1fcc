"""Staging a workspace: a private per-job copy the sandbox may write.

The source (the caller's directory, or the worker's own clone or extraction) is never
mounted into the sandbox: the agent works on a copy owned by the sandbox's host uid, so
it never writes as host root and never touches the source behind the worker's back.
Links are copied as links, never followed; sockets, FIFOs and devices are not copied and
are reported; set-id bits are dropped. The walk and the copies are
:mod:`worker.safetree`'s: through directory descriptors, any depth up to the bound. The
copy is hashed as it is written: that snapshot is the "before" of change capture.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from worker.errors import WorkspaceUnavailable
from worker.safetree import (
    Bounds,
    Found,
    OverBound,
    Policy,
    Skipped,
    Tally,
    Walk,
    copy_file,
    remove_tree,
)
from worker.workspace.capture import SKIP_ROOT, Entry, seen_key
from worker.workspace.disk import unmount_below

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
    copier = _Copier(owner, source, dest)
    try:
        if not stat.S_ISDIR(os.stat(source).st_mode):
            raise WorkspaceUnavailable(f"workspace {source} is not a directory", path=str(source))
        dest.mkdir(mode=0o755, parents=False)
        copier.tree(max_depth)
    except OverBound as exc:
        raise WorkspaceUnavailable(
            f"workspace {source} nests directories more than {max_depth} "
            "levels deep (ACPW_WORKSPACE_MAX_DEPTH); it was not staged",
            path=str(source),
            max_depth=max_depth,
        ) from exc
    except OSError as exc:
        raise WorkspaceUnavailable(
            f"cannot stage workspace {source}: {exc.strerror}", path=str(source), errno=exc.errno
        ) from exc
    return StagedWorkspace(
        dest, source, copier.files, copier.bytes, tuple(copier.skipped), copier.before
    )


#: What staging copies: directories, files (hard-linked ones as separate files) and links
#: (as links); FIFOs, sockets and devices are reported as skipped.
_STAGED = Policy(frozenset({"dir", "file", "hardlink", "symlink"}))


class _Copier:
    """One staging: the copy made through a :class:`~worker.safetree.Walk` of the source,
    each file hashed as it is written (the "before" snapshot)."""

    def __init__(self, owner: tuple[int, int], source: Path, dest: Path) -> None:
        self.owner = owner
        self.source, self.dest = source, dest
        self.files = 0
        self.bytes = 0
        self.skipped: list[str] = []
        self.before: dict[str, Entry] = {}

    def tree(self, max_depth: int) -> None:
        bounds = Bounds(max_depth=max_depth)
        with Walk(self.source, policy=_STAGED, bounds=bounds, follow_root=True) as walk:
            os.chown(self.dest, *self.owner)
            for step in walk:
                if isinstance(step, Found):
                    self.entry(step, walk.tally)
                elif isinstance(step, Skipped):
                    self.skipped.append(step.path)
                else:  # a directory's times and mode once its entries are in
                    shutil.copystat(
                        self.source / step.rel, self.dest / step.rel, follow_symlinks=False
                    )

    def entry(self, found: Found, tally: Tally) -> None:
        info, rel, dst = found.info, found.rel, self.dest / found.rel
        mode = info.st_mode & 0o777  # set-id and sticky bits are not carried over
        tracked = rel.split("/", 1)[0] not in SKIP_ROOT
        if found.kind == "dir":
            dst.mkdir(mode=0o755)
            os.chown(dst, *self.owner)
            self._record(tracked, rel, Entry("dir", mode, 0))
        elif found.kind == "symlink":
            target = os.readlink(found.name, dir_fd=found.parent)
            os.symlink(target, dst)
            os.chown(dst, *self.owner, follow_symlinks=False)
            self._record(tracked, rel, Entry("link", 0o777, 0, target=target))
        else:
            digest = copy_file(found, dst, tally=tally, owner=self.owner, digest=True)
            self.files += 1
            self.bytes += info.st_size
            seen = seen_key(os.lstat(dst))  # after the last metadata change we make
            self._record(tracked, rel, Entry("file", mode, info.st_size, sha256=digest, seen=seen))

    def _record(self, tracked: bool, rel: str, entry: Entry) -> None:
        if tracked:
            self.before[rel] = entry


def remove_staged(path: Path) -> None:
    """Delete a staged copy (whatever the agent left in it); missing is fine.

    A workspace disk mounted inside (``worker.workspace.disk``) is unmounted first, so
    this never empties a mounted filesystem through its mount point and never leaves one
    mounted; an unmount that fails raises before anything is deleted. The removal itself
    (:func:`~worker.safetree.remove_tree`) follows no link, crosses into no other
    filesystem, and copes with any depth.

    Raises:
        OSError: something could not be unmounted or removed.
    """
    if path.exists():
        unmount_below(path)
        remove_tree(path)
