"""What every fake model API shares: the script, the request log, the HTTP server thread.

A fake is a real HTTP server on 127.0.0.1 (an ephemeral port, its own thread) that the
real agent under test is pointed at. The test gives it a *script*: one :class:`Reply`
per *main* model request (a request that offers the agent's tools), consumed in order.
Requests that offer no tools are the agents' side calls (titles, summaries, routing
checks): they get :meth:`FakeModel.side_reply` and never consume the script. Every
request, answered or not, is recorded, so a test can assert what the agent sent (the
tool result, the model, the history). A path the fake does not know is recorded in
``unknown`` and answered 404, so a test sees it instead of guessing.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self
from urllib.parse import parse_qs, urlsplit

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The model asks the agent to run one of its tools with these arguments."""

    name: str
    arguments: JsonObject


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted model turn: some text, then tool calls (none: the turn ends)."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    #: Stream ``text`` but never finish: the response stays open (the model "thinking")
    #: until :meth:`FakeModel.release` (or :meth:`FakeModel.stop`), or until the client
    #: drops it, which the fake records (:attr:`FakeModel.dropped`).
    hang: bool = False


def say(text: str) -> Reply:
    return Reply(text=text)


def hang(text: str) -> Reply:
    """A reply that starts streaming ``text`` and then holds the response open."""
    return Reply(text=text, hang=True)


def call(name: str, **arguments: Any) -> Reply:
    return Reply(calls=(ToolCall(name, arguments),))


@dataclass(slots=True)
class Request:
    """One HTTP request the fake received, as sent."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    main: bool = False  # it consumed a scripted reply

    @property
    def text(self) -> str:
        """The whole body as JSON text: what a test searches for a tool result."""
        return json.dumps(self.body)


@dataclass(slots=True)
class Exchange:
    """What the handler answers: a JSON body, or SSE events (name, data) to stream."""

    status: int = 200
    body: Any = None
    events: list[tuple[str | None, JsonObject]] = field(default_factory=list)
    stream: bool = False
    hold: bool = False  # after the events, keep the response open (a hanging reply)


class FakeModel:
    """The server and script; subclasses implement one vendor's API in :meth:`handle`."""

    api: ClassVar[str] = ""

    def __init__(self, script: list[Reply] | None = None, *, side_reply: str = "OK") -> None:
        self.script: list[Reply] = list(script or [])
        self.side_reply = side_reply
        self.requests: list[Request] = []
        self.unknown: list[Request] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # Hanging replies: ``holding`` is set once a response is held open, ``dropped``
        # once a client closed a held response (the agent gave up on its model request);
        # ``release`` ends them.
        self._released = threading.Event()
        self.holding = threading.Event()
        self.dropped = threading.Event()

    # The script.

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def next_reply(self) -> Reply:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        self.errors.append("a main request arrived after the script ran out")
        return say("(the fake's script is exhausted)")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    @property
    def main_requests(self) -> list[Request]:
        return [r for r in self.requests if r.main]

    # The server.

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeModel:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.api}",
            daemon=True,
        )
        self._thread.start()
        return self

    def release(self) -> None:
        """End every held (hanging) response, now and from now on."""
        self._released.set()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # One vendor's API.

    def handle(self, request: Request) -> Exchange | None:
        """The answer to ``request``, or None for a path this API does not have."""
        raise NotImplementedError


def held(
    events: list[tuple[str | None, JsonObject]], last: str
) -> list[tuple[str | None, JsonObject]]:
    """A hanging reply's events: ``events`` up to the last one named ``last`` (the text
    streamed so far), nothing that would finish the response."""
    names = [name if name is not None else data.get("type") for name, data in events]
    cut = max(i for i, name in enumerate(names) if name == last)
    return events[: cut + 1]


def sse(events: list[tuple[str | None, JsonObject]]) -> Iterator[bytes]:
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {json.dumps(data)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    owner: ClassVar[FakeModel]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Quiet: the request log is the record."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        split = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=split.path,
            query=parse_qs(split.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        owner = self.owner
        with owner._lock:
            owner.requests.append(request)
        try:
            answer = owner.handle(request)
        except Exception as exc:
            owner.errors.append(f"{request.method} {request.path}: {exc!r}")
            answer = Exchange(status=500, body={"error": {"message": repr(exc)}})
        if answer is None:
            with owner._lock:
                owner.unknown.append(request)
            answer = Exchange(status=404, body={"error": {"message": "not in the fake"}})
        if answer.stream:
            self.send_response(answer.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in sse(answer.events):
                self.wfile.write(chunk)
                self.wfile.flush()
            if answer.hold:
                self._hold()
            self.close_connection = True
            return
        data = json.dumps(answer.body if answer.body is not None else {}).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _hold(self) -> None:
        """Keep a streamed response open until the fake is released or the client closes
        the connection (recorded in ``dropped``)."""
        owner = self.owner
        owner.holding.set()
        conn = self.connection
        while not owner._released.is_set():
            readable, _, _ = select.select([conn], [], [], 0.05)
            if not readable:
                continue
            try:
                peeked = conn.recv(1, socket.MSG_PEEK)
            except OSError:
                peeked = b""
            if not peeked:
                owner.dropped.set()
                return
            conn.recv(65536)  # the client sent more (nothing expected): drop it
