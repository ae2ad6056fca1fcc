"""The agent's side of an ACP connection, for tests that look at what the worker sends.

Shared by ``test_acp_wire`` (the exact bytes) and ``test_acp_schema`` (the same objects
checked against the protocol's schema models).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.acp_sessions import SessionsClient
from worker.acp.client import AcpClient
from worker.events.models import EventData
from worker.rpc.connection import Connection
from worker.sandbox.fake import FakeProcess

Answer = Callable[[dict[str, Any]], Any]


class Agent:
    """The far side: records every raw line and answers requests with ``answer``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.lines: list[bytes] = []

    async def serve_one(self, answer: Answer) -> None:
        line = await asyncio.wait_for(self.reader.readline(), 5)
        self.lines.append(line)
        message = json.loads(line)
        if "id" in message:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
            self.writer.write(json.dumps(reply).encode() + b"\n")
            await self.writer.drain()


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[AcpClient, Agent]]:
    """A client on a real :class:`Connection` over a socket pair, and its agent."""
    left, right = socket.socketpair()
    r1, w1 = await asyncio.open_connection(sock=left)
    r2, w2 = await asyncio.open_connection(sock=right)
    conn = Connection(r1, w1, request_timeout=5)
    conn.start()
    try:
        yield SessionsClient(conn), Agent(r2, w2)
    finally:
        await conn.aclose()
        w1.close()
        w2.close()


async def exchange(agent: Agent, call: Awaitable[Any], answer: Answer) -> tuple[bytes, Any]:
    """Run ``call`` while the agent answers the one request it makes."""
    task = asyncio.ensure_future(call)
    await agent.serve_one(answer)
    return agent.lines[-1], await task


def answering(value: Any) -> Answer:
    """An answer that is always ``value``."""
    return lambda _message: value


class HostSandbox:
    """Just enough of a sandbox for ``Terminals``: host subprocesses in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def spawn(self, argv: Any, *, env: Any, cwd: str = "/workspace") -> FakeProcess:
        del cwd
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=self.root,
            start_new_session=True,
        )
        return FakeProcess(proc)


class Events:
    """An ``emit`` that records what it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, event: EventData) -> None:
        self.seen.append((event.TYPE, event.wire()))


PERMISSION: dict[str, Any] = {
    "sessionId": "s",
    "toolCall": {"toolCallId": "t1", "title": "`echo hi`", "kind": "execute"},
    "options": [
        {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "allow-always", "name": "Allow always", "kind": "allow_always"},
        {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
    ],
}
