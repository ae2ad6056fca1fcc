"""Staging a local workspace: a private per-job copy the sandbox may write.

The original directory is never mounted into the sandbox: the agent works on a copy owned
by the sandbox's host uid (so an agent never writes as host root and never touches the
caller's files behind its back). Links are copied as links, never followed; sockets,
FIFOs and devices are not copied and are reported.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from worker.errors import WorkspaceUnavailable


@dataclass(frozen=True, slots=True)
class StagedWorkspace:
    path: Path
    files: int
    bytes: int
    skipped: tuple[str, ...]


def stage_local(source: Path, dest: Path, *, owner: tuple[int, int]) -> StagedWorkspace:
    """Copy ``source`` into the new directory ``dest``, owned by ``owner`` (uid, gid).

    Raises:
        WorkspaceUnavailable: ``source`` is not a readable directory, or copying failed.
    """
    try:
        if not stat.S_ISDIR(os.stat(source).st_mode):
            raise WorkspaceUnavailable(f"workspace {source} is not a directory", path=str(source))
        dest.mkdir(mode=0o755, parents=False)
        copier = _Copier(owner)
        copier.directory(source, dest, "")
    except OSError as exc:
        raise WorkspaceUnavailable(
            f"cannot stage workspace {source}: {exc.strerror}", path=str(source)
        ) from exc
    return StagedWorkspace(dest, copier.files, copier.bytes, tuple(copier.skipped))


class _Copier:
    def __init__(self, owner: tuple[int, int]) -> None:
        self.uid, self.gid = owner
        self.files = 0
        self.bytes = 0
        self.skipped: list[str] = []

    def directory(self, src: Path, dst: Path, rel: str) -> None:
        os.chown(dst, self.uid, self.gid)
        with os.scandir(src) as entries:
            for entry in entries:
                self.entry(entry, dst / entry.name, f"{rel}{entry.name}")
        shutil.copystat(src, dst, follow_symlinks=False)

    def entry(self, entry: os.DirEntry[str], dst: Path, rel: str) -> None:
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            dst.mkdir(mode=0o755)
            self.directory(Path(entry.path), dst, rel + "/")
        elif stat.S_ISREG(info.st_mode):
            shutil.copy2(entry.path, dst, follow_symlinks=False)
            os.chmod(dst, info.st_mode & 0o777)  # set-id bits are not carried over
            os.chown(dst, self.uid, self.gid)
            self.files += 1
            self.bytes += info.st_size
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(entry.path), dst)
            os.chown(dst, self.uid, self.gid, follow_symlinks=False)
        else:
            self.skipped.append(rel)


def remove_staged(path: Path) -> None:
    """Delete a staged copy (whatever the agent left in it); missing is fine."""
    if path.exists():
        _make_writable(path)
        shutil.rmtree(path, ignore_errors=False)


def _make_writable(root: Path) -> None:
    # The agent may have left read-only directories behind; rmtree needs to enter them.
    for current, dirs, _ in os.walk(root, followlinks=False):
        for name in dirs:
            target = Path(current, name)
            if not target.is_symlink():
                target.chmod(0o755)
