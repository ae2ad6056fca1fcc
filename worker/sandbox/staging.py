"""Bind sources an unprivileged bubblewrap can reach: a private mount namespace per sandbox.

When the worker is root, bubblewrap runs as an unprivileged host uid, which may not be
able to walk to the workspace, the pack closure (a cache under ``/root``, mode 0700) or
the shared ``/etc`` in the state directory. Passing them as ``--bind-fd`` descriptors does
not help with bubblewrap 0.8: it ``realpath()``s every bind source, ``/proc/self/fd/N``
included, and so walks the host path as that uid anyway.

So at ``create`` (once per job) the root worker opens each source (``O_PATH``), makes a
persistent private mount namespace bound to ``<stage>.mnt`` (``unshare --mount=FILE``),
and inside it bind-mounts each descriptor (``/proc/self/fd/N``) onto an empty mount point
under ``<stage>/``, a directory every uid can traverse.
Each spawn enters that namespace (``nsenter``) before dropping to the unprivileged uid,
and bubblewrap binds from the staged paths. The staged mounts exist only inside that
namespace: the host's mount table holds just the namespace file, and nothing on the host
(an ``rm -rf`` of the stage directory included) can reach the workspace through them.
``remove`` detaches the namespace file, which frees the namespace and every mount in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.errors import SandboxError

_MNT_DETACH = 2
# Binds each (fd, target) pair given as arguments. mount(8) resolves /proc/self/fd/N as
# root, to the object the worker opened (`-c` would skip that and fails on O_PATH fds).
_BIND_ALL = 'while [ "$#" -gt 0 ]; do mount --bind "/proc/self/fd/$1" "$2" || exit 1; shift 2; done'


class StageError(SandboxError, OSError):
    """The staging namespace could not be made (message carries the tool's stderr); an
    ``OSError`` too, as what it stands for is the OS refusing a mount."""

    code = "stage_failed"

    def __init__(self, errno_: int, message: str) -> None:
        SandboxError.__init__(self, message, errno=errno_)
        self.errno = errno_
        self.strerror = message


def ns_file(stage: Path) -> Path:
    """The file the stage's mount namespace is bound to."""
    return stage.with_name(f"{stage.name}.mnt")


def prepare_root(stage_dir: Path) -> None:
    """``stage_dir`` and its parents we make: traversable (0711), not listable."""
    stage_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    os.chmod(stage_dir, 0o711)  # noqa: S103 - traverse-only is the point: no read, no write


async def create(stage: Path, sources: Mapping[str, Path], tools: Mapping[str, str]) -> None:
    """Stage each source at ``stage/<name>`` inside a new namespace bound to ``ns_file``.

    ``tools``: absolute paths of ``unshare`` and ``mount``'s shell (``sh``).

    Raises:
        StageError: unshare or a bind mount failed.
        OSError: a source could not be opened or a mount point made.
    """
    fds, pairs = _open_sources(stage, sources)
    try:
        await _bind_in_new_ns(stage, pairs, fds, tools)
    finally:
        for fd in fds:
            os.close(fd)


def _open_sources(stage: Path, sources: Mapping[str, Path]) -> tuple[list[int], list[str]]:
    """Make the stage's mount points; return the open sources and ``fd target`` pairs."""
    stage.mkdir(mode=0o755)
    ns_file(stage).touch(mode=0o600)
    fds: list[int] = []
    pairs: list[str] = []
    try:
        for name, source in sources.items():
            fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
            fds.append(fd)
            _mount_point(stage / name, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
            pairs += [str(fd), str(stage / name)]
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds, pairs


def _mount_point(path: Path, *, is_dir: bool) -> None:
    if is_dir:
        path.mkdir(mode=0o755)
    else:
        path.touch(mode=0o644)


async def _bind_in_new_ns(
    stage: Path, pairs: Sequence[str], fds: Sequence[int], tools: Mapping[str, str]
) -> None:
    argv = [tools["unshare"], f"--mount={ns_file(stage)}", "--propagation", "private"]
    argv += [tools["sh"], "-c", _BIND_ALL, "acpw-stage", *pairs]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        pass_fds=tuple(fds),
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise StageError(errno.EIO, f"staging mounts failed: {err.decode(errors='replace')}")


def remove(stage: Path, names: Sequence[str]) -> None:
    """Detach the namespace (freeing its mounts), then remove the stage's own entries.

    Only the known entries are removed, never recursively: if the detach failed, a mount
    point still showing a source must not be emptied. Idempotent.
    """
    _detach(ns_file(stage))
    with contextlib.suppress(FileNotFoundError):
        ns_file(stage).unlink()
    for name in names:
        entry = stage / name
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir() and not entry.is_symlink():
                entry.rmdir()
            else:
                entry.unlink()
    with contextlib.suppress(FileNotFoundError):
        stage.rmdir()


def _detach(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not (or no longer) mounted
            raise OSError(err, os.strerror(err), str(path))
