"""The per-job allowlisting HTTP CONNECT proxy, on a Unix socket the sandbox can reach.

The sandbox has no route out (its network namespace holds only loopback); the one way
out is this socket, bound into the sandbox. Each connection must start with
``CONNECT host:port HTTP/1.x``; the proxy answers ``200`` and relays bytes only when the
authority equals an allowlist entry (after lowercasing). Hostnames are resolved here, on
the host, and the proxy connects to the address it checked (no second lookup, so DNS
rebinding cannot swap it): a private, loopback, link-local or otherwise non-global
address is refused unless the allowlist names that IP literally, or the entry was
declared ``private`` (an operator's model endpoint, ``worker.network.endpoints``).
Anything else — another method, a malformed head, a destination not listed, too many
connections — is answered with an HTTP error, closed, and reported to ``on_denial`` as a
:class:`NetworkDenial`.

Connections, head size, idle time and bytes (per connection and in total) are bounded by
:class:`ProxyLimits`. :meth:`AllowlistProxy.close` stops listening, cuts every relay and
removes the socket; the sandbox backends call it from ``destroy``.

    proxy = AllowlistProxy(["api.example.com:443"], socket_path=path, on_denial=handler)
    await proxy.start()
    ...
    await proxy.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from worker.network.allow import Endpoint, parse_allowlist, parse_endpoint

log = logging.getLogger(__name__)

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class NetworkDenial:
    """One refused request, as the runner turns it into a ``notice`` event.

    ``reason`` is a stable code: ``bad_request`` (no parsable ``CONNECT`` head),
    ``method_not_allowed`` (not ``CONNECT``), ``not_allowed`` (the destination is not in
    the allowlist), ``private_address`` (it resolves only to non-global addresses that
    the allowlist does not name literally), ``unresolvable``, ``unreachable`` (the
    connection failed), ``too_many_connections``.
    """

    reason: str
    #: The requested destination as ``host:port`` ("" when the head had none).
    target: str
    #: One sentence for humans; never contains relayed data.
    message: str
    #: 1-based number of this denial within the proxy's life (``seq`` > reported ones
    #: means some were counted but not reported, see ``ProxyLimits.max_reported_denials``).
    seq: int


#: What the job passes as ``on_denial``: awaited once per reported denial (the job emits
#: it as a ``network_denied`` notice).
#: Exceptions it raises are logged and swallowed; it must not block for long.
DenialHandler = Callable[[NetworkDenial], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ProxyLimits:
    """Bounds of one job's proxy."""

    #: Concurrent connections (relays and heads being read).
    max_connections: int = 32
    #: Bytes of the request head, up to and including the blank line.
    max_head_bytes: int = 8192
    #: Seconds to receive the head.
    head_timeout: float = 10.0
    #: Seconds to resolve and connect to the destination.
    connect_timeout: float = 10.0
    #: Seconds a relay may see no byte in either direction.
    idle_timeout: float = 300.0
    #: Bytes relayed per connection, both directions together.
    max_connection_bytes: int = 1 << 30
    #: Bytes relayed over the proxy's life, both directions together.
    max_total_bytes: int = 4 << 30
    #: Denials handed to ``on_denial``; later ones are counted only.
    max_reported_denials: int = 100


@dataclass(slots=True)
class ProxyStats:
    """Counters of one proxy (mutable, read by tests and diagnostics)."""

    connections: int = 0
    allowed: int = 0
    denied: int = 0
    bytes_relayed: int = 0


class _Denied(Exception):
    def __init__(self, status: int, reason: str, target: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.target, self.message = status, reason, target, message


_STATUS_TEXT = {
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    502: "Bad Gateway",
    503: "Service Unavailable",
}
_CHUNK = 64 * 1024


class _Destination:
    """The policy: which ``CONNECT`` is allowed, and the checked address it reaches."""

    def __init__(
        self, allow: frozenset[Endpoint], limits: ProxyLimits, private: frozenset[Endpoint]
    ) -> None:
        self._allow = allow
        self._limits = limits
        self._private = private

    def check(self, line: tuple[str, str]) -> Endpoint:
        """The endpoint of an allowed request line.

        Raises:
            _Denied: not ``CONNECT``, a malformed authority, or not in the allowlist.
        """
        method, authority = line
        if method != "CONNECT":
            raise _Denied(
                405, "method_not_allowed", authority[:300], f"Method {method[:20]!r} refused."
            )
        try:
            endpoint = parse_endpoint(authority)
        except ValueError as exc:
            raise _Denied(400, "bad_request", authority[:300], str(exc)) from exc
        if endpoint not in self._allow:
            raise _Denied(403, "not_allowed", str(endpoint), f"{endpoint} is not allowed.")
        return endpoint

    async def open(self, endpoint: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the address checked for ``endpoint`` (no second lookup).

        Raises:
            _Denied: unresolvable, only private addresses, or the connection failed.
        """
        address = await self._address(endpoint)
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(str(address), endpoint.port, limit=_CHUNK),
                timeout=self._limits.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise _Denied(
                502, "unreachable", str(endpoint), f"Connecting to {endpoint} failed: {exc}."
            ) from exc

    async def _address(self, endpoint: Endpoint) -> _IPAddress:
        if endpoint.literal:  # named literally in the allowlist: any address class
            return ipaddress.ip_address(endpoint.host)
        found = await self._resolve(endpoint)
        if endpoint in self._private:  # the operator declared it may be private
            return found[0]
        usable = [a for a in found if _is_public(a)]
        if not usable:
            listed = ", ".join(sorted({str(a) for a in found}))
            raise _Denied(
                403,
                "private_address",
                str(endpoint),
                f"{endpoint} resolves only to non-public addresses ({listed}).",
            )
        return usable[0]

    async def _resolve(self, endpoint: Endpoint) -> list[_IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM),
                timeout=self._limits.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise _Denied(
                502, "unresolvable", str(endpoint), f"{endpoint.host} did not resolve."
            ) from exc
        return [ipaddress.ip_address(info[4][0]) for info in infos]


class _Denials:
    """Answers a refused connection with its HTTP error and reports it (bounded)."""

    def __init__(
        self, stats: ProxyStats, limits: ProxyLimits, on_denial: DenialHandler | None
    ) -> None:
        self._stats = stats
        self._limits = limits
        self._on_denial = on_denial

    async def refuse(
        self, writer: asyncio.StreamWriter, denied: _Denied, *, answer: bool = True
    ) -> None:
        """Report ``denied``; with ``answer``, first tell the client its HTTP error."""
        self._stats.denied += 1
        seq = self._stats.denied
        status = f"{denied.status} {_STATUS_TEXT[denied.status]}"
        body = f"acp-worker proxy: {denied.reason}\n".encode()
        with contextlib.suppress(OSError):
            if answer:
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        if self._on_denial is None or seq > self._limits.max_reported_denials:
            return
        denial = NetworkDenial(denied.reason, denied.target, denied.message, seq)
        try:
            await self._on_denial(denial)
        except Exception:
            log.exception("network denial handler failed")


class _Relay:
    """Bytes both ways between the sandbox and the destination, idle- and byte-bounded."""

    def __init__(self, stats: ProxyStats, limits: ProxyLimits) -> None:
        self._stats = stats
        self._limits = limits

    async def run(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        budget = [self._limits.max_connection_bytes]
        try:
            await asyncio.gather(
                self._pump(client_r, up_w, budget), self._pump(up_r, client_w, budget)
            )
        except (OSError, TimeoutError, _OverBudget):
            pass
        finally:
            up_w.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await up_w.wait_closed()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, budget: list[int]
    ) -> None:
        while chunk := await asyncio.wait_for(src.read(_CHUNK), self._limits.idle_timeout):
            budget[0] -= len(chunk)
            self._stats.bytes_relayed += len(chunk)
            if budget[0] < 0 or self._stats.bytes_relayed > self._limits.max_total_bytes:
                raise _OverBudget
            dst.write(chunk)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()  # half-close: the other direction may still be talking


class AllowlistProxy:
    """One job's proxy: listens on ``socket_path`` between :meth:`start` and :meth:`close`.

    It accepts and bounds connections; the policy (:class:`_Destination`), the refusals
    (:class:`_Denials`) and the byte relay (:class:`_Relay`) are its parts.
    """

    def __init__(
        self,
        allow: Iterable[str],
        *,
        socket_path: Path | None,
        on_denial: DenialHandler | None = None,
        limits: ProxyLimits | None = None,
        socket_owner: tuple[int, int] | None = None,
        private: Iterable[str] = (),
    ) -> None:
        """``socket_path``: None for a proxy with no listener of its own, handed each
        connection by :meth:`serve` (a front that identified the job first, as the
        Kubernetes backend's TCP front does). ``socket_owner``: (uid, gid) given the
        socket (mode 0600), e.g. the sandbox's host uid; None keeps the caller's.
        ``private``: entries of ``allow`` whose names may resolve to non-public addresses
        (an operator's model endpoint on a private network or on this host); other names
        must resolve to a public address.

        Raises:
            ValueError: an allowlist entry is malformed or the list is too long.
        """
        self.allow = parse_allowlist(allow)
        self.socket_path = socket_path
        self.limits = limits or ProxyLimits()
        self.stats = ProxyStats()
        self._destination = _Destination(
            self.allow, self.limits, parse_allowlist(private) & self.allow
        )
        self._denials = _Denials(self.stats, self.limits, on_denial)
        self._relay = _Relay(self.stats, self.limits)
        self._owner = socket_owner
        self._server: asyncio.Server | None = None
        #: Listening sockets made elsewhere that it serves (:meth:`front`).
        self._fronts: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0

    async def start(self) -> None:
        """Listen on the socket (replacing nothing: the path must not exist).

        Raises:
            OSError: the socket could not be made.
            ValueError: the proxy has no ``socket_path``.
        """
        if self.socket_path is None:
            raise ValueError("this proxy has no socket of its own: connections come by serve()")
        self._server = await asyncio.start_unix_server(
            self._accept, path=str(self.socket_path), limit=self.limits.max_head_bytes
        )
        os.chmod(self.socket_path, 0o600)
        if self._owner is not None:
            os.chown(self.socket_path, *self._owner)

    async def close(self) -> None:
        """Stop listening (its fronts too), cut every connection, remove the socket;
        idempotent."""
        server, self._server = self._server, None
        fronts, self._fronts = self._fronts, []
        for front in fronts:
            front.close()
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        for front in fronts:
            await front.wait_closed()
        if self.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection accepted elsewhere, as if it came to the socket (bounded,
        cut by :meth:`close`); it closes ``writer``. Its ``reader`` should have been made
        with ``limit=limits.max_head_bytes``."""
        await self._accept(reader, writer)

    async def front(self, sock: socket.socket, tunnel: str | None = None) -> asyncio.Server:
        """Serve the connections of ``sock``, a listening socket made elsewhere (in a
        sandbox's network namespace: ``worker.sandbox.local.netns``), as if they came to
        the socket; with ``tunnel`` (``host:port``) each is a tunnel to it, already asked
        for, as the in-sandbox forwarder's tunnel ports are: no request head is read, no
        ``200`` written, and a refused one is closed unanswered. The server owns
        ``sock``; closing it (or :meth:`close`) stops the accepting, not the
        connections under way (:meth:`close` cuts those)."""

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accept(reader, writer, tunnel)

        server = await asyncio.start_server(accept, sock=sock, limit=self.limits.max_head_bytes)
        self._fronts.append(server)
        return server

    def unfront(self, server: asyncio.Server) -> None:
        """Stop accepting on ``server`` (one of :meth:`front`'s): its socket closes, the
        connections it took go on until they end or :meth:`close` cuts them."""
        server.close()
        with contextlib.suppress(ValueError):
            self._fronts.remove(server)

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tunnel: str | None = None
    ) -> None:
        task = asyncio.current_task()
        if task is not None:  # always: a connection callback runs in its own task
            self._tasks.add(task)
        self.stats.connections += 1
        self._active += 1
        try:
            await self._serve(reader, writer, tunnel)
        except asyncio.CancelledError:
            pass
        except OSError as exc:
            log.debug("proxy connection ended: %s", exc)
        finally:
            self._active -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tunnel: str | None
    ) -> None:
        try:
            self._check_capacity()
            line = ("CONNECT", tunnel) if tunnel is not None else await self._read_head(reader)
            endpoint = self._destination.check(line)
            upstream = await self._destination.open(endpoint)
        except _Denied as denied:
            await self._denials.refuse(writer, denied, answer=tunnel is None)
            return
        self.stats.allowed += 1
        if tunnel is None:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
        await self._relay.run(reader, writer, *upstream)

    def _check_capacity(self) -> None:
        """Raises:
        _Denied: the job's connection limit is reached (503).
        """
        if self._active > self.limits.max_connections:
            raise _Denied(
                503, "too_many_connections", "", "The job's proxy connection limit is reached."
            )

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=self.limits.head_timeout
            )
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            raise _Denied(400, "bad_request", "", "No complete request head arrived.") from exc
        return _request_line(head)


class _OverBudget(Exception):
    """A relay passed its byte budget."""


def _request_line(head: bytes) -> tuple[str, str]:
    """(method, authority) of an HTTP/1.x request line.

    Raises:
        _Denied: not ``METHOD TARGET HTTP/1.x``.
    """
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Denied(400, "bad_request", "", "The request line is not METHOD TARGET HTTP/1.x.")
    return parts[0], parts[1]


def _is_public(address: _IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast
