"""Removing a tree the agent may have shaped, without recursion and without following links.

An agent can nest directories deeper than Python's stack (``shutil.rmtree`` recurses
once per level on Python 3.11) and deeper than ``PATH_MAX``, leave directories it cannot
be entered, and plant links. :func:`remove_tree` walks with an explicit stack and
relative ``*at`` calls, so neither depth nor path length matters; it holds two
descriptors at most (the directory being emptied, and its parent while climbing back)
however deep the tree, and checks each climb lands where it came from. A link is
removed, never followed; a directory on another filesystem (something still mounted
below) is refused, not emptied.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class _Level:
    """A directory being emptied: its identity, its name in its parent, the
    subdirectories still to empty."""

    ident: tuple[int, int]
    name: str
    subdirs: list[str] = field(default_factory=list)


def remove_tree(root: Path) -> None:
    """Delete ``root`` and everything below it; a missing ``root`` is fine.

    Raises:
        OSError: something could not be removed, a directory below ``root`` is on
            another filesystem (``EXDEV``), or the tree changed under the walk.
    """
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(root)
        return
    _writable(root, None)
    fd = os.open(root, _OPEN_DIR)
    try:
        _empty(fd, info.st_dev, root)
    finally:
        os.close(fd)
    os.rmdir(root)


def _empty(top: int, device: int, root: Path) -> None:
    """Empty the directory open as ``top`` (whose filesystem is ``device``)."""
    levels = [_Level(_ident(top), "", _clear(top, device, root))]
    fd = top
    try:
        while levels:
            level = levels[-1]
            if level.subdirs:
                name = level.subdirs.pop()
                child = _enter(fd, name)
                if fd != top:
                    os.close(fd)
                fd = child
                levels.append(_Level(_ident(fd), name, _clear(fd, device, root)))
                continue
            levels.pop()
            if levels:
                fd = _climb(fd, top, levels[-1].ident, root)
                os.rmdir(level.name, dir_fd=fd)
    finally:
        if fd != top:
            os.close(fd)


def _enter(parent: int, name: str) -> int:
    _writable(name, parent)
    return os.open(name, _OPEN_DIR, dir_fd=parent)


def _writable(name: str | Path, parent: int | None) -> None:
    # The agent may have left directories it cannot be entered or emptied. Only called on
    # what lstat saw as a directory, while nothing of the agent runs any more; not our own
    # (root made it, and we are not root): the open or unlink that follows says so.
    with contextlib.suppress(PermissionError):
        os.chmod(name, 0o700, dir_fd=parent)


def _climb(fd: int, top: int, expected: tuple[int, int], root: Path) -> int:
    parent = top if _ident(top) == expected else os.open("..", _OPEN_DIR, dir_fd=fd)
    os.close(fd)
    if _ident(parent) != expected:
        if parent != top:
            os.close(parent)
        raise OSError(errno.ESTALE, "the tree changed while it was being removed", str(root))
    return parent


def _clear(fd: int, device: int, root: Path) -> list[str]:
    """Unlink every non-directory in ``fd``; return its subdirectories' names."""
    subdirs = []
    with os.scandir(fd) as entries:
        found = [(entry.name, entry.stat(follow_symlinks=False)) for entry in entries]
    for name, info in found:
        if not stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
        elif info.st_dev != device:
            raise OSError(errno.EXDEV, "a filesystem is still mounted below", str(root))
        else:
            subdirs.append(name)
    return subdirs


def _ident(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino
