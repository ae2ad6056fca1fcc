"""Copying files and trees that something untrusted wrote.

Every source file is opened relative to its directory's descriptor with ``O_NOFOLLOW``
and ``O_NONBLOCK`` (a FIFO swapped in after the ``lstat`` must not block the open), and
checked to be what was inspected; every copy is created with ``O_EXCL`` (nothing
existing is overwritten or followed) and gets the permission bits without set-id or
sticky bits. Bytes are counted as they are read, against the walk's bounds.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worker.safetree.bounds import Bounds, Tally
from worker.safetree.kinds import PLAIN, Kind, kind_of
from worker.safetree.walk import Found, Skipped, Walk

CHUNK = 1024 * 1024
# O_NONBLOCK: a FIFO swapped in after the stat must not block the open.
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def copy_file(
    found: Found,
    dst: Path,
    *,
    tally: Tally,
    owner: tuple[int, int] | None = None,
    digest: bool = False,
) -> str | None:
    """Copy the regular file ``found`` to the new file ``dst``; its sha256 hex with
    ``digest`` (hashed as it is written, so the digest is of the bytes copied).

    ``dst`` gets ``found``'s permission bits without set-id or sticky bits, and
    ``owner`` (uid, gid) when given.

    Raises:
        OverBound: the bytes read take ``tally`` past its bound (``dst`` is left partial).
        OSError: ``found`` changed since it was listed, or ``dst`` exists or is a link.
    """
    hasher = hashlib.sha256() if digest else None
    fd = os.open(found.name, _FILE_OPEN, dir_fd=found.parent)
    try:
        _same(fd, found.info)
        out = os.open(dst, _NEW_FILE, 0o600)
        try:
            _copy_bytes(fd, out, tally, None if hasher is None else hasher.update)
            os.fchmod(out, stat.S_IMODE(found.info.st_mode) & 0o777)
            if owner is not None:
                os.fchown(out, *owner)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return None if hasher is None else hasher.hexdigest()


def _copy_bytes(src: int, dst: int, tally: Tally, update: Callable[[bytes], None] | None) -> None:
    while chunk := os.read(src, CHUNK):
        tally.read(len(chunk))
        if update is not None:
            update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


def _same(fd: int, info: os.stat_result) -> None:
    """The opened object is the one that was inspected (nothing swapped in between)."""
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino) or kind_of(now) != kind_of(info):
        raise OSError(errno.EBUSY, "an entry changed while it was copied")


@dataclass(slots=True)
class CopyReport:
    """What :func:`copy_tree` copied (``dirs`` counts the root) and what it left out."""

    files: int = 0
    dirs: int = 0
    bytes: int = 0
    skipped: list[Skipped] = field(default_factory=list)


def copy_tree(
    source: Path,
    dest: Path,
    bounds: Bounds,
    *,
    owner: tuple[int, int] | None = None,
    select: Callable[[str, Kind], bool] | None = None,
) -> CopyReport:
    """Copy the directory ``source`` (itself not a symlink) to the new directory ``dest``.

    Only directories and single-link regular files are copied; links, FIFOs, sockets,
    devices and hard-linked files are reported in ``skipped``. ``owner`` (uid, gid) is
    given to everything made; directories are made 0700. ``select``: only the entries it
    accepts (see :class:`Walk`) are copied, the rest passed over.

    Raises:
        OverBound: the tree exceeds ``bounds`` (``dest`` is left partial).
        OSError: ``source`` is missing, a symlink or not a directory, or a copy failed.
    """
    report = CopyReport()
    changed = "an entry changed while it was copied"
    with Walk(source, policy=PLAIN, bounds=bounds, changed=changed, select=select) as walk:
        _mkdir(dest, owner)
        report.dirs += 1
        for step in walk:
            if isinstance(step, Skipped):
                report.skipped.append(step)
            elif isinstance(step, Found):
                if step.kind == "dir":
                    _mkdir(dest / step.rel, owner)
                    report.dirs += 1
                else:
                    copy_file(step, dest / step.rel, tally=walk.tally, owner=owner)
                    report.files += 1
    report.bytes = walk.tally.bytes
    return report


def _mkdir(path: Path, owner: tuple[int, int] | None) -> None:
    os.mkdir(path, 0o700)
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)
