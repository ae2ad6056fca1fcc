"""A size-bounded filesystem per job: the staged workspace lives on its own ext4.

The per-job tmpfs (HOME, /tmp) are bounded by size and by the memory cgroup; the
workspace is on host disk. Without a bound an agent could fill the worker's disk, so
each job gets a sparse image file of ``limits.disk_mb`` in its work directory, formatted
ext4 and loop-mounted (``nodev,nosuid``) at ``<job_dir>/disk``; the workspace is staged
into ``<job_dir>/disk/workspace`` (``lost+found`` stays outside it). A write past the
bound fails with ENOSPC inside the sandbox, and the host's disk holds at most the image.

The image is sparse and made without a journal (it never outlives its job, so there is
nothing to recover), without reserved blocks (the agent is not root), without the
blocks reserved for growing it (``resize_inode``: it is never resized), with two backup
superblocks at most (``sparse_super2``) and lazy inode-table initialisation: a 10 GiB
disk holds about 160 KiB of metadata (4.3 MiB with the first two). It is
formatted once per size, as a template under the worker's cache that is never mounted
(:func:`template`); each job's image is a sparse copy of it, which the kernel makes in a
few milliseconds where ``mkfs`` took 10-40 (``benchmarks/workspace_disk.py``).

Both backends see it: bubblewrap binds the workspace directory (and a root worker's
staging namespace bind-mounts it), Podman binds the same host path, all from this mount
namespace. The worker binds the image to a free loop device itself (``LOOP_CONFIGURE``;
``mount(8)`` on kernels before 5.8) and sets it, as ``mount -o loop`` does, to clear
itself when the filesystem is finally released, so unmounting (:func:`unmount_below`,
which every removal of a job directory calls, the reaper's included) frees the device.
A mount namespace made while the disk was mounted (another job's staging namespace)
keeps a reference until that namespace ends; the image's blocks are then freed with it.

Loop devices need root and ``/dev/loop-control``: without them :func:`mount_bounded`
refuses with a :class:`~worker.errors.SandboxError` (``ACPW_WORKSPACE_DISK=off`` runs
without the bound instead).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import struct
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
_MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode,sparse_super2",
                 "-E", "lazy_itable_init=1,nodiscard", "-L", "acpw-workspace")  # fmt: skip
_TOOL_TIMEOUT_S = 120.0
# linux/loop.h and linux/mount.h
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_MS_NOSUID, _MS_NODEV, _MS_NOATIME = 2, 4, 1024
_LOOP_TRIES = 8
_CHUNK = 1 << 20
#: A digest of how templates are formatted (``_MKFS_OPTIONS``), part of their name.
_FORMAT = hashlib.sha256("\0".join(_MKFS_OPTIONS).encode()).hexdigest()[:12]
#: What ``mount(2)`` answers for an image that is no ext4 it can mount (bad superblock,
#: corrupted metadata, an I/O error reading it).
_NOT_A_FILESYSTEM = frozenset({errno.EINVAL, errno.EUCLEAN, errno.EIO})
#: The directory under the worker's cache where the disk templates are (``template``).
TEMPLATES = "disks"
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


def mount_bounded(job_dir: Path, *, size_mb: int, templates: Path | None = None) -> BoundedDisk:
    """Make and mount a ``size_mb`` MiB ext4 at ``job_dir/disk`` (an empty directory).

    With ``templates`` (a directory of the worker's cache) the image is a sparse copy of
    a filesystem formatted there once per size (:func:`template`): a few MiB of metadata
    copied in the kernel instead of ``mkfs`` each time. On failure nothing stays
    mounted; the image may remain for the job directory's removal.

    Raises:
        SandboxError: reason ``disk_unavailable`` (no root, loop devices or tools) or
            ``disk_failed`` (mkfs or mount failed, e.g. no free loop device).
    """
    check_available()
    mount = tool("mount")
    image, target = job_dir / IMAGE, job_dir / MOUNT
    size = size_mb * 1024 * 1024
    try:
        if templates is None:
            _sparse(image, size)
        target.mkdir(mode=0o755)
    except OSError as exc:
        raise _failed("cannot make the workspace disk image", exc, path=str(image)) from exc
    source = None
    if templates is None:
        _run([tool("mkfs.ext4"), *_MKFS_OPTIONS, str(image)], "mkfs.ext4")
    else:
        source = _copy_template(templates, size_mb, image)
    try:
        mounted = _loop_mount(image, target)
    except SandboxError as exc:
        if source is None or exc.details.get("errno") not in _NOT_A_FILESYSTEM:
            raise
        raise _damaged(source, exc) from exc
    if not mounted:
        _run([mount, "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(target)], "mount")
    return BoundedDisk(image=image, mount=target, size_bytes=size)


def _copy_template(templates: Path, size_mb: int, image: Path) -> Path:
    """Copy the ``size_mb`` template (made if missing) into ``image``; the template.

    Looked up once more when it vanished between the lookup and the copy (a worker of
    another format removed it as stale, ``template``): the second lookup makes it again.

    Raises:
        SandboxError: reason ``disk_failed``.
    """
    source = template(templates, size_mb)
    try:
        _copy_sparse(source, image)
    except SandboxError as exc:
        if exc.details.get("errno") != errno.ENOENT:
            raise
        image.unlink(missing_ok=True)
        source = template(templates, size_mb)
        _copy_sparse(source, image)
    return source


def _damaged(source: Path, exc: SandboxError) -> SandboxError:
    """A copy of ``source`` is no filesystem the kernel mounts: the template is damaged
    (on the cache's disk, or by hand). It is removed, so the next disk formats a fresh
    one instead of every job of its size failing the same way."""
    with contextlib.suppress(OSError):
        source.unlink()
    return SandboxError(
        f"the workspace disk template {source} does not mount ({exc.message}): removed, "
        "the next disk of its size formats a new one",
        reason="disk_failed",
        template=str(source),
        errno=exc.details.get("errno"),
    )


def _loop_mount(image: Path, target: Path) -> bool:
    """Mount ``image`` at ``target`` as ``mount -o loop`` does (a free loop device set to
    clear itself once released, ``LOOP_CONFIGURE``), without a process for it; False
    where the kernel has no ``LOOP_CONFIGURE`` (before 5.8): ``mount(8)`` then.

    Raises:
        SandboxError: reason ``disk_failed``.
    """
    try:
        backing = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _failed("cannot open the workspace disk", exc, path=str(image)) from exc
    try:
        for _ in range(_LOOP_TRIES):
            loop = _configured_loop(backing, image)
            if loop is _UNSUPPORTED:
                return False
            if loop is not None:  # else another process took that device first
                device, fd = loop
                try:
                    _mount_loop(device, target)
                finally:
                    os.close(fd)  # the mount holds the device now, or it clears itself
                return True
    finally:
        os.close(backing)
    raise SandboxError("no free loop device for the workspace disk", reason="disk_failed")


def _mount_loop(device: str, target: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOATIME
    if libc.mount(device.encode(), os.fsencode(target), b"ext4", flags, b"noinit_itable"):
        err = ctypes.get_errno()
        raise SandboxError(
            f"mount failed for the workspace disk: {os.strerror(err)}",
            reason="disk_failed",
            errno=err,
        )


#: What ``_configured_loop`` answers where the kernel cannot configure a loop device in
#: one call.
_UNSUPPORTED = ("", -1)


def _configured_loop(backing: int, image: Path) -> tuple[str, int] | None:
    """A free loop device bound to ``backing`` (autoclear) and its open descriptor;
    None when another process took it first; ``_UNSUPPORTED`` without
    ``LOOP_CONFIGURE``.

    Raises:
        SandboxError: reason ``disk_failed``.
    """
    try:
        control = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
        try:
            number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
        finally:
            os.close(control)
        device = f"/dev/loop{number}"
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise _failed("no loop device for the workspace disk", exc) from exc
    name = os.fsencode(image)[-63:]
    info = struct.pack(
        "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0
    )
    try:
        fcntl.ioctl(fd, _LOOP_CONFIGURE, struct.pack("=II", backing, 0) + info + bytes(64))
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.EBUSY:
            return None
        if exc.errno in (errno.ENOTTY, errno.EINVAL):
            return _UNSUPPORTED
        raise _failed("cannot set up the workspace disk's loop device", exc) from exc
    return device, fd


def template(directory: Path, size_mb: int) -> Path:
    """The formatted, never mounted ``size_mb`` MiB image in ``directory`` (root's,
    0700) that workspace disks are copied from: made once (``mkfs`` into a temporary
    name, synced, then renamed into place, so a reader never sees half of one), read
    only from then on.

    Raises:
        SandboxError: reason ``disk_failed`` (it could not be made).
    """
    # Named by its format too: a worker that formats differently never copies an old one.
    path = directory / f"ext4-{size_mb}m-{_FORMAT}.img"
    if path.is_file():
        return path
    part = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sparse(part, size_mb * 1024 * 1024)
        _run([tool("mkfs.ext4"), *_MKFS_OPTIONS, str(part)], "mkfs.ext4")
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        part.chmod(0o400)
        os.replace(part, path)  # another process's identical one may be replaced: fine
    except OSError as exc:
        raise _failed("cannot make the workspace disk template", exc, path=str(path)) from exc
    finally:
        part.unlink(missing_ok=True)
    _remove_stale(directory)
    return path


def _remove_stale(directory: Path) -> None:
    """Remove the templates of other formats (an older worker's; about 4 MiB each on
    disk): this worker never copies them. A copy being made from one keeps reading it
    through its descriptor; a worker of that format that still runs makes its own
    again when it next needs it (``_copy_template``)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            name = entry.name
            if name.startswith("ext4-") and name.endswith(".img") and f"-{_FORMAT}." not in name:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _sparse(image: Path, size: int) -> None:
    """A new sparse file of ``size`` bytes: blocks are allocated as they are written."""
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _copy_range(src: int, dst: int, at: int, left: int) -> None:
    """``left`` bytes at ``at`` from ``src`` to the same offset of ``dst``: in the kernel,
    or read and written where it cannot (the cache and the work directory on two
    filesystems)."""
    while left > 0:
        try:
            copied = os.copy_file_range(src, dst, min(left, _CHUNK), at, at)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            copied = os.pwrite(dst, os.pread(src, min(left, _CHUNK), at), at)
        if copied <= 0:
            raise OSError(errno.EIO, "the template ended early")
        at, left = at + copied, left - copied


def _copy_sparse(source: Path, image: Path) -> None:
    """``source``'s data extents copied into a new sparse ``image`` of its size (in the
    kernel, holes left holes). Not synced: the loop device reads the image through the
    page cache, and an image unlinked before writeback never reaches the disk at all.

    Raises:
        SandboxError: reason ``disk_failed``.
    """
    try:
        with contextlib.ExitStack() as fds:
            src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
            fds.callback(os.close, src)
            size = os.fstat(src).st_size
            _sparse(image, size)
            dst = os.open(image, os.O_WRONLY | os.O_NOFOLLOW)
            fds.callback(os.close, dst)
            offset = 0
            while offset < size:
                try:
                    start = os.lseek(src, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                offset = os.lseek(src, start, os.SEEK_HOLE)
                _copy_range(src, dst, start, offset - start)
    except OSError as exc:
        raise _failed(
            "cannot copy the workspace disk template", exc, path=str(image), errno=exc.errno
        ) from exc


def _failed(what: str, exc: OSError, **details: object) -> SandboxError:
    """A ``disk_failed`` error for the OS error ``exc`` met doing ``what``."""
    return SandboxError(f"{what}: {exc.strerror or exc}", reason="disk_failed", **details)


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
