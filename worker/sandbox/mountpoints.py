"""Mount points for the config masks, made in the host workspace without following links.

bubblewrap needs every mount destination to exist; left to itself it would create missing
ones inside the workspace on its own terms (following symlinks). So :func:`ensure` makes
them first, through ``*at`` calls on ``O_NOFOLLOW`` directory descriptors, and returns
exactly what it created; :func:`remove` takes away only those, and only while they are
still what was made (an empty regular file, or a directory, which ``rmdir`` removes only
when empty).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _parent_fd(root: Path, rel: PurePosixPath) -> Iterator[int]:
    """An ``O_PATH`` descriptor of ``rel``'s parent, reached without following any link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in rel.parent.parts:
            if part == ".":
                continue
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def ensure(root: Path, plan: Sequence[MaskEntry], owner: tuple[int, int] | None) -> list[str]:
    """Make every missing mount point of ``plan`` under ``root``; return what was made.

    ``owner`` (uid, gid) is given to what is made (the sandbox's host uid when the worker is
    root, so the agent may use an anchor directory like any other). On failure, what was
    made so far is removed again.

    Raises:
        SandboxError: a path of the plan exists as the wrong kind (e.g. a symlink).
        OSError: the workspace could not be walked or written.
    """
    made: list[str] = []
    try:
        for entry in plan:
            # One at a time: on a failure, `made` must hold exactly what was made so far.
            if _ensure_one(root, entry, owner):
                made.append(str(entry.path))  # noqa: PERF401
    except BaseException:
        remove(root, made)
        raise
    return made


def _ensure_one(root: Path, entry: MaskEntry, owner: tuple[int, int] | None) -> bool:
    want_dir = entry.kind is not MaskKind.FILE
    with _parent_fd(root, entry.path) as parent:
        name = entry.path.name
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            _make(parent, name, want_dir=want_dir, owner=owner)
            return True
    if stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode):
        return False
    wanted = "a directory" if want_dir else "a regular file"
    raise SandboxError(
        f"config path {entry.path} is not {wanted}, so it cannot be masked",
        path=str(entry.path),
    )


def _make(parent: int, name: str, *, want_dir: bool, owner: tuple[int, int] | None) -> None:
    if want_dir:
        os.mkdir(name, 0o755, dir_fd=parent)
    else:
        os.close(os.open(name, _NEW_FILE, 0o644, dir_fd=parent))
    if owner is not None:
        os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)


def remove(root: Path, made: Sequence[str]) -> None:
    """Remove what :func:`ensure` made, deepest first; anything changed since is kept."""
    for rel in reversed(made):
        with contextlib.suppress(OSError):
            _remove_one(root, PurePosixPath(rel))


def _remove_one(root: Path, rel: PurePosixPath) -> None:
    with _parent_fd(root, rel) as parent:
        info = os.stat(rel.name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(rel.name, dir_fd=parent)  # ENOTEMPTY: the agent put something there
        elif stat.S_ISREG(info.st_mode) and info.st_size == 0:
            os.unlink(rel.name, dir_fd=parent)


def in_place(root: Path, entry: MaskEntry) -> bool:
    """True if ``entry``'s path is (without following links) the kind its mask covers."""
    want_dir = entry.kind is not MaskKind.FILE
    try:
        with _parent_fd(root, entry.path) as parent:
            mode = os.stat(entry.path.name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)


def covering(masks: Sequence[MaskEntry], path: str) -> MaskEntry | None:
    """The mask mounted over ``path`` (relative to the workspace): a file or directory
    mask at that very path, or a directory mask over one of its parents."""
    rel = PurePosixPath(path)
    for entry in masks:
        if entry.kind is MaskKind.ANCHOR:
            continue
        if entry.path == rel or (entry.kind is MaskKind.DIR and entry.path in rel.parents):
            return entry
    return None


def hidden(root: Path, masks: Sequence[MaskEntry], path: str) -> bool:
    """True if the mount view shows a mask at ``path``, not the host entry: a mask covers
    it (:func:`covering`) and the host entry there is the kind that mask is mounted over
    (inside, nothing below a directory mask exists)."""
    entry = covering(masks, path)
    return entry is not None and in_place(root, entry)
