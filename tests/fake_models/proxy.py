"""A recording HTTP(S) proxy that forwards nothing: which hosts does an agent try to reach?

Point an agent's ``HTTPS_PROXY``/``HTTP_PROXY`` at it (``NO_PROXY`` keeping 127.0.0.1 for
the fake model): every ``CONNECT host:port`` or absolute-URI request is recorded in
``attempts`` and refused 403. All three agents honour these variables (claude's native
binary, codex's Rust client and git, gemini-cli's Node client), so what it records is
what each would contact besides the model endpoint.
"""

from __future__ import annotations

import socketserver
import threading
from typing import ClassVar


class RecordingProxy:
    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._lock = threading.Lock()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the proxy is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self) -> dict[str, str]:
        """Proxy variables for an agent (both spellings; NO_PROXY is the caller's)."""
        names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
        return dict.fromkeys(names, self.url) | {n.lower(): self.url for n in names}

    def start(self) -> RecordingProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def record(self, line: str) -> None:
        with self._lock:
            self.attempts.append(line)


class _Handler(socketserver.StreamRequestHandler):
    owner: ClassVar[RecordingProxy]

    def handle(self) -> None:
        line = self.rfile.readline(8192).decode("latin-1").strip()
        while (header := self.rfile.readline(8192)) not in {b"", b"\r\n", b"\n"}:
            del header
        if line:
            method, _, rest = line.partition(" ")
            self.owner.record(f"{method} {rest.rsplit(' ', 1)[0]}")
        self.wfile.write(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
