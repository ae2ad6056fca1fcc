"""What every host-side backend does the same way, written once.

Sandbox ids (``acpw-<job>-<attempt>-<random>``, safe as a file, cgroup and container
name), the checks of a spec and of one spawn's argv/env/cwd, and the per-process
registry of allowlist proxies (``netpolicy``): a backend that differs in one of these
would differ in what it lets through, so they live here and nowhere else.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.errors import SandboxError
from worker.network import FORWARDER_PYTHON, AllowlistProxy
from worker.sandbox import netpolicy
from worker.sandbox.base import SandboxSpec, home_relative

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_ID_VALID = re.compile(r"^acpw-[A-Za-z0-9_-]{1,120}$")


def make_sandbox_id(job_id: str, attempt: int) -> str:
    """``acpw-<job>-<attempt>-<random>``, safe as a file, cgroup and container name."""
    job = _ID_UNSAFE.sub("-", job_id).strip("-")[:64] or "job"
    return f"acpw-{job}-{attempt}-{secrets.token_hex(4)}"


def check_id(sandbox_id: str, *, backend: str) -> None:
    """Refuse anything but an id :func:`make_sandbox_id` could have made.

    Ids become paths under a state dir, cgroupfs and engine filters.

    Raises:
        SandboxError: not such an id.
    """
    if not _ID_VALID.match(sandbox_id):
        raise SandboxError(f"not a {backend} sandbox id", sandbox_id=sandbox_id)


def check_spec(spec: SandboxSpec, *, python: Path | None = Path(FORWARDER_PYTHON)) -> None:
    """Refuse a spec no backend can honour (``python``: see :func:`netpolicy.check`).

    Raises:
        SandboxError: the network policy is malformed, the workspace or closure is not a
            directory, an extra mount's source is missing or its target relative, or a
            writable mount is not a real directory strictly below HOME.
    """
    netpolicy.check(spec, python=python)
    for what, path in (("workspace", spec.workspace), ("pack_closure", spec.pack_closure)):
        if not path.is_dir():
            raise SandboxError(f"{what} is not a directory", **{what: str(path)})
    for mount in spec.extra_mounts:
        if not mount.source.exists() or not mount.target.startswith("/"):
            raise SandboxError("bad extra mount", source=str(mount.source))
    for state in spec.state_mounts:
        home_relative(state.target)
        if not state.source.is_dir() or state.source.is_symlink():
            raise SandboxError("a writable mount is not a directory", source=str(state.source))


def check_command(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
    """Refuse a spawn that no exec could carry out as asked.

    Raises:
        SandboxError: an empty argv, a relative cwd, a NUL byte in argv, or an env name
            that is empty or holds ``=`` or a NUL byte.
    """
    if not argv or not cwd.startswith("/"):
        raise SandboxError("spawn needs an argv and an absolute cwd", cwd=cwd)
    if any("\0" in a for a in argv) or any(not k or "=" in k or "\0" in k for k in env):
        raise SandboxError("spawn refused a NUL byte in argv or a malformed env name")


class ProxyRegistry:
    """This process's allowlist proxies, one per sandbox that asked for ``allowlist``.

    Only the process that created a sandbox holds its proxy: a reaper in another process
    finds nothing here and removes the proxy's directory from the sandbox's record.
    """

    def __init__(self) -> None:
        self._proxies: dict[str, AllowlistProxy] = {}

    def get(self, sandbox_id: str) -> AllowlistProxy | None:
        return self._proxies.get(sandbox_id)

    async def start(
        self, sandbox_id: str, spec: SandboxSpec, owner: tuple[int, int] | None
    ) -> Path:
        """Start the sandbox's proxy (its socket owned by ``owner``) and keep it; the
        private directory of its socket.

        Raises:
            SandboxError: the socket could not be made.
        """
        directory, proxy = await netpolicy.start_proxy(spec, owner)
        self._proxies[sandbox_id] = proxy
        return directory

    def start_fronted(self, sandbox_id: str, spec: SandboxSpec) -> AllowlistProxy:
        """Keep a proxy for the sandbox with no socket of its own: it serves only the
        listeners it is handed (``AllowlistProxy.front``: a root worker's local sandbox)."""
        proxy = netpolicy.fronted_proxy(spec)
        self._proxies[sandbox_id] = proxy
        return proxy

    async def close(self, sandbox_id: str) -> None:
        """Close and forget the sandbox's proxy, if this process holds one; idempotent."""
        proxy = self._proxies.pop(sandbox_id, None)
        if proxy is not None:
            await proxy.close()
