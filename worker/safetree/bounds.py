"""Bounds on what one walk may hold: bytes, entries and directory depth.

A tree written by an agent can be made arbitrarily large, wide or deep; every copy of
one is bounded, and a bound is checked before the work it limits (a directory deeper
than allowed is never made, a file that would pass the byte bound is never opened).
Bytes are also counted as they are read, so the bound holds for a file that grows
while it is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import Refused


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one walk may hold; ``None`` is unbounded.

    ``max_entries`` counts the root and every entry kept; ``max_depth`` is the most
    directory levels below the root (a directory directly in the root is level 1).
    """

    max_bytes: int | None = None
    max_entries: int | None = None
    max_depth: int | None = None


UNBOUNDED = Bounds()


class OverBound(Refused):
    """The tree is larger than its bounds (``what``: bytes, entries or levels of
    directories)."""

    code = "over_bound"

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"more than {limit} {what}", what=what, limit=limit)
        self.what = what
        self.limit = limit


class Tally:
    """What a walk has taken so far, checked against its :class:`Bounds`."""

    __slots__ = ("bounds", "bytes", "entries")

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.entries = 0
        self.bytes = 0

    def entry(self) -> None:
        """Count one more entry.

        Raises:
            OverBound: there are ``max_entries`` already.
        """
        limit = self.bounds.max_entries
        if limit is not None and self.entries >= limit:
            raise OverBound("entries", limit)
        self.entries += 1

    def expect(self, size: int) -> None:
        """Refuse a file of ``size`` bytes (as ``lstat`` says) before it is opened.

        Raises:
            OverBound: it would take the total past ``max_bytes``.
        """
        limit = self.bounds.max_bytes
        if limit is not None and self.bytes + size > limit:
            raise OverBound("bytes", limit)

    def read(self, count: int) -> None:
        """Count ``count`` bytes read.

        Raises:
            OverBound: the total is past ``max_bytes``.
        """
        self.bytes += count
        limit = self.bounds.max_bytes
        if limit is not None and self.bytes > limit:
            raise OverBound("bytes", limit)

    def level(self, depth: int) -> None:
        """Refuse a directory ``depth`` levels below the root before it is made or entered.

        Raises:
            OverBound: ``depth`` is more than ``max_depth``.
        """
        limit = self.bounds.max_depth
        if limit is not None and depth > limit:
            raise OverBound("levels of directories", limit)
