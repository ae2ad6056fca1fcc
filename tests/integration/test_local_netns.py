"""The proxy's listeners made in another network namespace
(worker/sandbox/local/netns.py), on the real kernel: a namespace held by a real process
(``unshare -n``), the sockets bound there by the worker, reached from inside it and not
from the worker's own. Needs root (joining another network namespace does), as the local
backend's path that uses it does; the full path, through bubblewrap and the proxy, is
``test_network.py``'s ``test_a_root_worker_serves_the_proxy_port_itself_no_forwarder_runs``.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from worker.sandbox.local import netns

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="joining a network namespace needs root"),
]


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a network namespace of its own whose loopback comes up 50 ms late,
    as a sandbox's may be down when bubblewrap reports its pid."""
    proc = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", "sleep 0.05; ip link set lo up; exec sleep 30"]
    )
    try:
        deadline = time.monotonic() + 5
        own = os.stat("/proc/self/ns/net").st_ino
        while os.stat(f"/proc/{proc.pid}/ns/net").st_ino == own:  # until unshare ran
            assert time.monotonic() < deadline
            time.sleep(0.001)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _inside(pid: int, port: int) -> str:
    """Connect to 127.0.0.1:``port`` from inside ``pid``'s network namespace."""
    code = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); "
        "print(s.recv(5).decode())"
    )
    done = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout.strip() or done.stderr.strip()


def _free_port() -> int:
    """A port nothing listens on in the worker's own namespace (just now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_listeners_are_made_in_the_namespace_and_only_there(
    holder: subprocess.Popen[bytes],
) -> None:
    port = _free_port()
    before = os.stat("/proc/thread-self/ns/net").st_ino
    [listener] = netns.listen_in(holder.pid, [port])  # its loopback was still down
    try:
        # This thread never left: a thread of its own went in, and ended there.
        assert os.stat("/proc/thread-self/ns/net").st_ino == before
        assert listener.getsockname() == ("127.0.0.1", port)
        with socket.socket() as probe:  # not on the worker's own loopback
            assert probe.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED
        listener.setblocking(True)
        listener.settimeout(10)

        def serve_once() -> None:
            conn, _ = listener.accept()
            conn.sendall(b"hello")
            conn.close()

        server = threading.Thread(target=serve_once)
        server.start()
        assert _inside(holder.pid, port) == "hello"  # but from inside the namespace
        server.join(10)
    finally:
        listener.close()


def test_the_workers_own_namespace_is_refused() -> None:
    with pytest.raises(OSError, match="shares the worker's network namespace") as raised:
        netns.listen_in(os.getpid(), [0])
    assert raised.value.errno == errno.EPERM


def test_a_process_gone_is_an_error_and_leaves_nothing_open() -> None:
    proc = subprocess.Popen(["unshare", "-n", "true"])
    proc.wait()
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        netns.listen_in(proc.pid, [3128])
    assert set(os.listdir("/proc/self/fd")) <= before
