"""A size-bounded filesystem per job: the staged workspace lives on its own ext4.

The per-job tmpfs (HOME, /tmp) are bounded by size and by the memory cgroup; the
workspace is on host disk. Without a bound an agent could fill the worker's disk, so
each job gets a sparse image file of ``limits.disk_mb`` in its work directory, formatted
ext4 and loop-mounted (``nodev,nosuid``) at ``<job_dir>/disk``; the workspace is staged
into ``<job_dir>/disk/workspace`` (``lost+found`` stays outside it). A write past the
bound fails with ENOSPC inside the sandbox, and the host's disk holds at most the image.

The image is sparse and made without a journal (it never outlives its job, so there is
nothing to recover) and without reserved blocks (the agent is not root), with lazy
inode-table initialisation: making and mounting a 10 GiB disk takes tens of
milliseconds and a few MiB (``benchmarks/workspace_disk.py``).

Both backends see it: bubblewrap binds the workspace directory (and a root worker's
staging namespace bind-mounts it), Podman binds the same host path, all from this mount
namespace. ``mount -o loop`` sets the loop device to clear itself when the filesystem
is finally released, so unmounting (:func:`unmount_below`, which every removal of a job
directory calls, the reaper's included) frees the device too. A mount namespace made
while the disk was mounted (another job's staging namespace) keeps a reference until
that namespace ends; the image's blocks are then freed with it.

Loop devices need root and ``/dev/loop-control``: without them :func:`mount_bounded`
refuses with a :class:`~worker.errors.SandboxError` (``ACPW_WORKSPACE_DISK=off`` runs
without the bound instead).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from worker.errors import SandboxError
from worker.mountinfo import read_mountinfo

IMAGE = "disk.img"
MOUNT = "disk"
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
LOOP_CONTROL = Path("/dev/loop-control")
# noinit_itable: the kernel would otherwise zero the lazily made inode tables in the
# background, I/O for a filesystem that lives one job.
MOUNT_OPTIONS = "loop,nodev,nosuid,noatime,noinit_itable"
_MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E",
                 "lazy_itable_init=1,nodiscard", "-L", "acpw-workspace")  # fmt: skip
_TOOL_TIMEOUT_S = 120.0
_MNT_DETACH = 2


@dataclass(frozen=True, slots=True)
class BoundedDisk:
    """A job's mounted workspace filesystem."""

    image: Path
    mount: Path
    size_bytes: int


def tool(name: str) -> str:
    """Absolute path of a system tool, looked up in the system directories only.

    Raises:
        SandboxError: the tool is not installed.
    """
    found = shutil.which(name, path=TOOL_PATH)
    if found is None:
        raise SandboxError(
            f"bounded workspace disks need {name} (e2fsprogs/util-linux), which is not "
            "installed; install it or set ACPW_WORKSPACE_DISK=off",
            reason="disk_unavailable",
            tool=name,
        )
    return found


def check_available() -> None:
    """Refuse early where loop mounts cannot work (not root, no loop-control).

    Raises:
        SandboxError: reason ``disk_unavailable``.
    """
    if os.geteuid() != 0 or not LOOP_CONTROL.exists():
        raise SandboxError(
            "bounded workspace disks need a root worker with loop devices "
            f"({LOOP_CONTROL}); run as root or set ACPW_WORKSPACE_DISK=off",
            reason="disk_unavailable",
            euid=os.geteuid(),
        )


def mount_bounded(job_dir: Path, *, size_mb: int) -> BoundedDisk:
    """Make and mount a ``size_mb`` MiB ext4 at ``job_dir/disk`` (an empty directory).

    On failure nothing stays mounted; the image may remain for the job directory's removal.

    Raises:
        SandboxError: reason ``disk_unavailable`` (no root, loop devices or tools) or
            ``disk_failed`` (mkfs or mount failed, e.g. no free loop device).
    """
    check_available()
    mkfs, mount = tool("mkfs.ext4"), tool("mount")
    image, target = job_dir / IMAGE, job_dir / MOUNT
    size = size_mb * 1024 * 1024
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: blocks are allocated as the agent writes
        finally:
            os.close(fd)
        target.mkdir(mode=0o755)
    except OSError as exc:
        raise SandboxError(
            f"cannot make the workspace disk image: {exc.strerror}",
            reason="disk_failed",
            path=str(image),
        ) from exc
    _run([mkfs, *_MKFS_OPTIONS, str(image)], "mkfs.ext4")
    _run([mount, "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(target)], "mount")
    return BoundedDisk(image=image, mount=target, size_bytes=size)


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_TOOL_TIMEOUT_S,
            env={"PATH": TOOL_PATH, "LC_ALL": "C"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{what} failed: {exc}", reason="disk_failed") from exc
    if done.returncode != 0:
        stderr = done.stderr.decode(errors="replace").strip()[-500:]
        raise SandboxError(
            f"{what} failed for the workspace disk: {stderr or done.returncode}",
            reason="disk_failed",
            returncode=done.returncode,
        )


def mounts_below(root: Path) -> list[Path]:
    """Mount points at or below ``root`` in this mount namespace, deepest first."""
    base = os.path.realpath(root)
    found = {
        Path(m.point)
        for m in read_mountinfo()
        if m.point == base or m.point.startswith(base.rstrip("/") + "/")
    }
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_below(root: Path) -> list[Path]:
    """Unmount everything at or below ``root``, deepest first; a busy mount is detached
    (it disappears now and is released when its last user goes). Returns what was
    unmounted; nothing mounted is fine.

    Raises:
        OSError: a mount could not be unmounted at all (e.g. not root).
    """
    points = mounts_below(root)
    if not points:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    for point in points:
        _umount(libc, point)
    return points


def _umount(libc: ctypes.CDLL, point: Path) -> None:
    path = os.fsencode(point)
    if libc.umount2(path, 0) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EBUSY and libc.umount2(path, _MNT_DETACH) == 0:
        return
    err = ctypes.get_errno() if err == errno.EBUSY else err
    if err not in (errno.EINVAL, errno.ENOENT):  # EINVAL: no longer a mount point
        raise OSError(err, f"cannot unmount the workspace disk: {os.strerror(err)}", str(point))
