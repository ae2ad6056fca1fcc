"""One exec WebSocket of the official client as asyncio streams.

The client's ``WSClient`` is blocking: a reader thread runs its ``update`` loop and feeds
stdout (channel 1) and stderr (channel 2) into ``asyncio.StreamReader``\\ s; the final
``Status`` (channel 3) becomes the exit status, and a stream that ends without one was
lost (``None``: the connection broke; what the program did is unknown). stdin (channel
0) is an ``asyncio.StreamWriter`` over a transport whose writes a sender thread puts on
the socket in order; closing it sends v5's close of channel 0, the program's EOF (a
server that negotiated v4 has no EOF: ``stdin_eof`` is False, and the shutdown escalates
to a signal). The sender thread also pings every ``ping_s`` while the stream lives, so
an idle program's stream outlives a load balancer's idle cut-off (kubectl's WebSocket
executor pings every 5 s; the Python client sends none of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from typing import Any

STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
V5 = "v5.channel.k8s.io"
_EOF, _STOP = object(), object()


def exit_code(status: bytes) -> int | None:
    """The exit code a channel-3 ``Status`` says; None when there is none (the stream
    was lost) or it names no exit code."""
    try:
        data = json.loads(status) if status else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("status") == "Success":
        return 0
    for cause in (data.get("details") or {}).get("causes") or []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(str(cause.get("message")))
    return None


def has_eof(ws: Any) -> bool:
    """Whether closing stdin reaches the program as EOF (``v5.channel.k8s.io``)."""
    return getattr(ws, "subprotocol", None) == V5


class _StdinTransport(asyncio.WriteTransport):
    """Writes go to channel 0 in order (a sender thread); ``close`` is stdin's EOF; the
    same thread pings every ``ping_s`` until ``stop``."""

    def __init__(self, ws: Any, ping_s: float) -> None:
        super().__init__()
        self._ws, self._ping_s = ws, ping_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(target=self._send, name="k8s-stdin", daemon=True)
        self._thread.start()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing and data:
            self._queue.put(bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._queue.put(_EOF)

    def is_closing(self) -> bool:
        return self._closing

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0

    def stop(self) -> None:
        """The stream ended: no more writes nor pings."""
        self._closing = True
        self._queue.put(_STOP)

    def _send(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._ping_s)
            except queue.Empty:
                item = None
            try:
                if item is _STOP:
                    return
                if item is None:
                    self._ws.sock.ping()
                elif item is _EOF:
                    self._ws.close_channel(STDIN)
                else:
                    self._ws.write_channel(STDIN, item)
            except Exception:  # the stream is gone: later writes are moot
                return


class StdinWriter(asyncio.StreamWriter):
    """stdin of an exec'd program: ``close`` is its EOF; nothing to wait for after."""

    async def wait_closed(self) -> None:
        return None


class ExecStream:
    """The three streams and the exit status of one exec'd program."""

    def __init__(self, ws: Any, *, stdout_limit: int, ping_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._ws, self._loop = ws, loop
        self.stdout = asyncio.StreamReader(limit=stdout_limit)
        self.stderr = asyncio.StreamReader(limit=stdout_limit)
        #: The exit code; None: the stream ended without a ``Status`` (lost).
        self.status: asyncio.Future[int | None] = loop.create_future()
        #: Closing stdin is the program's EOF (v5); False on a v4 server.
        self.stdin_eof = has_eof(ws)
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
        self._transport = _StdinTransport(ws, ping_s)
        self.stdin = StdinWriter(self._transport, protocol, None, loop)
        self._thread = threading.Thread(target=self._read, name="k8s-exec", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        status = b""
        try:
            while self._ws.is_open():
                self._ws.update(timeout=0.5)
                for channel, reader in ((STDOUT, self.stdout), (STDERR, self.stderr)):
                    if data := self._ws.read_channel(channel):
                        self._loop.call_soon_threadsafe(reader.feed_data, data)
                status += self._ws.read_channel(ERROR)
        except Exception:  # noqa: S110 - a broken stream ends like a closed one
            pass
        finally:
            self._finish(exit_code(status))

    def _finish(self, code: int | None) -> None:
        self._transport.stop()
        with contextlib.suppress(Exception):
            self._ws.close()
        with contextlib.suppress(Exception):
            self._ws.sock.shutdown()  # close() leaves it open once the server closed first

        def done() -> None:
            self.stdin.close()  # the program ended: its stdin is moot
            self.stdout.feed_eof()
            self.stderr.feed_eof()
            if not self.status.done():
                self.status.set_result(code)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(done)

    def abort(self) -> None:
        """Close the WebSocket (the reader thread then ends)."""
        with contextlib.suppress(Exception):
            self._ws.sock.shutdown()
