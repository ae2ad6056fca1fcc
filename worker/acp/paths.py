"""The agent's paths, checked against the HOST copy of the job's workspace.

The agent sees the workspace as ``/workspace``; the worker reaches the same files at the
staged host path. Every agent path is admitted only when it names something strictly
inside the workspace: absolute paths must lie under the agent root, no component may be
``..`` (traversal is refused even when it would land inside), and no existing component
may be a symbolic link (checked with ``lstat`` walking down from the real workspace
root, and files are opened with ``O_NOFOLLOW``). Nothing here uploads anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

from worker.events.artifacts import Verdict


class PathRefused(Exception):
    """An agent path that is not admitted; ``reason`` is a stable word."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class WorkspacePaths:
    """Maps ``agent_root``-relative agent paths onto ``host_root``."""

    host_root: Path
    agent_root: str = "/workspace"

    def relative(self, path: str) -> str:
        """The workspace-relative form of an agent path.

        Raises:
            PathRefused: outside the workspace, traversal, or empty.
        """
        if "\x00" in path or not path:
            raise PathRefused("invalid_path")
        parts = path.split("/")
        if ".." in parts:
            raise PathRefused("traversal")
        if path.startswith("/"):
            normalized = posixpath.normpath(path)
            root = self.agent_root.rstrip("/")
            if normalized == root:
                return "."
            if not normalized.startswith(root + "/"):
                raise PathRefused("outside_workspace")
            return normalized[len(root) + 1 :]
        return posixpath.normpath(path)

    def host(self, path: str, *, must_exist: bool = True) -> tuple[str, Path]:
        """``(relative, host path)`` after walking every component without links.

        Raises:
            PathRefused: see :meth:`relative`; ``symlink``; ``missing`` (when it must exist).
        """
        relative = self.relative(path)
        root = Path(os.path.realpath(self.host_root))
        current = root
        for part in [] if relative == "." else relative.split("/"):
            current = current / part
            try:
                info = os.lstat(current)
            except (FileNotFoundError, NotADirectoryError):
                if must_exist:
                    raise PathRefused("missing") from None
                return relative, root / relative  # the rest does not exist: no links
            if stat.S_ISLNK(info.st_mode):
                raise PathRefused("symlink")
        return relative, current

    def artifact(self, path: str) -> Verdict:
        """The verdict for a file the agent references (a regular file, no links)."""
        try:
            relative, host = self.host(path)
            info = os.lstat(host)
        except PathRefused as refused:
            return Verdict(reason=refused.reason)
        except OSError:
            return Verdict(reason="unreadable")
        if not stat.S_ISREG(info.st_mode):
            return Verdict(reason="not_regular_file")
        return Verdict(relative=relative, size=info.st_size)

    def read_text(self, path: str, *, limit: int) -> str:
        """The file's text (UTF-8, replacement for bad bytes).

        Raises:
            PathRefused: not admitted, not a regular file, or over ``limit`` bytes.
        """
        _, host = self.host(path)
        fd = _open(host, os.O_RDONLY)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise PathRefused("not_regular_file")
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise PathRefused("too_large")
        return data.decode("utf-8", "replace")

    def write_text(self, path: str, content: str) -> None:
        """Create or replace a file, creating missing folders inside the workspace.

        New files and folders get the owner of the workspace root (the sandbox user).

        Raises:
            PathRefused: not admitted, or the target is not a regular file.
        """
        relative, _ = self.host(path, must_exist=False)
        if relative == ".":
            raise PathRefused("not_regular_file")
        root = Path(os.path.realpath(self.host_root))
        owner = os.stat(root)
        parent = self._make_parents(root, relative.split("/")[:-1], owner)
        fd = _open(parent / relative.split("/")[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "wb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise PathRefused("not_regular_file")
            _chown(handle.fileno(), owner)
            handle.write(content.encode("utf-8"))

    def _make_parents(self, root: Path, parts: list[str], owner: os.stat_result) -> Path:
        current = root
        for part in parts:
            current = current / part
            try:
                os.mkdir(current, 0o755)
                os.chown(current, owner.st_uid, owner.st_gid, follow_symlinks=False)
            except FileExistsError:
                pass
            except PermissionError:
                raise PathRefused("not_writable") from None
            if stat.S_ISLNK(os.lstat(current).st_mode):
                raise PathRefused("symlink")
        return current


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused("symlink") from None
        if exc.errno == errno.ENOENT:
            raise PathRefused("missing") from None
        if exc.errno in (errno.EISDIR, errno.ENOTDIR):
            raise PathRefused("not_regular_file") from None
        raise PathRefused("unreadable") from None


def _chown(fd: int, owner: os.stat_result) -> None:
    # Not root: the file already belongs to the user the sandbox runs as.
    with contextlib.suppress(PermissionError):
        os.fchown(fd, owner.st_uid, owner.st_gid)
