"""The agent process: its JSON-RPC connection, its drained stderr, its shutdown.

Shutdown escalates (some agents ignore stdin EOF, Cursor can take over 5 s to exit):
close stdin → wait ``eof_grace`` → SIGTERM the process group → wait ``term_grace`` →
SIGKILL the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from worker.rpc.connection import (
    Connection,
    MalformedHandler,
    NotificationHandler,
    OversizeHandler,
    StrayReplyHandler,
)
from worker.sandbox.base import SandboxProcess

#: Bound on reading what an exited agent left in its stdout pipe.
_DRAIN_S = 2.0

PREVIEW_BYTES = 4 * 1024


class StderrBuffer:
    """Keeps the last ``limit`` bytes of the agent's stderr (drained continuously)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        self.total += len(chunk)
        while self._size > self._limit and self._chunks:
            dropped = self._chunks.popleft()
            self._size -= len(dropped)

    def preview(self, limit: int = PREVIEW_BYTES) -> str:
        """The last ``limit`` bytes as text (what diagnostics show)."""
        data = b"".join(self._chunks)[-limit:]
        return data.decode("utf-8", "replace")


class AgentProcess:
    """Owns one agent process and the connection to it."""

    def __init__(
        self,
        process: SandboxProcess,
        *,
        line_limit: int,
        request_timeout: float,
        stderr_limit: int,
        on_notification: NotificationHandler | None = None,
        on_malformed: MalformedHandler | None = None,
        on_oversize: OversizeHandler | None = None,
        on_stray_reply: StrayReplyHandler | None = None,
    ) -> None:
        self.process = process
        self.stderr = StderrBuffer(stderr_limit)
        self.connection = Connection(
            process.stdout,
            process.stdin,
            line_limit=line_limit,
            request_timeout=request_timeout,
            on_notification=on_notification,
            on_malformed=on_malformed,
            on_oversize=on_oversize,
            on_stray_reply=on_stray_reply,
        )
        self._stderr_task: asyncio.Task[None] | None = None
        #: ``shutdown`` had to signal it: its exit status is then ours, not its own.
        self.signalled = False

    def start(self) -> None:
        self.connection.start()
        self._stderr_task = asyncio.create_task(self._drain_stderr(), name="agent-stderr")

    async def _drain_stderr(self) -> None:
        while chunk := await self.process.stderr.read(65536):
            self.stderr.add(chunk)

    async def shutdown(self, *, eof_grace: float, term_grace: float) -> int:
        """Stop the agent, escalating as needed; returns its exit status."""
        with contextlib.suppress(ConnectionError, RuntimeError, OSError):
            self.process.stdin.close()
        code = await self._wait(eof_grace)
        if code is None:
            self.signalled = True
            self.process.terminate()
            code = await self._wait(term_grace)
        if code is None:
            self.process.kill()
            code = await self.process.wait()
        # What the agent wrote before it exited may still be in the pipe: let the reader
        # reach EOF (bounded: a stray child may hold stdout open) before closing.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.connection.closed), _DRAIN_S)
        await self.connection.aclose()
        if self._stderr_task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stderr_task, 1.0)
        return code

    async def _wait(self, seconds: float) -> int | None:
        try:
            return await asyncio.wait_for(self.process.wait(), seconds)
        except TimeoutError:
            return None
