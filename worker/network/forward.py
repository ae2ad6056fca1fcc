"""Inside the sandbox: a TCP listener on 127.0.0.1 relaying to the proxy's Unix socket.

Most tools speak TCP to a proxy (``HTTPS_PROXY=http://127.0.0.1:3128``), but the sandbox's
only way out is the Unix socket bound at ``SOCKET``. This script is bound read-only into
the sandbox and run by it in front of the agent (stdlib only, ``python3 -I -S``):

    python3 -I -S /run/acpw/forward.py [--upstream=HOST:PORT] [--tunnel=PORT=HOST:PORT ...] \
        -- AGENT ARGV...

With ``--upstream`` (a sandbox that cannot be given the socket: a Kubernetes pod) each
connection goes to the proxy at ``HOST:PORT`` over TCP instead, and starts with the
line ``ACPW-TOKEN <token>`` — the job's identity, read from ``$ACPW_PROXY_TOKEN``, which
is removed from the environment before the agent is exec'd. With ``--upstream-tls`` too,
that connection is TLS 1.3 to a proxy holding the key of the one certificate in
``$ACPW_PROXY_CA`` (PEM, removed likewise; pinned: no host name is checked), and the line
goes inside it; a proxy that cannot prove that key gets nothing.

Each ``--tunnel`` adds a listener on ``127.0.0.1:PORT`` whose connections go to the proxy
already opened: the relay sends ``CONNECT HOST:PORT`` itself and, once the proxy answers
``200``, copies bytes both ways, so a program that speaks plain HTTP to that port reaches
``HOST:PORT`` (a plain-HTTP model endpoint the proxy allows) without knowing of a proxy.

It binds and listens first (so the port is ready before the agent runs), double-forks a
relay daemon — adopted by the sandbox's init, so it dies with the sandbox — and then
``exec``\\ s the agent in its own process (same pid, same stdio). The relay copies bytes
both ways, one thread per direction, for at most ``MAX_CONNECTIONS`` connections at a
time (over TLS, both directions in one thread: an SSL object is not to be read and
written from two threads at once). It knows nothing of the policy: the host-side proxy
decides everything.
"""

from __future__ import annotations

# Nothing but what the interpreter has built in: this runs in front of every agent's start,
# where ``typing``, ``contextlib``, ``socket`` (its ``enum``) and ``threading`` alone took
# 10-12 ms, and the relay daemon it leaves in each sandbox imported them again (≈ 6 ms of
# CPU). ``_socket`` and ``_thread`` do the relay's work; only a pod's TLS path imports more.
import _socket
import _thread
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import ssl
    from _thread import LockType
    from typing import NoReturn

    Sock = _socket.socket | ssl.SSLSocket

SOCKET = "/run/acpw/proxy.sock"
#: The variable the token of ``--upstream`` comes in (never passed on to the agent).
TOKEN_ENV = "ACPW_PROXY_TOKEN"  # noqa: S105 - a variable's name, not a secret
#: The variable the pinned certificate of ``--upstream-tls`` comes in (PEM).
CA_ENV = "ACPW_PROXY_CA"
#: The line each TCP connection to the proxy starts with, then the token and CRLF.
TOKEN_PREFIX = b"ACPW-TOKEN "
HOST, PORT = "127.0.0.1", 3128
MAX_CONNECTIONS = 64
_CHUNK = 65536
_MAX_REPLY_HEAD = 8192


def main(argv: list[str]) -> None:
    tunnels, upstream, tls, program = _parse(argv[1:])
    token = os.environ.pop(TOKEN_ENV, "")
    pinned = os.environ.pop(CA_ENV, "")
    if (upstream is not None and not token) or (tls and not pinned):
        _usage()
    route = _Route(upstream, token, pinned if tls else None)
    listeners: list[tuple[_socket.socket, str | None]] = [(_listen(PORT), None)]
    listeners += [(_listen(port), target) for port, target in tunnels]
    if os.fork() == 0:
        if os.fork() == 0:
            _daemon(listeners, route)
        os._exit(0)
    os.wait()
    for listener, _ in listeners:
        listener.close()
    try:
        os.execvp(program[0], program)  # noqa: S606 - the sandbox's own argv, not a shell
    except OSError as exc:
        sys.stderr.write(f"acpw: cannot exec {program[0]}: {exc}\n")
        os._exit(127)


class _Route:
    """How a relay reaches the proxy: its Unix socket, or ``upstream`` over TCP with the
    job's token first, inside TLS to the ``pinned`` certificate when one is given."""

    def __init__(
        self, upstream: tuple[str, int] | None, token: str, pinned: str | None = None
    ) -> None:
        self.upstream, self.token = upstream, token
        self.tls: ssl.SSLContext | None = None
        if pinned is not None:
            import ssl

            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the peer
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_3
            self.tls.check_hostname = False  # a pin: that one certificate, any name
            self.tls.load_verify_locations(cadata=pinned)

    def open(self) -> Sock:
        if self.upstream is None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.connect(SOCKET)
            except OSError:
                sock.close()
                raise
            return sock
        raw = _connect_tcp(self.upstream, timeout=30)
        if self.tls is None:
            raw.settimeout(None)
            raw.sendall(TOKEN_PREFIX + self.token.encode() + b"\r\n")
            return raw
        import socket  # the TLS path (a pod's relay) only: ssl wraps a socket.socket

        tls = self.tls.wrap_socket(
            socket.socket(fileno=raw.detach()), do_handshake_on_connect=False
        )  # takes the socket
        try:
            tls.do_handshake()  # within the connection's timeout
        except OSError:
            tls.close()
            raise
        tls.settimeout(None)
        tls.sendall(TOKEN_PREFIX + self.token.encode() + b"\r\n")
        return tls


def _connect_tcp(address: tuple[str, int], *, timeout: float) -> _socket.socket:
    """A TCP connection to ``address`` (each of its addresses in turn), as
    ``socket.create_connection`` makes one, on ``_socket`` alone."""
    failure: OSError = OSError(f"no address for {address[0]}")
    for family, kind, proto, _, where in _socket.getaddrinfo(*address, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        return sock
    raise failure


def _parse(
    args: list[str],
) -> tuple[list[tuple[int, str]], tuple[str, int] | None, bool, list[str]]:
    tunnels: list[tuple[int, str]] = []
    upstream: tuple[str, int] | None = None
    tls = False
    while args and args[0].startswith(("--tunnel=", "--upstream=", "--upstream-tls")):
        option, _, value = args.pop(0).partition("=")
        if option == "--upstream-tls" and not value:
            tls = True
        elif option == "--tunnel":
            port, _, target = value.partition("=")
            if not port.isdigit() or not target:
                _usage()
            tunnels.append((int(port), target))
        else:
            host, _, port = value.rpartition(":")
            if not port.isdigit() or not host:
                _usage()
            upstream = (host.strip("[]"), int(port))
    if len(args) < 2 or args[0] != "--" or (tls and upstream is None):
        _usage()
    return tunnels, upstream, tls, args[1:]


def _usage() -> NoReturn:
    sys.stderr.write(
        "usage: forward.py [--upstream=HOST:PORT [--upstream-tls]] "
        "[--tunnel=PORT=HOST:PORT ...] -- PROGRAM [ARG...]\n"
        "(--upstream needs $ACPW_PROXY_TOKEN, --upstream-tls $ACPW_PROXY_CA)\n"
    )
    os._exit(2)


def _listen(port: int) -> _socket.socket:
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind((HOST, port))
    listener.listen(MAX_CONNECTIONS)
    return listener


def _daemon(listeners: list[tuple[_socket.socket, str | None]], route: _Route) -> None:
    # Leave the agent's stdio alone: holding its stdout open would hide its EOF.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    slots = _Slots(MAX_CONNECTIONS)
    for listener, target in listeners[1:]:
        _thread.start_new_thread(_accept, (listener, target, slots, route))
    _accept(*listeners[0], slots, route)


class _Slots:
    """At most ``size`` connections at a time (``threading.BoundedSemaphore``'s job, on
    ``_thread``'s lock: the relay imports nothing that is not built in)."""

    def __init__(self, size: int) -> None:
        self._lock = _thread.allocate_lock()
        self._free = size

    def take(self) -> bool:
        with self._lock:
            if self._free == 0:
                return False
            self._free -= 1
            return True

    def give(self) -> None:
        with self._lock:
            self._free += 1


def _accept(listener: _socket.socket, target: str | None, slots: _Slots, route: _Route) -> None:
    while True:
        fd, _ = listener._accept()  # type: ignore[attr-defined]  # what socket.accept wraps
        client = _socket.socket(fileno=fd)
        if not slots.take():
            client.close()
            continue
        _thread.start_new_thread(_serve, (client, target, slots, route))


def _serve(client: _socket.socket, target: str | None, slots: _Slots, route: _Route) -> None:
    upstream: Sock | None = None
    try:
        upstream = route.open()
        if target is not None and not _connect(upstream, target):
            return
        if route.tls is not None:
            _relay_tls(client, upstream)
            return
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_copy_then_release, (upstream, client, done))
        _copy(client, upstream)
        done.acquire()  # the other direction ended too
    except OSError:
        return
    finally:
        client.close()
        if upstream is not None:
            upstream.close()
        slots.give()


def _connect(upstream: Sock, target: str) -> bool:
    """Open the tunnel: ``CONNECT target``; True once the proxy answered 200 (its whole
    head read, nothing of the tunnel's bytes)."""
    upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = upstream.recv(1)
        if not byte or len(head) >= _MAX_REPLY_HEAD:
            return False
        head += byte
    return head.split(b" ", 2)[1:2] == [b"200"]


def _copy(src: Sock, dst: Sock) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
        dst.shutdown(_socket.SHUT_WR)
    except OSError:
        # One side failed: wake the other direction's recv so the connection ends.
        try:  # noqa: SIM105 - no contextlib here: the relay imports nothing not built in
            dst.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass


def _copy_then_release(src: Sock, dst: Sock, done: LockType) -> None:
    try:
        _copy(src, dst)
    finally:
        done.release()


def _relay_tls(client: _socket.socket, upstream: Sock) -> None:
    """Copy both ways between ``client`` and the TLS ``upstream``, in this one thread.

    TLS has no half-close, so the first side to end ends the connection once what it
    sent is delivered (the proxy's relay and the tools that use a proxy do not half-close
    either)."""
    import contextlib
    import selectors
    import ssl

    again = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
    client.setblocking(False)
    upstream.setblocking(False)
    to_up, to_client = bytearray(), bytearray()
    client_done = up_done = False
    pending = getattr(upstream, "pending", lambda: 0)
    with selectors.DefaultSelector() as selector:
        while not (client_done and not to_up) and not (up_done and not to_client):
            read_client = not client_done and len(to_up) < _CHUNK
            read_up = not up_done and len(to_client) < _CHUNK
            for sock, reading, writing in ((client, read_client, to_client),
                                           (upstream, read_up, to_up)):  # fmt: skip
                mask = (selectors.EVENT_READ if reading else 0) | (
                    selectors.EVENT_WRITE if writing else 0
                )
                if mask:
                    selector.register(sock, mask)
            try:
                # Bytes TLS already decrypted are not seen by select: do not wait then.
                selector.select(0 if read_up and pending() else None)
            finally:
                for sock in (client, upstream):
                    with contextlib.suppress(KeyError, ValueError):
                        selector.unregister(sock)
            try:
                client_done = client_done or (read_client and _pull(client, to_up, again))
                _push(upstream, to_up, again)
                up_done = up_done or (read_up and _pull(upstream, to_client, again))
                _push(client, to_client, again)
            except OSError:  # ssl.SSLError too: either side failed, the connection ends
                return


def _pull(sock: Sock, into: bytearray, again: tuple[type[OSError], ...]) -> bool:
    """Read what ``sock`` has into ``into``: True at its end (False: nothing yet)."""
    try:
        data = sock.recv(_CHUNK)
    except again:
        return False
    into += data
    return not data


def _push(sock: Sock, out: bytearray, again: tuple[type[OSError], ...]) -> None:
    """Send what ``sock`` takes of ``out`` now, and drop it from ``out``."""
    if out:
        try:
            del out[: sock.send(out)]
        except again:
            return


if __name__ == "__main__":
    main(sys.argv)
