"""Inside the sandbox: a TCP listener on 127.0.0.1 relaying to the proxy's Unix socket.

Most tools speak TCP to a proxy (``HTTPS_PROXY=http://127.0.0.1:3128``), but the sandbox's
only way out is the Unix socket bound at ``SOCKET``. This script is bound read-only into
the sandbox and run by it in front of the agent (stdlib only, ``python3 -I -S``):

    python3 -I -S /run/acpw/forward.py [--upstream=HOST:PORT] [--tunnel=PORT=HOST:PORT ...] \
        -- AGENT ARGV...

With ``--upstream`` (a sandbox that cannot be given the socket: a Kubernetes pod) each
connection goes to the proxy at ``HOST:PORT`` over TCP instead, and starts with the
line ``ACPW-TOKEN <token>`` — the job's identity, read from ``$ACPW_PROXY_TOKEN``, which
is removed from the environment before the agent is exec'd.

Each ``--tunnel`` adds a listener on ``127.0.0.1:PORT`` whose connections go to the proxy
already opened: the relay sends ``CONNECT HOST:PORT`` itself and, once the proxy answers
``200``, copies bytes both ways, so a program that speaks plain HTTP to that port reaches
``HOST:PORT`` (a plain-HTTP model endpoint the proxy allows) without knowing of a proxy.

It binds and listens first (so the port is ready before the agent runs), double-forks a
relay daemon — adopted by the sandbox's init, so it dies with the sandbox — and then
``exec``\\ s the agent in its own process (same pid, same stdio). The relay copies bytes
both ways, one thread per direction, for at most ``MAX_CONNECTIONS`` connections at a
time. It knows nothing of the policy: the host-side proxy decides everything.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from typing import NoReturn

SOCKET = "/run/acpw/proxy.sock"
#: The variable the token of ``--upstream`` comes in (never passed on to the agent).
TOKEN_ENV = "ACPW_PROXY_TOKEN"  # noqa: S105 - a variable's name, not a secret
#: The line each TCP connection to the proxy starts with, then the token and CRLF.
TOKEN_PREFIX = b"ACPW-TOKEN "
HOST, PORT = "127.0.0.1", 3128
MAX_CONNECTIONS = 64
_CHUNK = 65536
_MAX_REPLY_HEAD = 8192


def main(argv: list[str]) -> None:
    tunnels, upstream, program = _parse(argv[1:])
    token = os.environ.pop(TOKEN_ENV, "")
    if upstream is not None and not token:
        _usage()
    route = _Route(upstream, token)
    listeners: list[tuple[socket.socket, str | None]] = [(_listen(PORT), None)]
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
    job's token first."""

    def __init__(self, upstream: tuple[str, int] | None, token: str) -> None:
        self.upstream, self.token = upstream, token

    def open(self) -> socket.socket:
        if self.upstream is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(SOCKET)
            except OSError:
                sock.close()
                raise
            return sock
        sock = socket.create_connection(self.upstream, timeout=30)
        sock.settimeout(None)
        sock.sendall(TOKEN_PREFIX + self.token.encode() + b"\r\n")
        return sock


def _parse(args: list[str]) -> tuple[list[tuple[int, str]], tuple[str, int] | None, list[str]]:
    tunnels: list[tuple[int, str]] = []
    upstream: tuple[str, int] | None = None
    while args and args[0].startswith(("--tunnel=", "--upstream=")):
        option, _, value = args.pop(0).partition("=")
        if option == "--tunnel":
            port, _, target = value.partition("=")
            if not port.isdigit() or not target:
                _usage()
            tunnels.append((int(port), target))
        else:
            host, _, port = value.rpartition(":")
            if not port.isdigit() or not host:
                _usage()
            upstream = (host.strip("[]"), int(port))
    if len(args) < 2 or args[0] != "--":
        _usage()
    return tunnels, upstream, args[1:]


def _usage() -> NoReturn:
    sys.stderr.write(
        "usage: forward.py [--upstream=HOST:PORT] [--tunnel=PORT=HOST:PORT ...] "
        "-- PROGRAM [ARG...]\n(--upstream needs $ACPW_PROXY_TOKEN)\n"
    )
    os._exit(2)


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, port))
    listener.listen(MAX_CONNECTIONS)
    return listener


def _daemon(listeners: list[tuple[socket.socket, str | None]], route: _Route) -> None:
    # Leave the agent's stdio alone: holding its stdout open would hide its EOF.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    for listener, target in listeners[1:]:
        args = (listener, target, slots, route)
        threading.Thread(target=_accept, args=args, daemon=True).start()
    _accept(*listeners[0], slots, route)


def _accept(
    listener: socket.socket, target: str | None, slots: threading.BoundedSemaphore, route: _Route
) -> None:
    while True:
        client, _ = listener.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        args = (client, target, slots, route)
        threading.Thread(target=_serve, args=args, daemon=True).start()


def _serve(
    client: socket.socket, target: str | None, slots: threading.BoundedSemaphore, route: _Route
) -> None:
    upstream: socket.socket | None = None
    try:
        with contextlib.suppress(OSError):
            upstream = route.open()
            if target is not None and not _connect(upstream, target):
                return
            back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
            back.start()
            _copy(client, upstream)
            back.join()
    finally:
        client.close()
        if upstream is not None:
            upstream.close()
        slots.release()


def _connect(upstream: socket.socket, target: str) -> bool:
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


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        # One side failed: wake the other direction's recv so the connection ends.
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)


if __name__ == "__main__":
    main(sys.argv)
