"""``WorkspaceFiles`` for a backend whose ``/workspace`` is a host directory bound in
(local's bubblewrap, a container engine on this host): the files are reached at the
staged host path.

After :func:`worker.sandbox.files.relative`, every existing component is ``lstat``-ed
walking down from the workspace's real root (no symbolic link), files are opened with
``O_NOFOLLOW``, and what is created gets the owner of the workspace root (the sandbox
user: the backend gave it the workspace before this is used). ``reachable``, when given,
is asked before each use: a backend that must prove the bind (the engine could run on
another host) answers it, and until it holds every path is refused
(``workspace_not_reachable``). Nothing here uploads anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from worker.admission import MaskEntry
from worker.events.artifacts import Verdict
from worker.sandbox.base import WORKSPACE
from worker.sandbox.files import PathRefused, relative


class HostWorkspaceFiles:
    """The agent's ``agent_root`` mapped onto ``host_root``, with the sandbox's masks."""

    def __init__(
        self,
        host_root: Path,
        *,
        masks: Sequence[MaskEntry] = (),
        agent_root: str = WORKSPACE,
        reachable: Callable[[], bool] | None = None,
    ) -> None:
        self.host_root = host_root
        self._masks = tuple(masks)
        self._agent_root = agent_root
        self._reachable = reachable

    def artifact(self, path: str) -> Verdict:
        """The verdict for a file the agent references (a regular file, no links)."""
        try:
            rel, host = self.host(path)
            info = os.lstat(host)
        except PathRefused as refused:
            return Verdict(reason=refused.reason)
        except OSError:
            return Verdict(reason="unreadable")
        if not stat.S_ISREG(info.st_mode):
            return Verdict(reason="not_regular_file")
        return Verdict(relative=rel, size=info.st_size)

    async def look_up(self, paths: Sequence[str]) -> None:
        """Nothing to do: :meth:`artifact` answers from the host at once."""
        del paths

    async def read_text(self, path: str, *, limit: int) -> str:
        """See :class:`worker.sandbox.files.WorkspaceFiles`."""
        return await asyncio.to_thread(self.read_text_now, path, limit=limit)

    async def write_text(self, path: str, content: str) -> None:
        """See :class:`worker.sandbox.files.WorkspaceFiles`."""
        await asyncio.to_thread(self.write_text_now, path, content)

    def host(self, path: str, *, must_exist: bool = True) -> tuple[str, Path]:
        """``(relative, host path)`` after walking every component without links.

        Raises:
            PathRefused: see :func:`worker.sandbox.files.relative`; ``symlink``;
                ``missing`` (when it must exist); ``workspace_not_reachable``.
        """
        rel = relative(path, masks=self._masks, agent_root=self._agent_root)
        if self._reachable is not None and not self._reachable():
            raise PathRefused("workspace_not_reachable")
        root = Path(os.path.realpath(self.host_root))
        current = root
        for part in [] if rel == "." else rel.split("/"):
            current = current / part
            try:
                info = os.lstat(current)
            except (FileNotFoundError, NotADirectoryError):
                if must_exist:
                    raise PathRefused("missing") from None
                return rel, root / rel  # the rest does not exist: no links
            if stat.S_ISLNK(info.st_mode):
                raise PathRefused("symlink")
        return rel, current

    def read_text_now(self, path: str, *, limit: int) -> str:
        """:meth:`read_text`, blocking."""
        _, host = self.host(path)
        fd = _open(host, os.O_RDONLY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen: it refuses a directory
            os.close(fd)
            raise PathRefused("not_regular_file")
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise PathRefused("too_large")
        return data.decode("utf-8", "replace")

    def write_text_now(self, path: str, content: str) -> None:
        """:meth:`write_text`, blocking: new files and folders get the owner of the
        workspace root (the sandbox user)."""
        rel, _ = self.host(path, must_exist=False)
        if rel == ".":
            raise PathRefused("not_regular_file")
        root = Path(os.path.realpath(self.host_root))
        owner = os.stat(root)
        *parents, name = rel.split("/")
        parent = _make_parents(root, parents, owner)
        fd = _open(parent / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with os.fdopen(fd, "wb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise PathRefused("not_regular_file")
            _chown(handle.fileno(), owner)
            handle.write(content.encode("utf-8"))


def _make_parents(root: Path, parts: list[str], owner: os.stat_result) -> Path:
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
