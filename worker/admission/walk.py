"""Which directories a workspace's admission covers: from it up to its nearest Git root."""

from __future__ import annotations

import os
from pathlib import Path

from worker.errors import WorkspaceUnavailable


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
    """Nearest of ``start`` and its ancestors holding an entry named ``.git``.

    Any kind of entry counts (a directory, a gitfile of a worktree or submodule). A level
    whose ``.git`` cannot be examined is passed over, which only widens the walk.
    """
    for level in (start, *start.parents):
        try:
            os.stat(level / ".git", follow_symlinks=False)
        except OSError:
            continue
        return level
    return None


def levels(workspace: Path, git_root: Path | None) -> tuple[Path, ...]:
    """The workspace, then each parent up to and including ``git_root``."""
    if git_root is None:
        return (workspace,)
    chain = (workspace, *workspace.parents)
    return chain[: chain.index(git_root) + 1]
