"""Walking an untrusted tree: iterative, through directory descriptors, following no link.

A tree an agent shaped may be deeper than Python's stack and longer than ``PATH_MAX``,
and may change while it is walked. :class:`Walk` keeps an explicit stack instead of
recursing, and opens each directory relative to its parent's descriptor with
``O_NOFOLLOW``: no path is ever resolved from the root again, so neither depth nor path
length matters and no link is followed. It holds one descriptor however deep it goes
(climbing back through ``..``), and checks that every directory it opens, going down or
up, is the one it listed: a tree changed under the walk stops it with an ``OSError``.

The walk is lazy: a directory met is entered only when the caller asks for the next
step, so the caller may act on it first (make its copy, make it enterable).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from worker.safetree.bounds import UNBOUNDED, Bounds, Tally
from worker.safetree.kinds import Kind, Policy, kind_of

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Found:
    """An entry the policy keeps. ``parent`` is its directory's descriptor, valid until
    the caller asks for the next step (act on ``name`` relative to it, never on a path)."""

    parent: int
    name: str
    rel: str
    info: os.stat_result
    kind: Kind
    depth: int


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry the policy does not keep: ``kind`` is one of :data:`~.kinds.Kind`."""

    path: str
    kind: str


@dataclass(frozen=True, slots=True)
class Done:
    """A directory all of whose entries were met (its :class:`Found` came first).
    ``parent`` is the descriptor of the directory holding it, ``None`` for the root."""

    parent: int | None
    name: str
    rel: str


Step = Found | Skipped | Done


@dataclass(frozen=True, slots=True)
class _Level:
    ident: tuple[int, int]
    name: str
    rel: str
    depth: int
    entries: Iterator[tuple[str, os.stat_result]]


class Walk:
    """Every entry below ``root``, depth first, names sorted: a :class:`Found` for each
    entry the policy keeps (a directory before what it holds, its :class:`Done` after),
    a :class:`Skipped` for any other. Use as a context manager: leaving it closes the
    descriptor held.

    ``follow_root``: the root itself may be a link to a directory (a caller's path);
    nothing below it is followed either way. ``changed`` is the message of the
    ``OSError`` raised when the tree changes under the walk. ``select`` (the entry's
    ``rel`` path and kind): an entry it refuses is passed over as if absent, neither
    counted, reported nor entered (a walk of part of a tree). ``vanished_ok``: an entry
    gone by the time it is looked at or entered (another process removing the same tree)
    is passed over as if absent, instead of stopping the walk with ``FileNotFoundError``;
    a directory replaced by another still stops it.
    """

    def __init__(
        self,
        root: Path,
        *,
        policy: Policy,
        bounds: Bounds = UNBOUNDED,
        follow_root: bool = False,
        changed: str = "the tree changed while it was walked",
        select: Callable[[str, Kind], bool] | None = None,
        vanished_ok: bool = False,
    ) -> None:
        self.root = root
        self._vanished_ok = vanished_ok
        self._select = select
        self.policy = policy
        self.tally = Tally(bounds)
        self._follow_root = follow_root
        self._changed = changed
        self._fd: int | None = None

    def __enter__(self) -> Self:
        """Open the root (counted as an entry).

        Raises:
            OSError: the root is missing or not a directory (or a link, unless
                ``follow_root``).
        """
        flags = OPEN_DIR & ~os.O_NOFOLLOW if self._follow_root else OPEN_DIR
        self._fd = os.open(self.root, flags)
        try:
            self.tally.entry()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __iter__(self) -> Iterator[Step]:
        if self._fd is None:
            raise RuntimeError("a Walk is iterated inside its with block, once")
        stack = [_Level(_ident(self._fd), "", "", 0, self._listing(self._fd))]
        while stack:
            level = stack[-1]
            item = next(level.entries, None)
            if item is None:
                stack.pop()
                parent = self._climb(stack[-1].ident) if stack else None
                yield Done(parent, level.name, level.rel.rstrip("/"))
                continue
            name, info = item
            kind = kind_of(info)
            rel = level.rel + name
            if self._select is not None and not self._select(rel, kind):
                continue
            if not self.policy.keeps(kind):
                yield Skipped(rel, kind)
                continue
            depth = level.depth + 1
            if kind == "dir":
                self.tally.level(depth)
            self.tally.entry()
            if kind in ("file", "hardlink"):
                self.tally.expect(info.st_size)
            yield Found(self._fd, name, rel, info, kind, depth)
            if kind == "dir" and self._descend(name, info):
                stack.append(
                    _Level(_ident(self._fd), name, rel + "/", depth, self._listing(self._fd))
                )

    def _listing(self, fd: int) -> Iterator[tuple[str, os.stat_result]]:
        found = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    if not self._vanished_ok:
                        raise
        found.sort(key=lambda item: item[0])
        return iter(found)

    def _descend(self, name: str, info: os.stat_result) -> bool:
        """Enter ``name``: whether it was there to enter (``False`` only when
        ``vanished_ok``)."""
        assert self._fd is not None
        try:
            child = os.open(name, OPEN_DIR, dir_fd=self._fd)
        except FileNotFoundError:
            if not self._vanished_ok:
                raise
            return False  # removed since it was listed: nothing below to walk
        os.close(self._fd)
        self._fd = child
        if _ident(child) != (info.st_dev, info.st_ino):
            raise OSError(errno.ESTALE, self._changed, str(self.root))
        return True

    def _climb(self, expected: tuple[int, int]) -> int:
        assert self._fd is not None
        parent = os.open("..", OPEN_DIR, dir_fd=self._fd)
        os.close(self._fd)
        self._fd = parent
        if _ident(parent) != expected:
            raise OSError(errno.ESTALE, self._changed, str(self.root))
        return parent


def _ident(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino
