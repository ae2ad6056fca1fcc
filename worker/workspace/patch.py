"""A git-compatible, binary-safe patch of captured changes (``git apply`` takes it), built
within bounds of size and time.

Text files get unified hunks; binary files (a NUL byte, or not UTF-8) get a ``GIT binary
patch`` with forward and reverse literals; links are files whose content is the target
(mode 120000). Old bytes come from the pristine source and new bytes from the workspace,
each checked against the digest the snapshot measured, so the patch says exactly what
the snapshots say.

Hunks come from ``git diff --no-index`` (git's Myers xdiff: a heuristic bounds its cost,
where difflib took minutes on one rewritten megabyte). git diffs private copies of the
checked bytes, many files per run, in a scratch directory (in memory when there is room),
with no config (none of any repository around the scratch directory either), no
attributes, no external diff and no textconv: nothing in the workspace is run or read by
it, and it never sees the workspace's paths. Headers (modes, index lines) are written
here.

Bounds (:class:`PatchLimits`), each leaving a file out with its reason, never silently:

- ``too_large``: the file (either side) is over ``file_bytes``;
- ``patch_full``: its diff would take the patch over ``patch_bytes``;
- ``time_budget``: the deadline passed before the file was diffed;
- ``unavailable``: its bytes are no longer the ones the snapshot measured;
- ``diff_failed``: git failed on it.

And what a git patch cannot say, also left out with its reason (and listed in
``workspace.changed``):

- ``not_representable``: git knows two file modes (100644, 100755), links and nothing
  else. A permission change within one of them (0644 to 0600, 0755 to 0700) alone is
  left out; with a content change the content goes in with the git mode unchanged (the
  exact modes are in ``workspace.changed``). A FIFO, socket or device (added, deleted,
  or either side of a type change) is left out; a file or link it replaced is deleted
  in the patch, so applying it leaves the path empty.
- ``git_path``: a path ``git apply`` refuses (git's ``verify_path``, with its NTFS and
  HFS+ protections both on, so the patch applies everywhere): a ``.git`` component in any
  case (the agent's own repository in a subdirectory), its NTFS forms (``git~1``,
  ``.git.``, ``.git ``, ``.git:…``, after a backslash too) and HFS+ forms (``.git`` with
  ignorable code points), and a link named ``.gitmodules`` in any of those forms.

Memory holds at most one batch of inputs (``_BATCH_BYTES``) besides the patch itself.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from worker.workspace.capture import Change, Entry

Reason = Literal[
    "too_large",
    "patch_full",
    "time_budget",
    "unavailable",
    "diff_failed",
    "not_representable",
    "git_path",
]

_NULL_SHA1 = "0" * 40
#: Inputs held (and copied for git) at once, and files per git run.
_BATCH_BYTES = 4 * 1024 * 1024
_BATCH_FILES = 512
_C_ESCAPES = {7: b"\\a", 8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r",
              0x22: b'\\"', 0x5C: b"\\\\", 0x7F: b"\\177"}  # fmt: skip
_QUOTED = frozenset({0x22, 0x5C, 0x7F})
_SHM = Path("/dev/shm")  # noqa: S108 - only as mkdtemp's parent: a private 0700 directory
_GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
}
#: git's NTFS forms of ``.git`` in a path component (matched at its start and after each
#: backslash), and of ``.gitmodules`` for a link (matched on the rest of the path: git
#: stops only at its end or a ``:``), with the 8.3 short names ``gitmod~N`` and the
#: fallback ``gi7eba~N``-like ones of 8 characters.
_DOTGIT = re.compile(rb"(?:\.git|git~1)[. ]*(?:[\\:]|\Z)", re.IGNORECASE)
_DOTGITMODULES = re.compile(
    rb"(?:\.gitmodules|gitmod~[1-4]|"
    + b"|".join(b"gi7eba"[:k] + b"~[1-9][0-9]{%d}" % (6 - k) for k in range(7))
    + rb")[. ]*(?::|\Z)",
    re.IGNORECASE,
)
#: Code points HFS+ ignores in names (git skips them when it looks for ``.git``).
_HFS_IGNORED = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_BLOBS = ("file", "link")
_GIT_DIFF = ("git", "diff", "--no-index", "--no-renames", "--text", "--full-index",
             "--no-color", "--no-ext-diff", "--no-textconv", "--diff-algorithm=myers",
             "--unified=3", "--src-prefix=a/", "--dst-prefix=b/", "--", "a", "b")  # fmt: skip


@dataclass(frozen=True, slots=True)
class PatchLimits:
    """Bounds of one capture's patch (the settings' defaults)."""

    file_bytes: int = 1024 * 1024
    patch_bytes: int = 16 * 1024 * 1024
    time_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Omission:
    """A changed file that is not in the patch, and why."""

    path: str
    reason: Reason


@dataclass(frozen=True, slots=True)
class Patch:
    text: bytes
    omitted: tuple[Omission, ...] = ()

    @property
    def complete(self) -> bool:
        """Every changed file is in the patch."""
        return not self.omitted


class _Unavailable(Exception):
    """The bytes a snapshot measured are no longer there (changed since, or unreadable)."""


@dataclass(frozen=True, slots=True)
class _Part:
    """One ``diff --git`` section: a path's old and new bytes (None: absent), and whether
    its body is empty (``same``), unified hunks (``text``) or literals (``binary``)."""

    change: Change
    old: bytes | None
    new: bytes | None
    body: Literal["same", "text", "binary"]


def _part(change: Change, old: bytes | None, new: bytes | None) -> _Part:
    before, after = old or b"", new or b""
    if before == after:
        return _Part(change, old, new, "same")
    text = _is_text(before) and _is_text(after)
    return _Part(change, old, new, "text" if text else "binary")


@dataclass(slots=True)
class _Batch:
    """Changes whose bytes are read, in path order; the text ones diffed in one git run."""

    changes: list[list[_Part]] = field(default_factory=list)
    held: int = 0

    def add(self, parts: list[_Part]) -> None:
        self.changes.append(parts)
        self.held += sum(len(p.old or b"") + len(p.new or b"") for p in parts)

    def full(self) -> bool:
        return self.held >= _BATCH_BYTES or len(self.changes) >= _BATCH_FILES


def build_patch(
    changes: Iterable[Change],
    *,
    source: Path,
    workspace: Path,
    limits: PatchLimits,
    deadline: float | None = None,
    scratch: Path | None = None,
) -> Patch:
    """The patch turning ``source`` into ``workspace`` for ``changes``, done by
    ``deadline`` (``time.monotonic()``; default: ``limits.time_s`` from now). git's
    inputs are copied below ``scratch`` (default: :func:`scratch_root`)."""
    if deadline is None:
        deadline = time.monotonic() + limits.time_s
    builder = _Builder(source, workspace, limits, deadline)
    with tempfile.TemporaryDirectory(prefix="acpw-diff-", dir=scratch or scratch_root()) as tmp:
        for batch in builder.batches(changes):
            builder.assemble(batch, Path(tmp))
    return builder.result()


def scratch_root() -> Path | None:
    """``/dev/shm`` when it is writable with room for a few batches (memory: a VM disk
    can take a millisecond per file created, the bulk of a capture's time), else None:
    the temporary directory."""
    try:
        info = os.statvfs(_SHM)
    except OSError:
        return None
    room = info.f_bavail * info.f_frsize
    return _SHM if room >= 8 * _BATCH_BYTES and os.access(_SHM, os.W_OK) else None


class _Builder:
    def __init__(self, source: Path, workspace: Path, limits: PatchLimits, deadline: float) -> None:
        self.source, self.workspace = source, workspace
        self.limits, self.deadline = limits, deadline
        self.out: list[bytes] = []
        self.size = 0
        self.omitted: dict[str, Omission] = {}

    def result(self) -> Patch:
        omitted = tuple(sorted(self.omitted.values(), key=lambda o: o.path))
        return Patch(b"".join(self.out), omitted)

    def late(self) -> bool:
        return time.monotonic() >= self.deadline

    def omit(self, change: Change, reason: Reason) -> None:
        """Record that ``change`` is not (wholly) in the patch; a path's first reason
        stands (a special file's, before the deletion it carries is read)."""
        self.omitted.setdefault(change.path, Omission(change.path, reason))

    def batches(self, changes: Iterable[Change]) -> Iterator[_Batch]:
        batch = _Batch()
        for change in changes:
            carried = self._carried(change)
            if carried is None:
                continue
            parts = self._read(carried)
            if parts is not None:
                batch.add(parts)
            if batch.full():
                yield batch
                batch = _Batch()
        if batch.changes:
            yield batch

    def _carried(self, change: Change) -> Change | None:
        """What of ``change`` the patch is to carry (None: nothing; what it cannot carry
        is omitted with its reason)."""
        if _is_dir(change):
            return None  # git has no directories: their files say it all
        reason = _unrepresentable(change)
        if reason is None:
            return change
        self.omit(change, reason)
        return _deletion(change) if reason == "not_representable" else None

    def _read(self, change: Change) -> list[_Part] | None:
        if _mode_only(change):  # no content needed, whatever the file's size
            return [_Part(change, b"", b"", "same")]
        reason = self._precheck(change)
        if reason is None:
            try:
                old = _content(self.source, change.path, change.before, self.limits.file_bytes)
                new = _content(self.workspace, change.path, change.after, self.limits.file_bytes)
            except _Unavailable:
                reason = "unavailable"
            else:
                return _parts(change, old, new)
        self.omit(change, reason)
        return None

    def _precheck(self, change: Change) -> Reason | None:
        if self.late():
            return "time_budget"
        if self.size >= self.limits.patch_bytes:
            return "patch_full"
        sizes = [e.size for e in (change.before, change.after) if e is not None]
        return "too_large" if max(sizes) > self.limits.file_bytes else None

    def assemble(self, batch: _Batch, scratch: Path) -> None:
        text = [part for parts in batch.changes for part in parts if part.body == "text"]
        hunks = dict(zip(map(id, text), self._hunks(text, scratch), strict=True))
        for parts in batch.changes:
            sections = self._sections(parts, hunks)
            if isinstance(sections, bytes):
                self._append(parts[0].change, sections)
            else:
                self.omit(parts[0].change, sections)

    def _sections(self, parts: list[_Part], hunks: dict[int, bytes | Reason]) -> bytes | Reason:
        out = []
        for part in parts:
            body = hunks[id(part)] if part.body == "text" else self._plain(part)
            if isinstance(body, str):
                return body
            out.append(_section(part, body))
        return b"".join(out)

    def _plain(self, part: _Part) -> bytes | Reason:
        if part.body == "same":
            return b""  # a mode change, or an empty file added or deleted
        if self.late():
            return "time_budget"
        return _binary(part.old or b"", part.new or b"")

    def _hunks(self, parts: Sequence[_Part], scratch: Path) -> list[bytes | Reason]:
        """The ``---``/``+++`` lines and hunks of each text part, or why there are none."""
        if not parts:
            return []
        if self.late():
            return ["time_budget"] * len(parts)
        found = _git_hunks(parts, scratch, timeout=self.deadline - time.monotonic())
        if isinstance(found, str):
            return [found] * len(parts)
        return [_checked(part, found.get(index)) for index, part in enumerate(parts)]

    def _append(self, change: Change, text: bytes) -> None:
        if self.size + len(text) > self.limits.patch_bytes:
            self.omit(change, "patch_full")
            return
        self.out.append(text)
        self.size += len(text)


def _is_dir(change: Change) -> bool:
    return all(e is None or e.kind == "dir" for e in (change.before, change.after))


def _unrepresentable(change: Change) -> Reason | None:
    sides = [e for e in (change.before, change.after) if e is not None]
    if git_refuses(change.path, link=any(e.kind == "link" for e in sides)):
        return "git_path"
    if any(e.kind == "other" for e in sides) or _mode_within_git_mode(change):
        return "not_representable"
    return None


def _deletion(change: Change) -> Change | None:
    """The deletion of the file or link a special file replaced (None: there is none)."""
    before, after = change.before, change.after
    if before is None or before.kind not in _BLOBS or after is None or after.kind != "other":
        return None
    return Change(change.path, "deleted", before, None)


def _mode_within_git_mode(change: Change) -> bool:
    """A file whose bytes and git mode are the same, its permissions not (0644 to 0600)."""
    return _same_bytes(change) and _git_mode(change.before) == _git_mode(change.after)


def _same_bytes(change: Change) -> bool:
    """A file before and after, with the same bytes (as measured)."""
    before, after = change.before, change.after
    return (
        before is not None
        and after is not None
        and before.kind == after.kind == "file"
        and before.sha256 == after.sha256
    )


def git_refuses(path: str, *, link: bool) -> bool:
    """``git apply`` refuses ``path`` (for a link when ``link``), on any system."""
    raw = path.encode("utf-8", "surrogateescape")
    starts = [0, *(i + 1 for i, byte in enumerate(raw) if byte == 0x2F)]
    return any(_refused_at(raw, start, link=link) for start in starts)


def _refused_at(raw: bytes, start: int, *, link: bool) -> bool:
    """The component of ``raw`` from ``start`` names .git (or, for a link, .gitmodules)."""
    component = raw[start:].split(b"/", 1)[0]
    ntfs = [0, *(i + 1 for i, byte in enumerate(component) if byte == 0x5C)]
    if any(_DOTGIT.match(component, i) for i in ntfs) or _hfs(component) == b".git":
        return True
    if not link:
        return False
    rest = raw[start:]
    return any(_DOTGITMODULES.match(rest, i) for i in ntfs) or _hfs(component) == b".gitmodules"


def _hfs(component: bytes) -> bytes:
    """``component`` as HFS+ compares it with ``.git``: ignorable code points dropped,
    ASCII letters lowered."""
    text = component.decode("utf-8", "surrogateescape").translate(_HFS_IGNORED)
    return text.encode("utf-8", "surrogateescape").lower()


def _content(root: Path, rel: str, entry: Entry | None, limit: int) -> bytes | None:
    if entry is None or entry.kind == "dir":
        return None
    if entry.kind == "link":
        return (entry.target or "").encode("utf-8", "surrogateescape")
    try:
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        raise _Unavailable(rel) from None
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise _Unavailable(rel)
    return data


def _parts(change: Change, old: bytes | None, new: bytes | None) -> list[_Part]:
    """One section, or two (delete, then add) when the path changed what it is."""
    old_mode, new_mode = _git_mode(change.before), _git_mode(change.after)
    retyped = old_mode and new_mode and old_mode[:3] != new_mode[:3]
    if change.status != "type_changed" and not retyped:
        return [_part(change, old, new)]
    parts = []
    if change.before is not None and change.before.kind != "dir":
        parts.append(_part(Change(change.path, "deleted", change.before, None), old, None))
    if change.after is not None and change.after.kind != "dir":
        parts.append(_part(Change(change.path, "added", None, change.after), None, new))
    return parts


def _mode_only(change: Change) -> bool:
    """A file whose git mode changed and whose bytes did not (as measured)."""
    return _same_bytes(change) and _git_mode(change.before) != _git_mode(change.after)


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


def _section(part: _Part, body: bytes) -> bytes:
    change, old, new = part.change, part.old, part.new
    old_mode, new_mode = _git_mode(change.before), _git_mode(change.after)
    head = [b"diff --git " + _name(b"a/", change.path) + b" " + _name(b"b/", change.path)]
    if old_mode is None:
        head.append(f"new file mode {new_mode}".encode())
    elif new_mode is None:
        head.append(f"deleted file mode {old_mode}".encode())
    elif old_mode != new_mode:
        head += [f"old mode {old_mode}".encode(), f"new mode {new_mode}".encode()]
    if old != new:
        index = f"index {_blob_sha1(old)}..{_blob_sha1(new)}"
        same_mode = old_mode if old_mode == new_mode else None
        head.append(f"{index} {same_mode}".encode() if same_mode else index.encode())
    return b"\n".join(head) + b"\n" + (body if old != new else b"")


def _text_body(part: _Part, hunks: bytes) -> bytes:
    path = part.change.path
    a = _name(b"a/", path) if part.old is not None else b"/dev/null"
    b = _name(b"b/", path) if part.new is not None else b"/dev/null"
    return b"--- " + a + b"\n+++ " + b + b"\n" + hunks


def _name(prefix: bytes, path: str) -> bytes:
    """``prefix`` + ``path`` as git writes a name: C-quoted when it holds a control
    character, a quote or a backslash (other bytes, UTF-8 or not, go as they are)."""
    raw = prefix + path.encode("utf-8", "surrogateescape")
    if not any(byte < 0x20 or byte in _QUOTED for byte in raw):
        return raw
    return b'"' + b"".join(map(_c_escape, raw)) + b'"'


def _c_escape(byte: int) -> bytes:
    if byte in _C_ESCAPES:
        return _C_ESCAPES[byte]
    return b"\\%03o" % byte if byte < 0x20 else bytes([byte])


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:8000]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _git_hunks(
    parts: Sequence[_Part], scratch: Path, *, timeout: float
) -> dict[int, bytes] | Reason:
    """One ``git diff --no-index`` over copies of every part's bytes (``a/<i>``,
    ``b/<i>``): the hunks of part ``i`` (from its first ``@@``), or why none."""
    run = Path(tempfile.mkdtemp(dir=scratch))
    try:
        for side in ("a", "b"):
            (run / side).mkdir()
        for index, part in enumerate(parts):
            (run / "a" / str(index)).write_bytes(part.old or b"")
            (run / "b" / str(index)).write_bytes(part.new or b"")
        # No repository around the scratch directory is looked for (its config would
        # apply to --no-index too).
        env = {**_GIT_ENV, "GIT_CEILING_DIRECTORIES": str(scratch)}
        done = subprocess.run(_GIT_DIFF, cwd=run, env=env, capture_output=True,
                              timeout=max(timeout, 0.001), check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "time_budget"
    except OSError:
        return "diff_failed"  # no git, or no room to copy
    finally:
        shutil.rmtree(run, ignore_errors=True)
    if done.returncode not in (0, 1):
        return "diff_failed"
    return _split(done.stdout)


def _split(output: bytes) -> dict[int, bytes]:
    """``git diff`` output by file: the index line and the hunks of ``a/a/<i>``. A file
    section starts at ``diff --git`` at a line start, which no hunk line can (each
    starts with `` ``, ``+``, ``-`` or ``\\``)."""
    found = {}
    for section in (b"\n" + output).split(b"\ndiff --git a/a/")[1:]:
        name, _, rest = section.partition(b" ")
        if name.isdigit():
            found[int(name)] = rest if rest.endswith(b"\n") else rest + b"\n"
    return found


def _checked(part: _Part, section: bytes | None) -> bytes | Reason:
    """The hunks of git's section for ``part``, once its index line shows that git diffed
    exactly ``part``'s bytes."""
    if section is None:
        return "diff_failed"
    want = f"\nindex {_blob_sha1(part.old or b'')}..{_blob_sha1(part.new or b'')} ".encode()
    start = section.find(b"\n@@ ")
    if want not in section or start < 0:
        return "diff_failed"
    return _text_body(part, section[start + 1 :])


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
