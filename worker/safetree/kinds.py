"""What a directory entry is, and which kinds a walk keeps.

One vocabulary for every caller that meets an untrusted tree: staging keeps links (as
links) and hard-linked files, a session copy keeps only directories and single-link
files, an archive extraction refuses everything but directories and regular files. The
kind is decided from an ``lstat`` (links are never followed), so a caller never asks the
filesystem twice and the answer cannot differ between the check and the use.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["dir", "file", "hardlink", "symlink", "fifo", "socket", "device"]


def kind_of(info: os.stat_result) -> Kind:
    """The kind of what ``info`` (an ``lstat``) describes.

    A regular file with more than one link is ``hardlink``: its bytes are shared with a
    path outside the walk's view, so a copy cannot tell who else may change them.
    """
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file" if info.st_nlink == 1 else "hardlink"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


@dataclass(frozen=True, slots=True)
class Policy:
    """Which kinds a walk hands to its caller (``keep``); every other kind is reported
    as skipped and never opened. A directory that is not kept is not entered."""

    keep: frozenset[Kind]

    def keeps(self, kind: Kind) -> bool:
        return kind in self.keep


#: Every kind: a walk that must see everything (removing a tree).
EVERY_KIND: Final = Policy(
    frozenset({"dir", "file", "hardlink", "symlink", "fifo", "socket", "device"})
)
#: Only what can be copied without trusting it: directories and single-link regular files.
PLAIN: Final = Policy(frozenset({"dir", "file"}))
