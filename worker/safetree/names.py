"""Relative paths a tree may hold: the one check shared by whatever names a member.

A pack's manifest, its lock file and the archive extractor all use :func:`path_problem`,
so a path that can be locked is exactly a path that can be extracted.
"""

from __future__ import annotations

import re
from typing import Final

MAX_PATH_BYTES: Final = 1024
MAX_COMPONENT_BYTES: Final = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(path: str) -> str | None:
    """Why *path* is not a canonical relative path, or None when it is one.

    Canonical: relative POSIX, valid UTF-8, no empty, ``.`` or ``..`` component, no
    control character (so no NUL or newline), components at most 255 bytes and the
    whole at most 1024 bytes.
    """
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if not path:
        return "empty name"
    if path.startswith("/"):
        return "absolute path"
    if _CONTROL.search(path):
        return "control character in name"
    if len(raw) > MAX_PATH_BYTES:
        return f"name longer than {MAX_PATH_BYTES} bytes"
    return _component_problem(path.split("/"))


def _component_problem(parts: list[str]) -> str | None:
    for part in parts:
        if part == "..":
            return "'..' component"
        if part in ("", "."):
            return "empty or '.' component"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"component longer than {MAX_COMPONENT_BYTES} bytes"
    return None
