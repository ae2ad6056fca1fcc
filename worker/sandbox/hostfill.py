"""Filling a warm slot's host workspace with a job's staged copy, in place.

A warm slot's sandbox is already running when its job's workspace arrives: its
``/workspace`` is a bind of the slot's host directory, and the mask mount points
``mountpoints.ensure`` made there carry mounts inside the sandbox. Renaming over one
would detach its mount there (the kernel lazily unmounts a mount point removed in
another namespace), so nothing that exists in the workspace is replaced: a staged
directory is merged into an existing one, a staged file whose name exists as a regular
file (an empty mask point) is written into that very inode, and any other collision is
refused. Every step goes through ``O_NOFOLLOW`` directory descriptors, so a link the
agent may have made in its workspace is never followed.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from worker.errors import SandboxError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def move_into(staged: Path, workspace: Path) -> None:
    """Move the entries of ``staged`` into ``workspace`` (same filesystem), merging.

    Raises:
        SandboxError: a collision with an entry of another kind, or an OS error.
    """
    try:
        src = os.open(staged, _DIR)
        try:
            dst = os.open(workspace, _DIR)
            try:
                _merge(src, dst, "")
            finally:
                os.close(dst)
        finally:
            os.close(src)
    except OSError as exc:
        raise SandboxError(
            f"the staged workspace could not be moved into the warm sandbox: {exc.strerror}",
            errno=exc.errno,
        ) from exc


def _merge(src: int, dst: int, rel: str) -> None:
    for name in os.listdir(src):
        path = f"{rel}{name}"
        mode = os.stat(name, dir_fd=src, follow_symlinks=False).st_mode
        try:
            there = os.stat(name, dir_fd=dst, follow_symlinks=False).st_mode
        except FileNotFoundError:
            os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)
            continue
        if stat.S_ISDIR(mode) and stat.S_ISDIR(there):
            inner_src = os.open(name, _DIR, dir_fd=src)
            try:
                inner_dst = os.open(name, _DIR, dir_fd=dst)
                try:
                    _merge(inner_src, inner_dst, f"{path}/")
                finally:
                    os.close(inner_dst)
            finally:
                os.close(inner_src)
        elif stat.S_ISREG(mode) and stat.S_ISREG(there):
            _write_into(src, dst, name, mode)
        else:
            raise SandboxError(
                f"staged {path} collides with a mount point of another kind in the warm "
                "sandbox's workspace",
                path=path,
                errno=errno.EEXIST,
            )


def _write_into(src: int, dst: int, name: str, mode: int) -> None:
    """The staged file's content written into the existing file (same inode)."""
    rfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
    try:
        wfd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
        try:
            with os.fdopen(rfd, "rb", closefd=False) as r, os.fdopen(wfd, "wb", closefd=False) as w:
                shutil.copyfileobj(r, w)
            os.fchmod(wfd, stat.S_IMODE(mode))
        finally:
            os.close(wfd)
    finally:
        os.close(rfd)
