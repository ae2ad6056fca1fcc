"""Inside the sandbox: a TCP listener on 127.0.0.1 relaying to the proxy's Unix socket.

Most tools speak TCP to a proxy (``HTTPS_PROXY=http://127.0.0.1:3128``), but the sandbox's
only way out is the Unix socket bound at ``SOCKET``. This script is bound read-only into
the sandbox and run by it in front of the agent (stdlib only, ``python3 -I -S``):

    python3 -I -S /run/acpw/forward.py -- AGENT ARGV...

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

SOCKET = "/run/acpw/proxy.sock"
HOST, PORT = "127.0.0.1", 3128
MAX_CONNECTIONS = 64
_CHUNK = 65536


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: forward.py -- PROGRAM [ARG...]\n")
        os._exit(2)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, PORT))
    listener.listen(MAX_CONNECTIONS)
    if os.fork() == 0:
        if os.fork() == 0:
            _daemon(listener)
        os._exit(0)
    os.wait()
    listener.close()
    program = argv[2:]
    try:
        os.execvp(program[0], program)  # noqa: S606 - the sandbox's own argv, not a shell
    except OSError as exc:
        sys.stderr.write(f"acpw: cannot exec {program[0]}: {exc}\n")
        os._exit(127)


def _daemon(listener: socket.socket) -> None:
    # Leave the agent's stdio alone: holding its stdout open would hide its EOF.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        client, _ = listener.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        threading.Thread(target=_serve, args=(client, slots), daemon=True).start()


def _serve(client: socket.socket, slots: threading.BoundedSemaphore) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(OSError):
            upstream.connect(SOCKET)
            back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
            back.start()
            _copy(client, upstream)
            back.join()
    finally:
        client.close()
        upstream.close()
        slots.release()


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
