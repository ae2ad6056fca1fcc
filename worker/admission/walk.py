"""Which directories a workspace's admission covers: from it up to its nearest Git root.

A level's ``.git`` makes it the Git root when it is a directory, a link to one, or a
gitfile (``gitdir: PATH``) whose target is a directory. A ``.git`` that cannot be judged
so (a gitfile pointing nowhere, a FIFO, unreadable) is not a root: the walk goes on above
it, which only widens what is checked, and a :class:`~worker.admission.result.Note`
names the marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

from worker.admission import probe
from worker.admission.probe import Kind
from worker.admission.result import Note
from worker.errors import WorkspaceUnavailable

#: Note codes (stable, like rule ids).
GIT_MARKER_DANGLING = "git.marker_dangling"
GIT_MARKER_INVALID = "git.marker_invalid"
GIT_MARKER_UNREADABLE = "git.marker_unreadable"
NOTE_CODES: frozenset[str] = frozenset(
    {GIT_MARKER_DANGLING, GIT_MARKER_INVALID, GIT_MARKER_UNREADABLE}
)

#: A gitfile is one short line; anything longer is not one.
MAX_GITFILE_BYTES = 4096
_GITFILE_PREFIX = "gitdir: "
_SHOWN = 200  # characters of a target a note repeats
_WENT_ON = "so it is not taken as the Git root and the walk went on above it."


def physical_workspace(workspace: Path) -> Path:
    """The workspace's physical path (the sandbox binds this, so it is what is checked).

    Raises :class:`~worker.errors.WorkspaceUnavailable` when it is missing or not a directory.
    """
    try:
        resolved = workspace.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python 3.11
        raise WorkspaceUnavailable(
            f"workspace {workspace} does not exist or cannot be resolved", workspace=str(workspace)
        ) from exc
    if not resolved.is_dir():
        raise WorkspaceUnavailable(
            f"workspace {workspace} is not a directory", workspace=str(workspace)
        )
    return resolved


def find_git_root(start: Path) -> Path | None:
    """Nearest of ``start`` and its ancestors whose ``.git`` marks a Git root."""
    return discover_git_root(start)[0]


def discover_git_root(start: Path) -> tuple[Path | None, tuple[Note, ...]]:
    """Nearest of ``start`` and its ancestors whose ``.git`` marks a Git root (module
    docstring), and a note for every ``.git`` passed over on the way."""
    notes: list[Note] = []
    for depth, level in enumerate((start, *start.parents)):
        display = "../" * depth + ".git"
        try:
            level_fd = probe.open_dir(level)
        except OSError as exc:
            notes.append(unreadable_marker(display, exc))
            continue
        try:
            is_root, note = judge_git_marker(level_fd, display, partial(_is_dir, level))
        finally:
            os.close(level_fd)
        notes += [note] if note is not None else []
        if is_root:
            return level, tuple(notes)
    return None, tuple(notes)


def judge_git_marker(
    level_fd: int, display: str, is_dir: Callable[[str], bool]
) -> tuple[bool, Note | None]:
    """Whether the ``.git`` in ``level_fd`` marks a Git root, and a note when it is
    there but cannot be taken as one. ``is_dir(target)``: whether ``target`` (absolute,
    or relative to the level) is a directory, links followed."""
    try:
        kind = probe.classify(level_fd, ".git")
    except OSError as exc:
        return False, unreadable_marker(display, exc)
    if kind in (Kind.MISSING, Kind.DIR):
        return kind is Kind.DIR, None
    pointer = _pointer(level_fd, display, kind)
    if isinstance(pointer, Note):
        return False, pointer
    what, target = pointer
    try:
        found = is_dir(target)
    except OSError:
        found = False
    if found:
        return True, None
    shown = target if len(target) <= _SHOWN else target[:_SHOWN] + "…"
    reason = f"{what} {shown!r}, which is not a directory here, {_WENT_ON}"
    return False, Note(display, GIT_MARKER_DANGLING, reason)


def _pointer(level_fd: int, display: str, kind: Kind) -> tuple[str, str] | Note:
    """What a ``.git`` that is not a directory points at, as (how, target), or why it
    points nowhere."""
    if kind is Kind.SYMLINK:
        try:
            return "Is a symbolic link to", os.readlink(".git", dir_fd=level_fd)
        except OSError as exc:
            return unreadable_marker(display, exc)
    if kind is not Kind.FILE:
        reason = f"Is {probe.kind_words(kind)}, not a Git directory or gitfile, {_WENT_ON}"
        return Note(display, GIT_MARKER_INVALID, reason)
    try:
        text = probe.read_bounded(level_fd, ".git", MAX_GITFILE_BYTES)
    except OSError as exc:
        return unreadable_marker(display, exc)
    line = text.decode("utf-8", "replace").partition("\n")[0].rstrip()
    target = line.removeprefix(_GITFILE_PREFIX)
    if target == line or not target:
        reason = f"Is a file but not a gitfile (no `{_GITFILE_PREFIX}PATH` line), {_WENT_ON}"
        return Note(display, GIT_MARKER_INVALID, reason)
    return "Is a gitfile pointing to", target


def _is_dir(level: Path, target: str) -> bool:
    return (level / target).is_dir()


def unreadable_marker(display: str, exc: OSError) -> Note:
    """A note for a ``.git`` (or its level) that cannot be examined."""
    reason = f"Cannot be examined ({exc.strerror or exc}), {_WENT_ON}"
    return Note(display, GIT_MARKER_UNREADABLE, reason)


def levels(workspace: Path, git_root: Path | None) -> tuple[Path, ...]:
    """The workspace, then each parent up to and including ``git_root``."""
    if git_root is None:
        return (workspace,)
    chain = (workspace, *workspace.parents)
    return chain[: chain.index(git_root) + 1]
