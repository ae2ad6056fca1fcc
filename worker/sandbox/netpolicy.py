"""A sandbox's network policy, shared by the backends: checks, the proxy's life, cleanup.

``none`` needs nothing: every backend gives the sandbox a network namespace with only
loopback. ``allowlist`` adds one :class:`~worker.network.AllowlistProxy` per sandbox, in
the worker's process, listening on ``<dir>/proxy.sock`` in a fresh private directory
(0700, root's when the worker is root: only the bind into the sandbox reaches the
socket). The backend binds that socket and the forwarder script into the sandbox, wraps
each spawn with :func:`~worker.network.forwarder_argv` and adds
:func:`~worker.network.proxy_env`; ``destroy`` closes the proxy (when it is this
process's) and removes the directory (from any process, through the sandbox's record).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from worker.errors import SandboxError
from worker.network import FORWARDER_PYTHON, AllowlistProxy, parse_allowlist, parse_endpoint
from worker.network.endpoints import TUNNEL_BASE_PORT
from worker.sandbox.base import SandboxSpec

NETWORKS = ("none", "allowlist")
SOCKET_NAME = "proxy.sock"
#: In-sandbox ports a tunnel may listen on: [first, end).
TUNNEL_PORTS = (TUNNEL_BASE_PORT, 3200)


def check(spec: SandboxSpec, *, python: Path | None = Path(FORWARDER_PYTHON)) -> None:
    """Refuse a network policy the backend cannot honour.

    ``python``: where the forwarder's interpreter must exist as the sandbox sees it
    (None: the backend's image is trusted to have it).

    Raises:
        SandboxError: an unknown mode, an allowlist that is empty, malformed or too long,
            entries without ``allowlist``, private or tunnelled entries not allowed,
            tunnel ports clashing or out of range, or no interpreter for the forwarder.
    """
    if spec.network not in NETWORKS:
        raise SandboxError(f"unknown network policy {spec.network!r}", network=spec.network)
    if spec.network == "none":
        if spec.network_allow or spec.network_private or spec.network_tunnels:
            raise SandboxError("network_allow needs network 'allowlist'", network="none")
        return
    try:
        allow = parse_allowlist(spec.network_allow)
        private = parse_allowlist(spec.network_private)
        tunnels = [(port, parse_endpoint(target)) for port, target in spec.network_tunnels]
    except ValueError as exc:
        raise SandboxError(f"bad network allowlist: {exc}", network="allowlist") from exc
    if not private <= allow or any(t not in allow for _, t in tunnels):
        raise SandboxError("private and tunnelled entries must be allowed", network="allowlist")
    ports = [port for port, _ in tunnels]
    in_range = all(TUNNEL_PORTS[0] <= p < TUNNEL_PORTS[1] for p in ports)
    if len(set(ports)) != len(ports) or not in_range:
        raise SandboxError(
            f"tunnel ports are distinct, in [{TUNNEL_PORTS[0]}, {TUNNEL_PORTS[1]})",
            network="allowlist",
        )
    if not allow:
        raise SandboxError("network 'allowlist' needs at least one host:port", network="allowlist")
    if python is not None and not python.is_file():
        raise SandboxError(
            f"network 'allowlist' needs {python} in the sandbox for its forwarder",
            network="allowlist",
        )


async def start_proxy(
    spec: SandboxSpec, owner: tuple[int, int] | None
) -> tuple[Path, AllowlistProxy]:
    """Start the sandbox's proxy in a new private directory (returned with it); the
    socket is ``owner``'s.

    Raises:
        SandboxError: the socket could not be made.
    """
    directory = Path(tempfile.mkdtemp(prefix="acpw-net-"))
    proxy = AllowlistProxy(
        spec.network_allow,
        socket_path=directory / SOCKET_NAME,
        on_denial=spec.on_network_denial,
        socket_owner=owner,
        private=spec.network_private,
    )
    try:
        await proxy.start()
    except OSError as exc:
        remove_dir(directory)
        raise SandboxError(
            f"network proxy did not start: {exc.strerror or exc}", network="allowlist"
        ) from exc
    return directory, proxy


def fronted_proxy(spec: SandboxSpec) -> AllowlistProxy:
    """The sandbox's proxy without a socket: connections come by ``front`` only."""
    return AllowlistProxy(
        spec.network_allow,
        socket_path=None,
        on_denial=spec.on_network_denial,
        private=spec.network_private,
    )


def remove_dir(directory: Path) -> None:
    """Remove a proxy directory: its socket, then itself (never recursively); idempotent.

    Only a directory this module made (``acpw-net-*``): the path may come from a record.
    """
    if not directory.name.startswith("acpw-net-"):
        return
    with contextlib.suppress(FileNotFoundError):
        (directory / SOCKET_NAME).unlink()
    with contextlib.suppress(FileNotFoundError, OSError):
        directory.rmdir()
