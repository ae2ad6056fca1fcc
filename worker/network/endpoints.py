"""A chosen model endpoint (``worker.endpoints``) as the sandbox's routes to it.

An ``https`` endpoint keeps its URL: the agent reaches its host by ``CONNECT`` through the
job's proxy, like any allowlisted destination. A ``plain_http`` endpoint is given to the
agent as ``http://127.0.0.1:<tunnel port><path>``: the sandbox's forwarder listens there
and opens each connection to the proxy with a ``CONNECT`` to the endpoint itself, so the
proxy checks it like any other destination and the agent sends plain HTTP into the
tunnel (loopback is never proxied, ``proxy_env``). Either way the endpoint's host (and
its ``hosts``) join the job's allowlist, and with ``private`` they may resolve to
non-public addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.endpoints import ModelEndpoint
from worker.network import forward

#: The first in-sandbox port a plain-HTTP endpoint is tunnelled from.
TUNNEL_BASE_PORT = forward.PORT + 1


@dataclass(frozen=True, slots=True)
class EndpointRoute:
    """What the sandbox and the agent need for one endpoint."""

    name: str
    #: The base URL as the agent inside the sandbox uses it.
    agent_url: str
    #: ``host:port`` destinations the proxy must allow (the endpoint's, then ``hosts``).
    allow: tuple[str, ...]
    #: Among ``allow``, those that may resolve to private, loopback or link-local addresses.
    private: tuple[str, ...]
    #: (in-sandbox port, ``host:port``) plain tunnels the forwarder opens.
    tunnels: tuple[tuple[int, str], ...]


def route(name: str, endpoint: ModelEndpoint) -> EndpointRoute:
    """The routes of ``endpoint`` (already validated by its model)."""
    base = endpoint.base
    allow = (base.authority, *endpoint.hosts)
    tunnels: tuple[tuple[int, str], ...] = ()
    if base.scheme == "https":
        agent_url = endpoint.url.rstrip("/")
    else:
        agent_url = base.with_authority("http", f"{forward.HOST}:{TUNNEL_BASE_PORT}")
        tunnels = ((TUNNEL_BASE_PORT, base.authority),)
    return EndpointRoute(
        name=name,
        agent_url=agent_url,
        allow=allow,
        private=allow if endpoint.private else (),
        tunnels=tunnels,
    )
