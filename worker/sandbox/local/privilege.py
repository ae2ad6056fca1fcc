"""The privilege drop a root worker puts before bubblewrap, and the host tools it needs.

The sandbox uid 1000 maps to the host uid bubblewrap runs as. A root worker never lets
that be root: each spawn enters the sandbox's staging mount namespace (see ``staging``)
and drops to ``sandbox_host_uid``/``sandbox_host_gid`` with ``nsenter`` (no groups, no
capabilities) before exec'ing bubblewrap, which then builds an unprivileged user
namespace. A non-root worker runs bubblewrap as itself.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox import staging
from worker.sandbox.local.records import SandboxRecord

# Looked up here only, never through the worker's own PATH.
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def drop_privileges_argv(
    *, nsenter: str, setpriv: str, mount_ns: Path, owner: tuple[int, int], thorough: bool
) -> list[str]:
    """Enter the staging mount namespace, then become ``owner`` with no capabilities.

    Goes before bwrap, which then runs unprivileged and maps the sandbox uid to ``owner``.
    ``nsenter`` alone does it (``setgroups(0)``, ``setgid``, ``setuid``: leaving root
    empties the permitted, effective and ambient sets) in one exec instead of two. Only
    the inheritable and bounding sets survive that, and they matter only to an exec that
    can gain capabilities, which bwrap can do only when it is set-uid or has file
    capabilities, or the worker holds inheritable ones: ``thorough`` (see
    :func:`needs_thorough_drop`) adds ``setpriv`` to empty both sets for those hosts.
    """
    uid, gid = owner
    if not thorough:
        return [nsenter, f"--mount={mount_ns}", f"--setuid={uid}", f"--setgid={gid}", "--"]
    return [
        nsenter, f"--mount={mount_ns}", "--",
        setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip


def needs_thorough_drop(bwrap: str, status: Path = Path("/proc/self/status")) -> bool:
    """True when exec'ing ``bwrap`` after leaving root could gain a capability.

    That is when bwrap is set-uid/set-gid or carries file capabilities, or this process
    holds inheritable capabilities (some container runtimes hand them out).
    """
    info = os.stat(bwrap)
    if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return True
    try:
        os.getxattr(bwrap, "security.capability")
    except OSError:
        pass
    else:
        return True
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "CapInh":
            return int(value.strip(), 16) != 0
    return True  # cannot tell: be thorough


class HostTools:
    """bubblewrap and the util-linux tools a spawn runs, each resolved once."""

    def __init__(self, *, bwrap: str, owner: tuple[int, int]) -> None:
        self._bwrap_name = bwrap
        self._owner = owner
        self._bwrap: str | None = None
        self._tools: dict[str, str] = {}
        self.thorough: bool | None = None

    def bwrap_path(self) -> str:
        """The bwrap executable.

        Raises:
            SandboxError: bubblewrap is not installed.
        """
        if self._bwrap is None:
            found = shutil.which(self._bwrap_name)
            if found is None:
                raise SandboxError("bubblewrap not found", bwrap=self._bwrap_name)
            self._bwrap = found
        return self._bwrap

    def tool(self, name: str) -> str:
        """A system tool (nsenter, setpriv, unshare, sh) from ``TOOL_PATH``.

        Raises:
            SandboxError: the tool is not installed.
        """
        if name not in self._tools:
            found = shutil.which(name, path=TOOL_PATH)
            if found is None:
                raise SandboxError(f"{name} not found (util-linux)", tool=name, path=TOOL_PATH)
            self._tools[name] = found
        return self._tools[name]

    def privilege_drop(self, record: SandboxRecord) -> list[str]:
        """What runs before bwrap: nothing unless we are root (the record is staged)."""
        if record.stage is None:
            return []
        if self.thorough is None:
            self.thorough = needs_thorough_drop(self.bwrap_path())
        return drop_privileges_argv(
            nsenter=self.tool("nsenter"),
            setpriv=self.tool("setpriv"),
            mount_ns=staging.ns_file(record.stage),
            owner=self._owner,
            thorough=self.thorough,
        )
