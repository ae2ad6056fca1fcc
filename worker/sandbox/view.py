"""Admission in a container's own mount view, looked at from the host.

A started container's root is visible to a root worker on the same host as
``/proc/<pid>/root`` (``pid``: any process in it, e.g. the engine's ``State.Pid``):
lookups through it cross the container's mounts — the workspace bind, the masks — as
the container sees them. :func:`container_admission` runs
:func:`worker.admission.check_view` there and then applies the local backend's rule for
masks: a finding at a masked path is dropped while the host entry is the kind the mask is
mounted over and the view really shows the mask (``/dev/null`` over a file, a mount of
its own over a directory). A symlink, a wrong kind or a mask that did not take effect is
still reported.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from worker.admission import AdmissionResult, Finding, MaskEntry, MaskKind, check_view
from worker.admission.probe import open_dir, open_dir_in_root
from worker.errors import SandboxError
from worker.sandbox import mountpoints
from worker.sandbox.base import WORKSPACE


def container_admission(
    pid: int, *, host_workspace: Path, masks: Sequence[MaskEntry], provider: str
) -> AdmissionResult:
    """The admission check as the container whose process ``pid`` is sees ``/workspace``.

    Raises:
        SandboxError: no such process here, or its ``/workspace`` is not ``host_workspace``
            (the engine runs on another host or in another pid namespace, so this host
            cannot see the container's view).
        WorkspaceUnavailable: the view has no workspace directory.
    """
    root = check_same_workspace(pid, host_workspace)
    result = check_view(root, workspace=WORKSPACE, provider=provider)
    kept = tuple(f for f in result.findings if not _covered(f, masks, root, host_workspace))
    return replace(result, findings=kept)


def _covered(
    finding: Finding, masks: Sequence[MaskEntry], root: Path, host_workspace: Path
) -> bool:
    entry = mountpoints.covering(masks, finding.path)
    if entry is None:
        return False
    return mountpoints.in_place(host_workspace, entry) and _shows_mask(root, entry)


def check_same_workspace(pid: int, host_workspace: Path) -> Path:
    """The container's root as this host sees it (``/proc/<pid>/root``), once its
    ``/workspace`` is proven to be ``host_workspace`` itself (same device and inode).

    Raises:
        SandboxError: no such process here, or its ``/workspace`` is another directory.
    """
    root = Path(f"/proc/{pid}/root")
    if pid <= 0:
        raise SandboxError("the engine reported no host pid for the container", pid=pid)
    try:
        host = os.stat(host_workspace)
        root_fd = open_dir(root)
    except OSError as exc:
        raise SandboxError(
            f"the container's mount view is not visible from this host ({exc.strerror})",
            root=str(root),
        ) from exc
    try:
        fd = open_dir_in_root(root_fd, WORKSPACE)
        inside = os.fstat(fd)
        os.close(fd)
    except OSError:
        inside = None
    finally:
        os.close(root_fd)
    if inside is None or (inside.st_dev, inside.st_ino) != (host.st_dev, host.st_ino):
        raise SandboxError(
            "the container's /workspace is not the job's workspace as seen from this host: "
            "the engine must run on this host, in its pid namespace",
            root=str(root),
            workspace=str(host_workspace),
        )
    return root


def _shows_mask(root: Path, entry: MaskEntry) -> bool:
    """True if the view shows the mask itself at ``entry``'s path: ``/dev/null`` for a
    file; for a directory, an empty one that is a mount of its own (an engine that copied
    the host directory's content into it has not masked anything)."""
    rel = PurePosixPath(WORKSPACE) / entry.path
    try:
        root_fd = open_dir(root)
        try:
            parent = open_dir_in_root(root_fd, str(rel.parent))
        finally:
            os.close(root_fd)
        try:
            if entry.kind is MaskKind.FILE:
                found = os.stat(rel.name, dir_fd=parent, follow_symlinks=False)
                return stat.S_ISCHR(found.st_mode) and found.st_rdev == os.stat("/dev/null").st_rdev
            return _empty_mount(parent, rel.name)
        finally:
            os.close(parent)
    except OSError:
        return False


def _empty_mount(parent: int, name: str) -> bool:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        return os.fstat(fd).st_dev != os.fstat(parent).st_dev and not os.listdir(fd)
    finally:
        os.close(fd)
