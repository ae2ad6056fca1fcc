"""Follows a job's control stream and turns ``cancel`` into the runner's cancel event.

The watcher reads the stream from its first entry, so a cancel written while the job
was still queued is honoured as soon as the job starts. Entries name the attempt they
are meant for; a cancel of an earlier attempt does not touch a later one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import redis.asyncio as aioredis

from worker import keys
from worker.leases.lease import REDIS_ERRORS

log = logging.getLogger(__name__)

CANCEL = "cancel"
BLOCK_MS = 1000


def control_fields(kind: str, attempt: int) -> dict[str, str]:
    """The fields of one control entry (what ``Client.cancel`` writes)."""
    return {"type": kind, "attempt": str(attempt)}


def _decode(fields: Mapping[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in fields.items()}


class ControlWatcher:
    """Sets ``cancel`` when a cancel entry for ``attempt`` of ``job_id`` arrives."""

    def __init__(
        self, client: aioredis.Redis, job_id: str, attempt: int, cancel: asyncio.Event
    ) -> None:
        self._client = client
        self._key = keys.control(job_id)
        self._attempt = str(attempt)
        self._cancel = cancel
        self._last = "0-0"

    async def run(self) -> None:
        while not self._cancel.is_set():
            try:
                reply: Any = await self._client.xread({self._key: self._last}, block=BLOCK_MS)
            except REDIS_ERRORS as exc:
                log.warning("control stream unreadable (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    self._last = entry_id.decode()
                    self._apply(_decode(fields))

    def _apply(self, fields: Mapping[str, str]) -> None:
        if fields.get("attempt", self._attempt) != self._attempt:
            return
        if fields.get("type") == CANCEL:
            log.info("cancel requested for %s", self._key)
            self._cancel.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ControlWatcher]:
        task = asyncio.create_task(self.run(), name=f"control-{self._key}")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
