"""``/proc/<pid>/mountinfo``, parsed: what is mounted where, in one mount namespace."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, slots=True)
class Mount:
    """One mountinfo line: the filesystem (``major:minor``), the path inside it that is
    mounted (``root``) and where (``point``)."""

    device: str
    root: str
    point: str


def read_mountinfo(path: Path = Path("/proc/self/mountinfo")) -> Iterator[Mount]:
    """The mounts listed in ``path``; nothing when it cannot be read (the process exited,
    or we may not look)."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 5:
            yield Mount(fields[2], _unescape(fields[3]), _unescape(fields[4]))


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as \ooo.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)
