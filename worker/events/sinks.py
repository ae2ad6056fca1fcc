"""Where canonical events go: the ``EventSink`` seam and its implementations.

A sink receives each event already serialized (one JSON line, redacted) together with
its dict form. ``JsonlSink`` writes lines to a file or stdout, ``RedisStreamSink`` appends
to the job's Redis Stream, ``MemorySink`` keeps them for tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import IO, Any, Protocol

import redis.asyncio as aioredis
import redis.exceptions

from worker import keys
from worker.errors import SinkUnavailable


class EventSink(Protocol):
    async def write(self, event: Mapping[str, Any], line: str) -> None:
        """Accept one event; may buffer. Order of calls is the order of events."""
        ...

    async def close(self) -> None:
        """Flush everything accepted so far.

        Raises:
            SinkUnavailable: buffered events could not be delivered.
        """
        ...


class MemorySink:
    """Keeps events in a list (test double and in-process consumers)."""

    def __init__(self) -> None:
        self.events: list[Mapping[str, Any]] = []
        self.lines: list[str] = []

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        self.events.append(event)
        self.lines.append(line)

    async def close(self) -> None:
        return None


class JsonlSink:
    """One JSON object per line to a text stream (stdout with ``--json``, or a file)."""

    def __init__(self, stream: IO[str], *, flush_each: bool = True) -> None:
        self._stream = stream
        self._flush_each = flush_each

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        self._stream.write(line + "\n")
        if self._flush_each:
            self._stream.flush()

    async def close(self) -> None:
        self._stream.flush()


class RedisStreamSink:
    """Appends events to ``acpw:{J}:events`` with an approximate ``MAXLEN``.

    Writes are batched: events accepted while a round trip is in flight go out together
    in the next pipeline, so a chatty agent costs one round trip per batch, not per event.
    """

    def __init__(self, client: aioredis.Redis, job_id: str, *, maxlen: int) -> None:
        self._client = client
        self._key = keys.events(job_id)
        self._maxlen = maxlen
        self._pending: list[str] = []
        self._wakeup = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closing = False

    @property
    def client(self) -> aioredis.Redis:
        """The connection the sink writes through (shared with the control stream)."""
        return self._client

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        if self._error is not None:
            raise SinkUnavailable("Redis event stream is unavailable", key=self._key)
        self._pending.append(line)
        self._wakeup.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="redis-sink")

    async def _flush_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._pending:
                    await self._send_pending()
                elif self._closing:
                    return
        except (redis.exceptions.RedisError, OSError) as exc:
            self._error = exc

    async def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        pipe = self._client.pipeline(transaction=False)
        for line in batch:
            pipe.xadd(self._key, {"event": line}, maxlen=self._maxlen, approximate=True)
        await pipe.execute()
        self._wakeup.set()  # look again: more may have arrived, or close() may wait

    async def close(self) -> None:
        self._closing = True
        if self._flusher is not None:
            self._wakeup.set()
            await self._flusher
        if self._error is not None:
            raise SinkUnavailable(
                f"could not write events to Redis: {self._error}", key=self._key
            ) from self._error
