"""A real smart-HTTP Git server on loopback, for the git workspace tests.

``git http-backend`` runs as a CGI program behind a small threaded HTTP server that
records every request it receives (path and ``Authorization`` header), can answer every
request with a redirect to another server instead, and can send its responses slowly (so
a client that is stopped mid-fetch is stopped mid-response, whatever the machine's
speed).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
_CHUNK = 16 * 1024


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    authorization: str | None


@dataclass(slots=True)
class GitHttpServer:
    """Serves the repositories under ``root`` at ``url``/<name>."""

    root: Path
    #: Answer every request with a 302 to this base URL (plus the request's path).
    redirect_to: str | None = None
    #: Pause between 16 KiB chunks of a response body.
    chunk_delay: float = 0.0
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    #: Response bytes sent, and whether a client went away in the middle of one.
    sent: int = 0
    aborted: bool = False


@contextmanager
def serve(
    root: Path, *, redirect_to: str | None = None, chunk_delay: float = 0.0
) -> Iterator[GitHttpServer]:
    """Run a :class:`GitHttpServer` on 127.0.0.1 for the duration of the block."""
    state = GitHttpServer(root, redirect_to=redirect_to, chunk_delay=chunk_delay)
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _Handler(BaseHTTPRequestHandler):
    state: GitHttpServer

    def log_message(self, fmt: str, *args: Any) -> None:
        pass  # the test reads `state.seen`, not stderr

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        self.state.seen.append(Seen(self.command, self.path, self.headers.get("Authorization")))
        if self.state.redirect_to is not None:
            self.send_response(302)
            self.send_header("Location", self.state.redirect_to + self.path)
            self.end_headers()
            return
        body = self._body()
        with subprocess.Popen(
            [HTTP_BACKEND], env=self._cgi_env(body), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        ) as cgi:  # fmt: skip
            assert cgi.stdin is not None
            assert cgi.stdout is not None
            cgi.stdin.write(body)
            cgi.stdin.close()
            try:
                self._relay(cgi.stdout)
            except (BrokenPipeError, ConnectionResetError):
                self.state.aborted = True
                cgi.kill()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _cgi_env(self, body: bytes) -> dict[str, str]:
        path, _, query = self.path.partition("?")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/nonexistent",
            "GIT_PROJECT_ROOT": str(self.state.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
        }
        if encoding := self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = encoding
        if protocol := self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = protocol
        return env

    def _relay(self, out: IO[bytes]) -> None:
        status = 200
        headers = []
        while (line := out.readline().rstrip(b"\r\n")) != b"":
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            else:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        while chunk := out.read(_CHUNK):
            self.wfile.write(chunk)
            self.wfile.flush()
            self.state.sent += len(chunk)
            if self.state.chunk_delay:
                time.sleep(self.state.chunk_delay)
