"""Following a job's control stream ``acpw:{J}:control``.

One reader, :class:`ControlStream`, follows the stream from its first entry and hands
every entry of its attempt to the handler registered for the entry's ``type``. What the
stream already holds is dispatched before :meth:`ControlStream.running` yields, so a
cancel written while the job was still queued is seen before the job does any work.
Entries name the attempt they are meant for; a cancel of an earlier attempt does not
touch a later one. :class:`ControlWatcher` is the reader for ``cancel``; interactions
register their own reader for ``answer`` (``worker.interactions.control``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Self

import redis
import redis.asyncio as aioredis

from worker.store import keys
from worker.store.lease import REDIS_ERRORS, still_cancelling

log = logging.getLogger(__name__)

CANCEL = "cancel"
BLOCK_MS = 500
MAXLEN = 1000
"""The control stream keeps about this many entries (the newest)."""

Handler = Callable[[Mapping[str, str]], Awaitable[None]]


def control_fields(kind: str, attempt: int) -> dict[str, str]:
    """The fields of one control entry (what ``Client.cancel`` writes)."""
    return {"type": kind, "attempt": str(attempt)}


def append_control(client: redis.Redis, job_id: str, entry: Mapping[str, str]) -> str:
    """Append one entry (cancel, answer) to the job's control stream; returns its id."""
    fields: Any = dict(entry)
    entry_id = client.xadd(keys.control(job_id), fields, maxlen=MAXLEN, approximate=True)
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _decode(fields: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}


class ControlStream:
    """Dispatches the control entries of one attempt of one job by their ``type``."""

    def __init__(
        self,
        client: aioredis.Redis,
        job_id: str,
        attempt: int,
        handlers: Mapping[str, Handler],
    ) -> None:
        self._client = client
        self._key = keys.control(job_id)
        self._attempt = str(attempt)
        self._handlers = dict(handlers)
        self._last = "0-0"
        #: Set when the block of ``running`` ends: nothing is dispatched any more.
        self._stopped = False

    async def run(self) -> None:
        """Follow the stream until cancelled or stopped; a Redis hiccup is logged and
        retried."""
        while not self._stopped:
            still_cancelling()
            try:
                reply: Any = await self._client.xread({self._key: self._last}, block=BLOCK_MS)
            except REDIS_ERRORS as exc:
                still_cancelling()
                if self._stopped:  # the client closed under a stopped reader
                    return
                log.warning("control stream unreadable (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            if self._stopped:
                return
            await self._handle(reply)

    async def catch_up(self) -> None:
        """Dispatch what the stream holds now, without waiting for more. If Redis does
        not answer, :meth:`run` reads the same entries once it does."""
        try:
            reply: Any = await self._client.xread({self._key: self._last})
        except REDIS_ERRORS as exc:
            still_cancelling()
            log.warning("control stream unreadable (%s); following it later", exc)
            return
        await self._handle(reply)

    async def _handle(self, reply: Any) -> None:
        for _, entries in reply or []:
            for entry_id, fields in entries:
                self._last = entry_id.decode()
                await self._dispatch(_decode(fields))

    async def _dispatch(self, fields: Mapping[str, str]) -> None:
        if fields.get("attempt", self._attempt) != self._attempt:
            return
        handler = self._handlers.get(fields.get("type", ""))
        if handler is not None:
            await handler(fields)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        """Catch up with the stream, then follow it in a task for as long as the block.

        At the block's end the reader stops dispatching at once, but its ``XREAD`` is
        left to return on its own (within ``BLOCK_MS``; :func:`stopped_readers` waits for
        it) rather than cancelled: a command cancelled mid-reply costs its connection,
        and the next command on it a new connection (two per job, one on the way to
        ``job.completed``)."""
        await self.catch_up()
        task = asyncio.create_task(self.run(), name=f"control-{self._key}")
        try:
            yield self
        finally:
            self._stopped = True
            if task.done():
                _collect(task)
            else:
                _stopping.add(task)
                task.add_done_callback(_stopped_reader)


#: Readers stopped while their ``XREAD`` was under way; each ends within ``BLOCK_MS``.
_stopping: set[asyncio.Task[None]] = set()


def _collect(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("control stream reader failed", exc_info=task.exception())


def _stopped_reader(task: asyncio.Task[None]) -> None:
    _stopping.discard(task)
    _collect(task)


async def stopped_readers() -> None:
    """Wait for the stopped readers of this loop still ending (a process's shutdown)."""
    loop = asyncio.get_running_loop()
    mine = [task for task in _stopping if task.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=BLOCK_MS / 1000 + 1)


class ControlWatcher(ControlStream):
    """Sets ``cancel`` when a cancel entry for ``attempt`` of ``job_id`` arrives;
    ``requested`` says whether one did (``cancel`` is also set by others: a lost lease, a
    draining worker)."""

    def __init__(
        self, client: aioredis.Redis, job_id: str, attempt: int, cancel: asyncio.Event
    ) -> None:
        self.requested = False

        async def on_cancel(fields: Mapping[str, str]) -> None:
            log.info("cancel requested for %s", keys.control(job_id))
            self.requested = True
            cancel.set()

        super().__init__(client, job_id, attempt, {CANCEL: on_cancel})
