"""The server side of RFC 6455, as much as the Kubernetes stream protocols use: the
opening handshake, unfragmented or fragmented binary/text messages, ping/pong, close.

Frames from the client are masked (the RFC requires it, websocket-client does it);
frames to the client are not. ``last_active`` is when a frame last passed either way
(what a load balancer's idle timer counts); ``abort`` drops the connection as one does
at its idle cut-off: no close frame, the socket shut.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import struct
import threading
import time
from typing import BinaryIO

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: Largest message the double accepts from a client (a stdin chunk, a tar of a workspace
#: is sent in many).
MAX_MESSAGE = 16 * 1024 * 1024


class ProtocolError(Exception):
    """The peer broke the framing rules."""


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


class Connection:
    """One upgraded connection: ``recv`` messages (one reader thread), ``send`` from any
    thread."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO, sock: socket.socket | None = None) -> None:
        self._rfile, self._wfile, self._sock = rfile, wfile, sock
        self._lock = threading.Lock()
        self.closed = False
        self.last_active = time.monotonic()

    def abort(self) -> None:
        """Drop the connection without a close frame (a load balancer's idle cut-off)."""
        with self._lock:
            self.closed = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def send(self, payload: bytes, opcode: int = OP_BINARY) -> None:
        """One unmasked, final frame; a closed connection drops it."""
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._lock:
            if self.closed:
                return
            try:
                self._wfile.write(head + payload)
                self._wfile.flush()
                self.last_active = time.monotonic()
            except OSError:
                self.closed = True

    def close(self, code: int = 1000) -> None:
        self.send(struct.pack("!H", code), OP_CLOSE)
        self.closed = True

    def recv(self) -> bytes | None:
        """The next data message, or None once the client closed (or the link broke).

        Raises:
            ProtocolError: an unmasked or oversized frame.
        """
        message = b""
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode == OP_CLOSE:
                self.close()
                return None
            if opcode == OP_PING:
                self.send(payload, OP_PONG)
                continue
            if opcode == OP_PONG:
                continue
            message += payload
            if len(message) > MAX_MESSAGE:
                raise ProtocolError("message too large")
            if fin:
                return message

    def _frame(self) -> tuple[bool, int, bytes] | None:
        head = self._read(2)
        if head is None:
            return None
        fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
        if not head[1] & 0x80:
            raise ProtocolError("a client frame must be masked")
        size = head[1] & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._read(2) or b"\0\0")[0]
        elif size == 127:
            size = struct.unpack("!Q", self._read(8) or b"\0" * 8)[0]
        if size > MAX_MESSAGE:
            raise ProtocolError("frame too large")
        mask = self._read(4)
        data = self._read(size) if size else b""
        if mask is None or data is None:
            return None
        self.last_active = time.monotonic()
        return fin, opcode, _unmask(data, mask)

    def _read(self, n: int) -> bytes | None:
        try:
            data = self._rfile.read(n)
        except OSError:
            return None
        return data if len(data) == n else None


def _unmask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
