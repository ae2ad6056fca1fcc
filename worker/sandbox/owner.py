"""Who owns what a sandbox writes on the host: the same rule for every host-side backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.settings import Settings


def sandbox_owner(settings: Settings) -> tuple[int, int]:
    """The host (uid, gid) that owns what the sandbox writes, and must own its workspace.

    ``sandbox_host_uid``/``sandbox_host_gid`` when the worker is root, else the worker's own.
    """
    if os.geteuid() == 0:
        return settings.sandbox_host_uid, settings.sandbox_host_gid
    return os.getuid(), os.getgid()


def chown_to_sandbox(root: Path, settings: Settings) -> None:
    """Give ``root`` and everything below it to :func:`sandbox_owner` (links not followed).

    For a runner staging a per-job workspace copy; a no-op owner change when not root.
    """
    uid, gid = sandbox_owner(settings)
    os.lchown(root, uid, gid)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(parent, name), uid, gid)
