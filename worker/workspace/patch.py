"""A git-compatible, binary-safe patch of captured changes (``git apply`` takes it).

Text files get unified hunks; binary files (a NUL byte, or not UTF-8) get a ``GIT binary
patch`` with forward and reverse literals; links are files whose content is the target
(mode 120000). Old bytes come from the pristine source and new bytes from the workspace,
each checked against the digest the snapshot measured, so the patch says exactly what
the snapshots say. Files over ``inline_limit`` are listed in ``omitted``, not inlined.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from worker.workspace.capture import Change, Entry

_NULL_SHA1 = "0" * 40
_NO_EOL = "\\ No newline at end of file\n"


@dataclass(frozen=True, slots=True)
class Patch:
    text: bytes
    omitted: tuple[str, ...]


class _Unavailable(Exception):
    """The bytes a snapshot measured are no longer there (changed since, or too large)."""


def build_patch(
    changes: Iterable[Change], *, source: Path, workspace: Path, inline_limit: int
) -> Patch:
    """The patch turning ``source`` into ``workspace`` for ``changes``."""
    out: list[bytes] = []
    omitted: list[str] = []
    for change in changes:
        if _is_dir(change):
            continue
        try:
            old = _content(source, change.path, change.before, inline_limit)
            new = _content(workspace, change.path, change.after, inline_limit)
        except _Unavailable:
            omitted.append(change.path)
            continue
        out.append(_file_patch(change, old, new))
    return Patch(b"".join(out), tuple(omitted))


def _is_dir(change: Change) -> bool:
    kinds = {e.kind for e in (change.before, change.after) if e is not None}
    return kinds <= {"dir"} or "other" in kinds


def _content(root: Path, rel: str, entry: Entry | None, limit: int) -> bytes | None:
    if entry is None or entry.kind == "dir":
        return None
    if entry.kind == "link":
        return (entry.target or "").encode("utf-8", "surrogateescape")
    if entry.size > limit:
        raise _Unavailable(rel)
    try:
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        raise _Unavailable(rel) from None
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise _Unavailable(rel)
    return data


def _git_mode(entry: Entry | None) -> str | None:
    if entry is None or entry.kind == "dir":
        return None
    if entry.kind == "link":
        return "120000"
    return "100755" if entry.mode & 0o111 else "100644"


def _blob_sha1(data: bytes | None) -> str:
    if data is None:
        return _NULL_SHA1
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _file_patch(change: Change, old: bytes | None, new: bytes | None) -> bytes:
    old_mode, new_mode = _git_mode(change.before), _git_mode(change.after)
    if change.status == "type_changed" or (old_mode and new_mode and old_mode[:3] != new_mode[:3]):
        return _delete_then_add(change, old, new)
    head = [f"diff --git a/{change.path} b/{change.path}\n"]
    if old_mode is None:
        head.append(f"new file mode {new_mode}\n")
    elif new_mode is None:
        head.append(f"deleted file mode {old_mode}\n")
    elif old_mode != new_mode:
        head += [f"old mode {old_mode}\n", f"new mode {new_mode}\n"]
    if old == new:
        return "".join(head).encode()
    body = _body(change.path, old, new)
    index = f"index {_blob_sha1(old)}..{_blob_sha1(new)}"
    same_mode = old_mode if old_mode == new_mode else None
    head.append(f"{index} {same_mode}\n" if same_mode else f"{index}\n")
    return "".join(head).encode() + body


def _delete_then_add(change: Change, old: bytes | None, new: bytes | None) -> bytes:
    gone = Change(change.path, "deleted", change.before, None)
    came = Change(change.path, "added", None, change.after)
    parts = []
    if change.before is not None and change.before.kind != "dir":
        parts.append(_file_patch(gone, old, None))
    if change.after is not None and change.after.kind != "dir":
        parts.append(_file_patch(came, None, new))
    return b"".join(parts)


def _body(path: str, old: bytes | None, new: bytes | None) -> bytes:
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        return _binary(old or b"", new or b"")
    a = f"a/{path}" if old is not None else "/dev/null"
    b = f"b/{path}" if new is not None else "/dev/null"
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True), new_text.splitlines(keepends=True), a, b
    )
    return "".join(_mark_eol(lines)).encode("utf-8", "surrogateescape")


def _mark_eol(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n" + _NO_EOL


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if b"\0" in data[:8000]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _binary(old: bytes, new: bytes) -> bytes:
    return b"GIT binary patch\n" + _literal(new) + b"\n" + _literal(old) + b"\n"


def _literal(data: bytes) -> bytes:
    packed = zlib.compress(data, 9)
    lines = [b"literal %d\n" % len(data)]
    for start in range(0, len(packed), 52):
        chunk = packed[start : start + 52]
        lines.append(_length_char(len(chunk)) + base64.b85encode(chunk, pad=True) + b"\n")
    return b"".join(lines)


def _length_char(size: int) -> bytes:
    return bytes([ord("A") + size - 1]) if size <= 26 else bytes([ord("a") + size - 27])
