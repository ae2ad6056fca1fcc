"""Network ``allowlist`` on Kubernetes: each job's proxy in the worker, reached over TCP.

A pod cannot be given the worker's Unix socket, so the job's
:class:`~worker.network.AllowlistProxy` (the same policy, private-address refusal,
bounds and ``network_denied`` notices as on the other backends) has no listener of its
own. One :class:`ProxyFront` per backend listens on TCP (``k8s_proxy_listen_host``,
``k8s_proxy_port``) where sandbox pods reach it (``k8s_proxy_address``), and hands each
connection to the proxy of the job whose identity it starts with:

    ACPW-TOKEN <token>\\r\\n

Each connection is TLS (1.3) first: the front's key and self-signed certificate are made
when it starts listening (``tls.front_tls``), and the forwarder trusts that certificate
alone, given to it with the token. The identity line is the first thing sent inside it.

The token is random per sandbox (:data:`TOKEN_BYTES` bytes) and only its SHA-256 is kept
here. A connection with no line, or a token no running sandbox holds (another job's that
ended, a guess), is answered ``407`` and closed: it reaches no job's proxy and is
reported to no job (it is not that job's agent), only counted (``FrontStats.refused``)
and logged. So one job's pod cannot use another job's allowlist without its token.

In the pod the agent sees what it sees elsewhere: ``HTTP(S)_PROXY`` at
``127.0.0.1:3128``, served by the forwarder (``worker.network.forward``, run from its
source with ``python3 -c``: there is no host file to bind) with ``--upstream`` set to the
front (``--upstream-tls``); the token reaches the forwarder in ``ACPW_PROXY_TOKEN`` and
the certificate in ``ACPW_PROXY_CA``, which it removes before it execs the agent. The
agent runs as the forwarder's uid, so it could read the token from the forwarder's
process; that only gives it its own job's allowlist. Nothing crosses the pod network in
clear, and the NetworkPolicies (``manifests.network_policies``) let sandbox pods reach the
front alone and nothing reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker.errors import SandboxError
from worker.network import (
    FORWARDER_PYTHON,
    FORWARDER_SOURCE,
    AllowlistProxy,
    ProxyLimits,
    forward,
    proxy_env,
)
from worker.sandbox.kubernetes.manifests import ProxyPeer
from worker.sandbox.kubernetes.tls import front_tls

if TYPE_CHECKING:
    from worker.sandbox.base import SandboxSpec
    from worker.sandbox.config import KubernetesConfig

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
#: Bytes of the identity line, CRLF included (the prefix and a 43-character token fit).
MAX_LINE = 128
#: Seconds a connection has to send its identity line.
LINE_TIMEOUT_S = 10.0
#: Connections still to send their identity line at a time; more are refused at once.
MAX_UNIDENTIFIED = 64
_REFUSAL = (
    b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 36\r\nConnection: close\r\n\r\nacp-worker proxy: unknown identity\r\n"
)


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


@dataclass(slots=True)
class FrontStats:
    """Counters of one front (read by tests and diagnostics)."""

    #: Connections handed to a job's proxy.
    accepted: int = 0
    #: Connections refused before any proxy: no, malformed or unknown identity, or too
    #: many connections still to identify themselves (``MAX_UNIDENTIFIED``).
    refused: int = 0


class ProxyFront:
    """The TCP listener in front of this process's per-job proxies.

    It listens while at least one proxy is registered (:meth:`add`), and stops with the
    last one (:meth:`remove`).
    """

    def __init__(self, host: str, port: int, *, limits: ProxyLimits | None = None) -> None:
        self.host, self._port = host, port
        self.limits = limits or ProxyLimits()
        self.stats = FrontStats()
        self._proxies: dict[bytes, AllowlistProxy] = {}
        self._server: asyncio.Server | None = None
        self._unidentified = 0
        self._tls: ssl.SSLContext | None = None
        #: The certificate the forwarders pin (PEM; a new one each time it listens).
        self.certificate = ""

    @property
    def port(self) -> int:
        """The port listened on (the configured one, or the one bound for port 0)."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def add(self, spec: SandboxSpec) -> str:
        """Start ``spec``'s proxy behind the front (listening first if it was not); its
        token.

        Raises:
            SandboxError: the front could not listen.
        """
        proxy = AllowlistProxy(
            spec.network_allow,
            socket_path=None,
            on_denial=spec.on_network_denial,
            limits=self.limits,
            private=spec.network_private,
        )
        if self._server is None:
            await self._listen()
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._proxies[_digest(token.encode())] = proxy
        return token

    def proxy(self, token: str) -> AllowlistProxy | None:
        """The proxy ``token`` names, if it is registered."""
        return self._proxies.get(_digest(token.encode()))

    async def remove(self, token: str) -> None:
        """Close and forget ``token``'s proxy (the listener too after the last); idempotent."""
        proxy = self._proxies.pop(_digest(token.encode()), None)
        if proxy is not None:
            await proxy.close()
        if not self._proxies and self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()

    async def _listen(self) -> None:
        self._tls, self.certificate = await asyncio.to_thread(front_tls)
        try:
            self._server = await asyncio.start_server(
                self._accept, self.host, self._port, limit=self.limits.max_head_bytes
            )
        except OSError as exc:
            raise SandboxError(
                f"the allowlist proxy could not listen on {self.host}:{self._port}: "
                f"{exc.strerror or exc}",
                network="allowlist",
            ) from exc

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proxy = await self._identify(reader, writer)
        if proxy is None:
            self.stats.refused += 1
            log.warning("allowlist proxy: a connection without a known identity was refused")
            with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: TLS failed
                writer.write(_REFUSAL)
                await writer.drain()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        self.stats.accepted += 1
        await proxy.serve(reader, writer)

    async def _identify(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> AllowlistProxy | None:
        """The proxy the connection's identity names, after its TLS handshake; both
        within ``LINE_TIMEOUT_S`` and within the ``MAX_UNIDENTIFIED`` slots (a handshake
        never started holds a slot as a line never sent does)."""
        if self._unidentified >= MAX_UNIDENTIFIED or self._tls is None:
            return None
        self._unidentified += 1
        try:
            async with asyncio.timeout(LINE_TIMEOUT_S):
                await writer.start_tls(self._tls)
                line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            return None  # ssl.SSLError is an OSError: a client that is not the forwarder
        finally:
            self._unidentified -= 1
        if len(line) > MAX_LINE or not line.startswith(forward.TOKEN_PREFIX):
            return None
        token = line.removeprefix(forward.TOKEN_PREFIX).removesuffix(b"\r\n")
        return self._proxies.get(_digest(token))


class PodNetwork:
    """The ``allowlist`` side of one Kubernetes backend: a token per sandbox pod."""

    def __init__(self, config: KubernetesConfig) -> None:
        self.config = config
        self.front = ProxyFront(config.k8s_proxy_listen_host, config.k8s_proxy_port)
        self._tokens: dict[str, str] = {}
        #: Pods whose forwarder runs (started by their first spawn, serving every later
        #: one: it listens on the pod's 127.0.0.1:3128, which a second one could not).
        self._forwarding: set[str] = set()

    def check(self, spec: SandboxSpec) -> None:
        """Refuse ``allowlist`` when pods have no address to reach the front at.

        Raises:
            SandboxError: ``allowlist`` with no ``k8s_proxy_address``.
        """
        if spec.network == "allowlist" and not self.config.k8s_proxy_address:
            raise SandboxError(
                "network 'allowlist' on kubernetes needs k8s_proxy_address "
                "(ACPW_K8S_PROXY_ADDRESS: where sandbox pods reach the worker's proxy)",
                network="allowlist",
            )

    def peer(self) -> ProxyPeer | None:
        """The front as the proxy-only NetworkPolicy names it (None: not managed here)."""
        labels = self.config.k8s_proxy_pod_labels
        if not labels:
            return None
        return ProxyPeer(labels, self.config.k8s_proxy_namespace_labels, self.front.port)

    async def open(self, pod: str, spec: SandboxSpec) -> None:
        """Start ``pod``'s proxy when ``spec`` asks for ``allowlist``.

        Raises:
            SandboxError: the front could not listen.
        """
        if spec.network == "allowlist":
            self._tokens[pod] = await self.front.add(spec)

    async def close(self, pod: str) -> None:
        """Close ``pod``'s proxy, if this process holds one; idempotent."""
        token = self._tokens.pop(pod, None)
        self._forwarding.discard(pod)
        if token is not None:
            await self.front.remove(token)

    def wrap(
        self,
        pod: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        tunnels: Sequence[tuple[int, str]],
    ) -> tuple[list[str], dict[str, str]]:
        """``argv`` and ``env`` of a spawn in ``pod`` under ``allowlist``: with the
        proxy's variables; the pod's first spawn also behind the forwarder, given the
        token (for the forwarder alone)."""
        token = self._tokens.get(pod)
        if token is None:
            return list(argv), dict(env)
        if pod in self._forwarding:
            return list(argv), {**env, **proxy_env()}
        self._forwarding.add(pod)
        address = str(self.config.k8s_proxy_address)
        host = f"[{address}]" if ":" in address else address
        opts = [f"--upstream={host}:{self.front.port}", "--upstream-tls"]
        opts += [f"--tunnel={port}={target}" for port, target in tunnels]
        source = FORWARDER_SOURCE.read_text()
        wrapped = [FORWARDER_PYTHON, "-I", "-S", "-c", source, *opts, "--", *argv]
        secret = {forward.TOKEN_ENV: token, forward.CA_ENV: self.front.certificate}
        return wrapped, {**env, **proxy_env(), **secret}
