"""Who owns what a sandbox writes on the host: the same rule for every host-side backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.sandbox.config import BackendConfig


def sandbox_owner(config: BackendConfig) -> tuple[int, int]:
    """The host (uid, gid) that owns what the sandbox writes, and must own its workspace.

    ``sandbox_host_uid``/``sandbox_host_gid`` of ``config`` when the worker is root, else
    the worker's own.
    """
    return config.host_owner()


def chown_to_sandbox(root: Path, config: BackendConfig) -> None:
    """Give ``root`` and everything below it to :func:`sandbox_owner` (links not followed).

    For a runner staging a per-job workspace copy; a no-op owner change when not root.
    """
    uid, gid = sandbox_owner(config)
    os.lchown(root, uid, gid)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(parent, name), uid, gid)
