"""Removing a tree the agent may have shaped, without recursion and without following links.

An agent can nest directories deeper than Python's stack (``shutil.rmtree`` recurses
once per level on Python 3.11) and deeper than ``PATH_MAX``, leave directories it cannot
be entered, and plant links. :func:`remove_tree` removes through a :class:`~.walk.Walk`,
so neither depth nor path length matters, it holds one descriptor however deep the tree,
and a tree changed under it stops it. A link is removed, never followed; a directory on
another filesystem (something still mounted below) is refused, not emptied.

Two removers may race over one tree (a job's teardown after its lease was lost, and the
reaper that settled it): what the other one removed first, the root included, is gone
as asked, not an error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from worker.safetree.kinds import EVERY_KIND
from worker.safetree.walk import Done, Found, Walk


def remove_tree(root: Path) -> None:
    """Delete ``root`` and everything below it; a missing ``root`` is fine, and so is
    anything of it (the root too) that someone else removes meanwhile.

    Raises:
        OSError: something could not be removed, a directory below ``root`` is on
            another filesystem (``EXDEV``), or the tree changed under the walk.
    """
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root)
        return
    _writable(root, None)
    changed = "the tree changed while it was being removed"
    walk = Walk(root, policy=EVERY_KIND, changed=changed, vanished_ok=True)
    try:
        walk.__enter__()
    except FileNotFoundError:
        return  # removed by someone else since the lstat
    try:
        for step in walk:
            if isinstance(step, Found):
                _remove_or_open(step, info.st_dev, root)
            elif isinstance(step, Done) and step.parent is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(step.name, dir_fd=step.parent)
    finally:
        walk.close()
    # Whatever is still in it (ENOTEMPTY) is an error; gone altogether is what was asked.
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(root)


def _remove_or_open(found: Found, device: int, root: Path) -> None:
    """Unlink a non-directory; make a directory on ``device`` enterable (the walk
    enters it next)."""
    if found.kind != "dir":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(found.name, dir_fd=found.parent)
    elif found.info.st_dev != device:
        raise OSError(errno.EXDEV, "a filesystem is still mounted below", str(root))
    else:
        _writable(found.name, found.parent)


def _writable(name: str | Path, parent: int | None) -> None:
    # The agent may have left directories it cannot be entered or emptied. Only called on
    # what lstat saw as a directory, while nothing of the agent runs any more; not our own
    # (root made it, and we are not root): the open or unlink that follows says so. Gone
    # already (another remover took it): nothing to open.
    with contextlib.suppress(PermissionError, FileNotFoundError):
        os.chmod(name, 0o700, dir_fd=parent)
