"""Network policy ``allowlist``: a per-job CONNECT proxy on a Unix socket.

The sandbox keeps no route out (its network namespace has only loopback). With policy
``allowlist`` the backend starts an :class:`AllowlistProxy` on the host, binds its socket
into the sandbox at :data:`SANDBOX_SOCKET`, and runs :mod:`worker.network.forward` in
front of the agent: a TCP listener on ``127.0.0.1:3128`` inside the sandbox that relays
to that socket, named by :func:`proxy_env`'s ``HTTP(S)_PROXY``/``ALL_PROXY`` variables.
A root worker on the local backend needs no forwarder: it makes that listener (and one
per tunnel) in the sandbox's namespace itself (``worker.sandbox.local.netns``) and the
proxy serves it (:meth:`AllowlistProxy.front`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.network import forward
from worker.network.allow import MAX_ALLOW, Endpoint, parse_allowlist, parse_endpoint
from worker.network.proxy import (
    AllowlistProxy,
    DenialHandler,
    NetworkDenial,
    ProxyLimits,
    ProxyStats,
)

#: Where the proxy socket and the forwarder script appear inside every sandbox.
SANDBOX_SOCKET = forward.SOCKET
SANDBOX_FORWARDER = "/run/acpw/forward.py"
#: The host file bound read-only at :data:`SANDBOX_FORWARDER`.
FORWARDER_SOURCE = Path(forward.__file__)
#: The interpreter that runs the forwarder inside the sandbox (the sandbox's own /usr).
FORWARDER_PYTHON = "/usr/bin/python3"
PROXY_URL = f"http://{forward.HOST}:{forward.PORT}"
#: The port of :data:`PROXY_URL` inside the sandbox.
PROXY_PORT = forward.PORT


def proxy_env() -> Mapping[str, str]:
    """What the agent's environment gains under ``allowlist`` (both spellings: tools
    differ on which they read)."""
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = dict.fromkeys(names, PROXY_URL)
    env |= {name.lower(): PROXY_URL for name in names}
    # The sandbox's own loopback is not the proxy's business.
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


def forwarder_argv(
    argv: list[str] | tuple[str, ...], tunnels: Sequence[tuple[int, str]] = ()
) -> list[str]:
    """``argv`` run behind the in-sandbox forwarder, which also opens ``tunnels``
    (in-sandbox port, ``host:port`` reached by ``CONNECT`` through the proxy)."""
    opts = [f"--tunnel={port}={target}" for port, target in tunnels]
    return [FORWARDER_PYTHON, "-I", "-S", SANDBOX_FORWARDER, *opts, "--", *argv]


__all__ = [
    "FORWARDER_PYTHON",
    "FORWARDER_SOURCE",
    "MAX_ALLOW",
    "PROXY_PORT",
    "PROXY_URL",
    "SANDBOX_FORWARDER",
    "SANDBOX_SOCKET",
    "AllowlistProxy",
    "DenialHandler",
    "Endpoint",
    "NetworkDenial",
    "ProxyLimits",
    "ProxyStats",
    "forwarder_argv",
    "parse_allowlist",
    "parse_endpoint",
    "proxy_env",
]
