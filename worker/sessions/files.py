"""Which files of an agent's session directory belong to one session.

A pack declares them (``launch.sessions``, :class:`~worker.packs.manifest.SessionFiles`):
patterns relative to the session directory whose names may hold ``*`` (any characters
but ``/``) and ``{session}`` (the session id). :class:`Selection` is the ``select`` of a
:class:`~worker.safetree.Walk` over that directory: it lets through exactly the entries
on the way to a match, the matches, and what a matched directory holds, so a save or a
restore never even enters the rest (another session's files, the agent's caches).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from worker.packs.manifest import SESSION_SLOT
from worker.safetree import Kind

_KEPT = frozenset({"dir", "file"})
_TOKEN = re.compile(r"(\*|\{session\})")


def _name(part: str, session_id: str) -> re.Pattern[str]:
    pieces = []
    for piece in _TOKEN.split(part):
        if piece == "*":
            pieces.append("[^/]*")
        elif piece == SESSION_SLOT:
            pieces.append(re.escape(session_id))
        else:
            pieces.append(re.escape(piece))
    return re.compile("".join(pieces))


class Selection:
    """The entries of one session (``keep`` patterns with ``session_id`` filled in).

    Called with a walk's ``rel`` path and kind; ``matched`` counts the directories and
    regular files that matched a whole pattern (0 after a walk: the session has nothing
    there a copy keeps).
    """

    __slots__ = ("_patterns", "matched")

    def __init__(self, keep: Sequence[str], session_id: str) -> None:
        self._patterns = [
            tuple(_name(part, session_id) for part in pattern.split("/")) for pattern in keep
        ]
        self.matched = 0

    def __call__(self, rel: str, kind: Kind) -> bool:
        parts = rel.split("/")
        for pattern in self._patterns:
            depth = min(len(parts), len(pattern))
            if not all(pattern[i].fullmatch(parts[i]) for i in range(depth)):
                continue
            if len(parts) == len(pattern):
                self.matched += kind in _KEPT
                return True
            if len(parts) > len(pattern) or kind == "dir":
                return True  # inside a matched directory, or on the way to a match
        return False
