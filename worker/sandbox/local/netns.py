"""The proxy's listeners inside a sandbox's network namespace, made by the worker.

Under ``allowlist`` a sandbox's only network is its own loopback, and its tools find the
proxy at ``127.0.0.1:3128`` (``worker.network.proxy_env``), plus one port per tunnel.
A root worker makes those listening sockets itself, in the sandbox's namespace, before
the sandbox runs anything (``worker.sandbox.local.process``: between bubblewrap's report
of the sandbox's pid, by which it has brought the loopback up, and the gate that lets it
go on), and serves them from the proxy (``AllowlistProxy.front``): no relay runs inside.
A thread of its own enters the namespace (``setns``, which moves only the calling
thread), makes the sockets and ends there: no thread of the worker ever comes back from
a sandbox's namespace to do anything else. A socket keeps the namespace it was made in:
the sockets accept there and nowhere else, and keep that namespace alive until they are
closed (the proxy closes them once the process they were made for has exited).

Joining another network namespace needs ``CAP_SYS_ADMIN`` in the worker's own user
namespace as well as the sandbox's: a worker that is not root keeps the in-sandbox
forwarder (``worker/network/forward.py``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Final

CLONE_NEWNET: Final = 0x40000000
LOOPBACK: Final = "127.0.0.1"
BACKLOG: Final = 128
#: How long a bind waits for the sandbox to bring its loopback up (``_bind``).
LOOPBACK_WAIT_S: Final = 2.0


def listen_in(pid: int, ports: Sequence[int]) -> list[socket.socket]:
    """Listening TCP sockets on ``127.0.0.1:<port>``, one per port, in the network
    namespace of ``pid``; non-blocking, close-on-exec.

    Raises:
        OSError: the namespace could not be entered (``pid`` gone, no privilege) or a
            port could not be bound; no socket is left open then.
    """
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def enter_and_listen() -> None:
        try:
            _enter(pid)
            for port in ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                made.append(sock)
                _bind(sock, port)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError as exc:
            failed.append(exc)

    # Its own thread, never reused: it ends in the sandbox's namespace.
    thread = threading.Thread(target=enter_and_listen, name="acpw-netns", daemon=True)
    thread.start()
    thread.join()
    if failed or len(made) != len(ports):
        for sock in made:
            sock.close()
        raise failed[0] if failed else OSError("the sandbox's listeners were not made")
    return made


def _bind(sock: socket.socket, port: int) -> None:
    """Bind ``sock`` to ``127.0.0.1:port`` once the namespace's loopback is up.

    bubblewrap reports the sandbox's pid as soon as it cloned it, and the sandbox brings
    its loopback up right after (before it waits at the gate): until then the address is
    not there (``EADDRNOTAVAIL``), so the bind is tried again, for at most
    :data:`LOOPBACK_WAIT_S`.

    Raises:
        OSError: the bind failed otherwise, or the loopback stayed down.
    """
    deadline = time.monotonic() + LOOPBACK_WAIT_S
    pause = 0.0001
    while True:
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() >= deadline:
                raise
        else:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.005)


def _enter(pid: int) -> None:
    """Move the calling thread into ``pid``'s network namespace.

    Raises:
        OSError: it could not, or that namespace is the worker's own (a pid reused by
            the time it was opened, or a sandbox that did not get a namespace of its own).
    """
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino == os.stat("/proc/thread-self/ns/net").st_ino:
            # Not a sandbox's own: never listen for it where the worker lives.
            raise OSError(errno.EPERM, f"process {pid} shares the worker's network namespace")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of {pid}: {os.strerror(err)}")
    finally:
        os.close(fd)


__all__ = ["listen_in"]
