"""Bind sources an unprivileged bubblewrap can reach: a private mount namespace per sandbox.

When the worker is root, bubblewrap runs as an unprivileged host uid, which may not be
able to walk to the workspace, the pack closure (a cache under ``/root``, mode 0700) or
the shared ``/etc`` in the state directory. Passing them as ``--bind-fd`` descriptors does
not help with bubblewrap 0.8: it ``realpath()``s every bind source, ``/proc/self/fd/N``
included, and so walks the host path as that uid anyway.

So at ``create`` (once per job) the root worker opens each source (``O_PATH``), clones
each as a detached mount from its descriptor (``open_tree``: no path is walked again),
makes a private mount namespace on a thread of its own (``unshare``), attaches each clone
there onto an empty mount point under ``<stage>/`` (``move_mount``), a directory every uid
can traverse, and binds the namespace's file onto ``<stage>.mnt`` from its own namespace
(``setns`` back), which keeps the namespace alive; no process is spawned for it.
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
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

from worker.errors import SandboxError

_MNT_DETACH = 2
_CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
#: open_tree(2) and move_mount(2): the same numbers on x86_64 and arm64 (new syscalls
#: share one table), with the flags a detached clone of one mount needs.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 428, 429
_OPEN_TREE_FLAGS = 1 | 0x80000 | 0x1000  # OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH
_MOVE_EMPTY = 0x4  # MOVE_MOUNT_F_EMPTY_PATH
_AT_FDCWD = -100
#: An open source (``O_PATH``) and the mount point it is bound onto.
_Bind = tuple[int, Path]


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


async def create(stage: Path, sources: Mapping[str, Path]) -> None:
    """Stage each source at ``stage/<name>`` inside a new namespace bound to ``ns_file``.

    Raises:
        StageError: the namespace or a bind mount could not be made.
        OSError: a source could not be opened or a mount point made.
    """
    fds, pairs = _open_sources(stage, sources)
    try:
        await asyncio.to_thread(_in_own_thread, partial(_bind_in_new_ns, ns_file(stage), pairs))
    finally:
        for fd in fds:
            os.close(fd)


def _open_sources(stage: Path, sources: Mapping[str, Path]) -> tuple[list[int], list[_Bind]]:
    """Make the stage's mount points; return the open sources and what to bind where."""
    stage.mkdir(mode=0o755)
    ns_file(stage).touch(mode=0o600)
    fds: list[int] = []
    pairs: list[_Bind] = []
    try:
        for name, source in sources.items():
            fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
            fds.append(fd)
            _mount_point(stage / name, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
            pairs.append((fd, stage / name))
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


def _in_own_thread(work: Callable[[], None]) -> None:
    """Run ``work`` on a thread of its own, which ends with it: a thread that entered
    another mount namespace keeps its own root and working directory from then on
    (``unshare`` gives it its own), and no other work may ever run on it."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller, raised there
            failure.append(exc)

    thread = threading.Thread(target=run, name="acpw-stage", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _bind_in_new_ns(ns_path: Path, pairs: Sequence[_Bind]) -> None:
    """On this (own) thread: each source cloned as a detached mount (``open_tree``, from
    the descriptor itself: no path is walked again), a new private mount namespace, each
    clone attached there onto its mount point (``move_mount``), then back to the
    worker's namespace to bind the new one's file onto ``ns_path`` (what keeps it alive
    once this thread ends). What ``unshare --mount=FILE`` and a ``mount --bind`` per
    source did, without a process for each."""
    libc = _libc()
    trees: list[int] = []
    host = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for fd, _ in pairs:
            tree = libc.syscall(_SYS_OPEN_TREE, fd, b"", _OPEN_TREE_FLAGS)
            _call(0 if tree >= 0 else -1, "open_tree")
            trees.append(tree)
        _call(libc.unshare(_CLONE_NEWNS), "unshare")
        _call(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "private /")
        for tree, (_, target) in zip(trees, pairs, strict=True):
            where = os.fsencode(target)
            moved = libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, where, _MOVE_EMPTY)
            _call(moved, str(target))
        made = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _call(libc.setns(host, _CLONE_NEWNS), "setns")
            source = f"/proc/self/fd/{made}".encode()
            _call(libc.mount(source, os.fsencode(ns_path), None, _MS_BIND, None), str(ns_path))
        finally:
            os.close(made)
    finally:
        for fd in (host, *trees):
            os.close(fd)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    libc.syscall.restype = ctypes.c_long
    return libc


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise StageError(err, f"staging mounts failed: {what}: {os.strerror(err)}")


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
