"""A Redis Stream sink that only the lease holder can write through.

Every batch goes through one Lua program (``scripts.APPEND``) that compares the
writer's fencing token with the job's lease before appending, so a worker that lost its
lease cannot add a single event after the new owner started. The same program settles
the job's state when ``job.completed`` passes and gives the job's keys their TTL, or, for
an attempt a draining worker handed back, queues the job's next attempt
(:func:`terminal_marker`).

When Redis is briefly unreachable the sink keeps events in a bounded in-memory queue
and retries with exponential backoff (tenacity); a full queue makes ``write`` wait, so
nothing is dropped and nothing is reordered. Retrying a batch whose reply was lost is
safe: the program skips every ``seq`` at or below the last one it appended.

Once the sink is broken (fenced, or Redis away longer than the retry budget) it takes
nothing more. By default ``write`` then drops events quietly and ``close`` reports the
failure: the service cancels the job through ``on_broken``. With ``raise_when_broken``
(``acp-worker run --redis``) ``write`` raises the failure instead, so the emitter drops
this sink, keeps the others, and the job fails with the typed error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from worker.errors import LeaseLost, SinkUnavailable, WorkerError
from worker.events.models import TERMINAL_TYPE
from worker.store import connect, scripts
from worker.store.keys import job_keys
from worker.store.lease import REDIS_ERRORS, Lease

log = logging.getLogger(__name__)

BATCH_EVENTS = 512
BATCH_BYTES = 1024 * 1024
#: While events keep coming (the last batch went less than this long ago), the next batch
#: waits out the rest of this window and takes what came meanwhile: a streamed answer's
#: deltas, a few milliseconds apart, go in a few appends instead of one each. The first
#: event after a quiet spell, a terminal event and a closing sink's rest go at once.
LINGER_S = 0.01


@dataclass(frozen=True, slots=True)
class SinkPolicy:
    """How the sink bounds the stream and rides out a Redis outage."""

    maxlen: int = 10_000
    ttl_s: int = 24 * 3600
    settled_ttl_s: int = 7 * 24 * 3600
    buffer_events: int = 10_000
    retry_for: float = 30.0


HANDED_BACK = "handed_back"


def terminal_marker(event: Mapping[str, Any]) -> str:
    """What ``append.lua`` does after writing ``event``: nothing (``""``), settle the job
    with the ``job.completed`` status, or, for an attempt a draining worker handed back
    (``cancelled`` with the error ``handed_back``), queue the next attempt."""
    if event["type"] != TERMINAL_TYPE:
        return ""
    data = event["data"]
    error = data.get("error") or {}
    if data.get("status") == "cancelled" and error.get("code") == HANDED_BACK:
        return HANDED_BACK
    return str(data.get("status", ""))


@dataclass(frozen=True, slots=True)
class _Pending:
    seq: int
    status: str
    line: str


class FencedStreamSink:
    """``EventSink`` appending to ``acpw:{J}:events`` only while ``lease`` is current."""

    def __init__(
        self,
        client: aioredis.Redis,
        lease: Lease,
        *,
        policy: SinkPolicy,
        on_broken: Callable[[], None] = lambda: None,
        on_written: Callable[[int], None] = lambda n: None,
        raise_when_broken: bool = False,
    ) -> None:
        self._client = client
        self._lease = lease
        self._policy = policy
        self._script = scripts.bound(client, scripts.APPEND)
        self._keys = job_keys(lease.job_id)
        self._on_broken = on_broken
        self._on_written = on_written
        self._raise_when_broken = raise_when_broken
        self._queue: collections.deque[_Pending] = collections.deque()
        # What Redis took, kept to write again if a failover loses it (``_refill``).
        self._recent: collections.deque[_Pending] = collections.deque(maxlen=policy.buffer_events)
        self.gaps: list[tuple[int, int]] = []  # seqs lost for good (recorded in ev_gap)
        self._wakeup = asyncio.Event()
        self._hurry = asyncio.Event()  # set: no lingering (a terminal event, the close)
        self._sent_at = float("-inf")  # loop time of the last append
        self._space = asyncio.Condition()
        self._flusher: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._fenced = False
        self._settled = False
        self._handed_back = False
        self._closing = False
        self.dropped = 0

    @property
    def settled(self) -> bool:
        """True once Redis took this attempt's ``job.completed`` (the state is settled)."""
        return self._settled

    @property
    def handed_back(self) -> bool:
        """True once Redis took a handed-back ``job.completed``: the job's next attempt is
        queued and this attempt's lease is gone (``lua/hand_back.lua``)."""
        return self._handed_back

    @property
    def fenced(self) -> bool:
        """True once Redis refused a batch because the lease is another owner's."""
        return self._fenced

    @property
    def broken(self) -> bool:
        """True once the sink takes nothing more: fenced, or Redis away for too long."""
        return self._broken

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        """Queue one event; waits while the buffer is full.

        Raises:
            LeaseLost, SinkUnavailable: the sink is broken and ``raise_when_broken`` is set
                (otherwise the event is dropped and ``close`` reports the failure).
        """
        await self._wait_for_space()  # returns early once the sink is broken
        if self._broken:
            self.dropped += 1
            if self._raise_when_broken:
                raise self._failure()
            return
        pending = _Pending(int(event["seq"]), terminal_marker(event), line)
        self._queue.append(pending)
        self._wakeup.set()
        if pending.status or len(self._queue) >= BATCH_EVENTS:
            self._hurry.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="fenced-sink")

    @property
    def _broken(self) -> bool:
        return self._fenced or self._error is not None

    async def _wait_for_space(self) -> None:
        if len(self._queue) < self._policy.buffer_events:
            return
        async with self._space:
            await self._space.wait_for(
                lambda: len(self._queue) < self._policy.buffer_events or self._broken
            )

    async def _flush_loop(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._queue and not self._broken:
                    await self._linger()
                    await self._send_front()
                if self._closing or self._broken:
                    return
        except (*REDIS_ERRORS, redis.exceptions.RedisError) as exc:
            self._error = exc
            log.error("event sink gave up on Redis for %s: %s", self._lease.job_id, exc)
        finally:
            await self._notify_space()
            if self._broken:
                self._on_broken()

    async def _linger(self) -> None:
        """Wait out the rest of the window since the last append (``LINGER_S``), unless
        hurried: the events arriving meanwhile join the batch."""
        loop = asyncio.get_running_loop()
        wait = self._sent_at + LINGER_S - loop.time()
        if wait > 0 and not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._hurry.wait()
        hurried = self._hurry.is_set() and not self._closing
        if hurried and not any(item.status for item in self._queue):
            self._hurry.clear()
        self._sent_at = loop.time()

    async def _send_front(self) -> None:
        batch = self._front_batch()
        written = await self._append_with_retry(batch)
        if isinstance(written, tuple):  # lines Redis had taken are gone: a failover
            self._refill(batch[0].seq, written[1])
            return
        if written < 0:
            self._fenced = True
            self.dropped += len(self._queue)
            log.warning("lease of %s is gone: its events are refused", self._lease.job_id)
            return
        for _ in batch:
            self._recent.append(self._queue.popleft())
        if any(item.status for item in batch):  # settled or handed back: must survive
            await connect.replicated(self._client, f"terminal event of {self._lease.job_id}")
        self._settled = self._settled or any(item.status for item in batch)
        self._handed_back = self._handed_back or any(item.status == HANDED_BACK for item in batch)
        self._on_written(written)
        await self._notify_space()

    def _refill(self, first: int, last: int) -> None:
        """Redis has this attempt's lines up to ``last`` only, not up to ``first - 1``:
        put the ones this sink still keeps back in front of the queue, so the stream stays
        contiguous; what it no longer keeps is written past, its seqs recorded as a gap."""
        missing = [item for item in self._recent if last < item.seq < first]
        self._recent.clear()
        self._queue.extendleft(reversed(missing))
        front = self._queue[0].seq
        if front > last + 1:
            self.gaps.append((last + 1, front - 1))
            log.warning(
                "events %d-%d of %s were lost in a Redis failover; recorded in ev_gap",
                last + 1,
                front - 1,
                self._lease.job_id,
            )
        else:
            log.warning(
                "Redis lost events %d-%d of %s (a failover): written again",
                last + 1,
                first - 1,
                self._lease.job_id,
            )

    def _front_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        for item in self._queue:
            if batch and (len(batch) >= BATCH_EVENTS or size + len(item.line) > BATCH_BYTES):
                break
            batch.append(item)
            size += len(item.line)
        return batch

    async def _append_with_retry(self, batch: list[_Pending]) -> int | tuple[int, int]:
        try:  # the usual case, without building the retry machinery for every batch
            return await self._append(batch)
        except REDIS_ERRORS:
            pass  # Redis away or failing over: retried below, with backoff, within the budget
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(REDIS_ERRORS),
            wait=wait_exponential(multiplier=0.02, max=1.0),
            stop=stop_after_delay(self._policy.retry_for),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._append(batch)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _append(self, batch: list[_Pending]) -> int | tuple[int, int]:
        gap = bool(self.gaps) and batch[0].seq == self.gaps[-1][1] + 1
        args: list[str | int] = [
            self._lease.holder,
            self._lease.attempt,
            self._policy.maxlen,
            self._policy.ttl_s,
            self._policy.settled_ttl_s,
            "1" if gap else "0",
        ]
        for item in batch:
            args.extend((item.seq, item.status, item.line))
        reply = await self._script(keys=self._keys, args=args)
        if isinstance(reply, list):
            return (int(reply[0]), int(reply[1]))
        return int(reply)

    async def _notify_space(self) -> None:
        async with self._space:
            self._space.notify_all()

    async def close(self) -> None:
        """Flush what was accepted.

        Raises:
            LeaseLost: the lease belonged to another owner; the rest was refused.
            SinkUnavailable: Redis stayed unreachable longer than the retry budget.
        """
        self._closing = True
        self._hurry.set()
        if self._flusher is not None:
            self._wakeup.set()
            await self._flusher
        if self._broken:
            raise self._failure()

    def _failure(self) -> WorkerError:
        if self._fenced:
            return LeaseLost(
                "the job's lease belongs to another owner; events were refused",
                job_id=self._lease.job_id,
                refused=self.dropped,
            )
        error = SinkUnavailable(
            f"could not write events to Redis: {self._error}",
            job_id=self._lease.job_id,
            undelivered=len(self._queue) + self.dropped,
        )
        error.__cause__ = self._error
        return error
