"""A wire tap on the agent's stdout, through the sandbox backend seam.

``TappedBackend`` wraps a real backend (here: bubblewrap) and hands the runner sandboxes
whose first spawned process (the agent) has its stdout copied, byte for byte, before the
worker reads it. The runner, the connection and the normalizer are the production ones:
the tap only observes, so a test can compare what the agent sent with what the worker
made of it. Every other attribute (``admission_view``, ``status``, …) is the wrapped
object's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.sandbox.base import WORKSPACE, Sandbox, SandboxBackend, SandboxInfo, SandboxSpec

_CHUNK = 64 * 1024


@dataclass(slots=True)
class WireTap:
    """What the agent wrote to its stdout, split into lines."""

    data: bytearray = field(default_factory=bytearray)
    _grew: list[asyncio.Event] = field(default_factory=list)

    def feed(self, chunk: bytes) -> None:
        """Append what the agent wrote and wake whoever waits in :meth:`until`."""
        self.data += chunk
        waiters, self._grew = self._grew, []
        for waiter in waiters:
            waiter.set()

    async def until(self, done: Callable[[WireTap], bool], *, timeout: float) -> bool:
        """Wait until ``done(self)`` holds (checked as the agent writes); False after
        ``timeout`` seconds without it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done(self):
            waiter = asyncio.Event()
            self._grew.append(waiter)
            try:
                await asyncio.wait_for(waiter.wait(), deadline - loop.time())
            except TimeoutError:
                return done(self)
        return True

    def messages(self) -> list[dict[str, Any]]:
        """Every complete line that parses as a JSON object, in order."""
        out = []
        for line in bytes(self.data).split(b"\n"):
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    out.append(message)
        return out

    def session_updates(self) -> list[dict[str, Any]]:
        """The ``params`` of every ``session/update`` notification (no ``id``)."""
        return [
            m.get("params") or {}
            for m in self.messages()
            if m.get("method") == "session/update" and "id" not in m
        ]


class _TappedProcess:
    """The agent process with its stdout copied into the tap on the way."""

    def __init__(self, inner: Any, tap: WireTap, limit: int) -> None:
        self._inner = inner
        self._tap = tap
        self._stdout = asyncio.StreamReader(limit=limit)
        self._pump = asyncio.create_task(self._copy(), name="wiretap")

    async def _copy(self) -> None:
        try:
            while chunk := await self._inner.stdout.read(_CHUNK):
                self._tap.feed(chunk)
                self._stdout.feed_data(chunk)
        finally:
            self._stdout.feed_eof()

    @property
    def stdout(self) -> asyncio.StreamReader:
        return self._stdout

    async def wait(self) -> int:
        code: int = await self._inner.wait()
        with contextlib.suppress(asyncio.TimeoutError):  # the pipe's last bytes
            await asyncio.wait_for(asyncio.shield(self._pump), 5)
        return code

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TappedSandbox:
    def __init__(self, inner: Sandbox, tap: WireTap) -> None:
        self._inner = inner
        self._tap = tap
        self._tapped = False

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> Any:
        process = await self._inner.spawn(argv, env=env, cwd=cwd, stdout_limit=stdout_limit)
        if self._tapped:  # terminals and tools the agent starts: not the ACP wire
            return process
        self._tapped = True
        return _TappedProcess(process, self._tap, stdout_limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TappedBackend:
    """``inner`` with the agent's stdout of every sandbox it creates copied into ``tap``."""

    def __init__(self, inner: SandboxBackend, tap: WireTap) -> None:
        self.name = inner.name
        self._inner = inner
        self.tap = tap

    async def create(self, spec: SandboxSpec) -> Any:
        return _TappedSandbox(await self._inner.create(spec), self.tap)

    async def destroy(self, sandbox_id: str) -> None:
        await self._inner.destroy(sandbox_id)

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        return await self._inner.list(labels)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
