"""Hand a test's (or a benchmark's) hand-made tree to the uid a sandbox writes as.

The worker stages what it gives a sandbox as that owner itself (``stage_owner()``);
tests and benchmarks that build a workspace by hand use this instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from worker.sandbox.config import BackendConfig


def chown_to_sandbox(root: Path, config: BackendConfig) -> None:
    """Give ``root`` and everything below it to ``config.host_owner()`` (links not
    followed); a no-op owner change when not root."""
    uid, gid = config.host_owner()
    os.lchown(root, uid, gid)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.lchown(os.path.join(parent, name), uid, gid)
