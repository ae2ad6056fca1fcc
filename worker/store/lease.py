"""Job leases with fencing tokens.

A lease is ``acpw:{J}:lease`` holding the owner's fencing token, with a TTL renewed on a
heartbeat. Tokens come from a per-job counter (``fence`` in the state hash) and only
grow, so a writer proves it is the current owner by presenting its token: every write
script compares it with the lease (``scripts.APPEND``). A worker whose lease expired can
never renew it again; it has lost the job for good: :func:`settle_lost` then writes the
job's last event for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from worker.errors import ServiceUnavailable
from worker.settings import Settings
from worker.store import connect, keys, scripts
from worker.store.keys import job_keys
from worker.store.state import JobState, read_state, text

log = logging.getLogger(__name__)

REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def still_cancelling() -> None:
    """Raise the pending cancellation of the current task, if it has one.

    redis-py (8.1 here) does not always let a cancel that lands mid-command through: it
    closes the connection and the command is retried, or fails with a connection error,
    and the task runs on with its cancel request pending. A loop that follows Redis (the
    heartbeat, the control reader) calls this on every turn and after every Redis error,
    so that cancelling it ends it; otherwise whoever awaits it after cancelling (every
    job's exit) could wait forever.

    Raises:
        asyncio.CancelledError: the current task has a cancel request pending.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def redis_client(url: str | None, settings: Settings | None = None) -> aioredis.Redis:
    """An asyncio Redis client with timeouts (a hung Redis must not hang a job), made by
    :mod:`.connect` with ``settings``' TLS, ACL user and sentinel master.

    Raises:
        ServiceUnavailable: no Redis URL is configured.
        InvalidInput: the URL or the sentinel settings do not make sense.
    """
    if not url:
        raise ServiceUnavailable("no Redis configured: set ACPW_REDIS_URL")
    return connect.async_client(
        connect.target(url, settings), settings, socket_connect_timeout=2.0, socket_timeout=10.0
    )


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of ownership of one attempt of one job."""

    job_id: str
    attempt: int
    token: int
    worker_id: str
    nonce: str = ""  # this acquire's own: the lease holds ``holder``

    @property
    def holder(self) -> str:
        """The lease key's value while this lease holds it: ``<token>:<nonce>``."""
        return f"{self.token}:{self.nonce}" if self.nonce else str(self.token)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a delivery did not get the lease: ``held``, ``settled``, ``stale``, ``orphaned``.

    ``settled`` and ``stale`` also come from the settlement record of a job whose other
    keys expired (``keys.settled``): ``attempt`` is then the attempt it records.
    """

    job_id: str
    reason: str
    attempt: int
    detail: str


async def acquire(
    client: aioredis.Redis,
    job_id: str,
    *,
    worker_id: str,
    ttl: float,
    attempt: int | None = None,
    job_json: str = "{}",
) -> Lease | Refusal:
    """Take the lease of ``job_id`` for ``attempt`` (default: the state's), or say why not."""
    nonce = secrets.token_hex(8)
    reply = await scripts.bound(client, scripts.ACQUIRE)(
        keys=job_keys(job_id),
        args=[
            int(ttl * 1000),
            worker_id,
            "" if attempt is None else str(attempt),
            job_json,
            nonce,
        ],
    )
    outcome, got_attempt, detail = (text(part) for part in reply)
    if outcome != "acquired":
        return Refusal(job_id, outcome, int(got_attempt), detail)
    lease = Lease(job_id, int(got_attempt), int(detail), worker_id, nonce)
    await _index(client, job_id, ttl)
    await _started(client, job_id)
    await connect.replicated(client, f"lease of {job_id}")
    return lease


async def _index(client: aioredis.Redis, job_id: str, ttl: float) -> None:
    """Hint for the reaper: when this lease expires unless renewed."""
    await client.zadd(keys.LEASES, {job_id: time.time() + ttl})


async def _started(client: aioredis.Redis, job_id: str) -> None:
    """Out of the stranded-job sweep's indexes (:mod:`.queued`): its attempt started."""
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.QUEUED, job_id)
    pipe.zrem(keys.STRANDED, job_id)
    await pipe.execute()


async def renew(client: aioredis.Redis, lease: Lease, *, ttl: float) -> bool:
    """Extend the lease; False when it is not ours any more (expired or taken over)."""
    renew_lease = scripts.bound(client, scripts.RENEW)
    ok = await renew_lease(keys=[keys.lease(lease.job_id)], args=[lease.holder, int(ttl * 1000)])
    if ok:
        await _index(client, lease.job_id, ttl)
        await connect.replicated(client, f"lease renewal of {lease.job_id}")
    return bool(ok)


async def held(client: aioredis.Redis, lease: Lease) -> bool:
    """Whether ``lease`` is still the job's current lease (a read: nothing renewed)."""
    return await client.get(keys.lease(lease.job_id)) == lease.holder.encode()


async def release(client: aioredis.Redis, lease: Lease) -> bool:
    """Give the lease up; False when it was not ours any more (then the reaper's index
    entry stays: it may be another owner's, or the hint that settles an expired one)."""
    release_lease = scripts.bound(client, scripts.RELEASE)
    ok = await release_lease(keys=[keys.lease(lease.job_id)], args=[lease.holder])
    if ok:
        await client.zrem(keys.LEASES, lease.job_id)
    return bool(ok)


async def expired_leases(client: aioredis.Redis, *, now: float | None = None) -> list[str]:
    """Job ids whose lease, as the reaper's index hints, expired by ``now``."""
    ids = await client.zrangebyscore(keys.LEASES, "-inf", time.time() if now is None else now)
    return [text(i) for i in ids]


async def forget_lease(client: aioredis.Redis, job_id: str) -> None:
    """Drop ``job_id`` from the reaper's index (its lease is settled or gone)."""
    await client.zrem(keys.LEASES, job_id)


LostLine = Callable[[JobState], str]
"""Builds the ``job.completed`` ``lost`` line for the attempt a state describes (its
``seq`` is ``state.last_seq + 1``)."""

_SETTLE_TRIES = 5


async def settle_lost(
    client: aioredis.Redis,
    job_id: str,
    *,
    line: LostLine,
    ttl_s: int,
    maxlen: int,
    settled_ttl_s: int,
) -> tuple[str, JobState | None]:
    """Append ``line`` and settle the job ``lost``, unless it settled or is alive; the
    settlement record lives ``settled_ttl_s`` (see ``lua/terminal.lua``).

    Returns the program's verdict and the state it judged: ``lost``, ``alive`` (its
    lease is held), ``settled`` (nothing to do), ``moved`` (another attempt began), or
    ``retry`` when events kept landing meanwhile (the owner is alive after all).
    """
    verdict, state = "retry", None
    mark = scripts.bound(client, scripts.MARK_LOST)
    for _ in range(_SETTLE_TRIES):
        state = await read_state(client, job_id)
        if state is None or not state.running:
            return "settled", state
        reply = await mark(
            keys=job_keys(job_id),
            args=[str(state.attempt), state.last_seq, line(state), ttl_s, maxlen, settled_ttl_s],
        )
        verdict = text(reply) if reply is not None else ""
        if verdict != "retry":
            break
    if verdict == "lost":
        await connect.replicated(client, f"settling {job_id} lost")
    return verdict, state


class Heartbeat:
    """Renews a lease every ``every`` seconds; calls ``on_lost`` once when it is gone.

    ``on_renewed`` gets the lease's new deadline after each renewal: a
    ``time.monotonic()`` instant no later than Redis's (taken before the renewal was
    sent, plus ``ttl``).

    A Redis error is retried every second: the lease may still be alive. When Redis
    answers again and the lease has expired meanwhile, the lease is lost.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        lease: Lease,
        *,
        ttl: float,
        every: float,
        on_lost: Callable[[], None],
        on_failure: Callable[[], None] = lambda: None,
        on_renewed: Callable[[float], None] = lambda _: None,
    ) -> None:
        self._client = client
        self._lease = lease
        self._ttl = ttl
        self._every = every
        self._on_lost = on_lost
        self._on_failure = on_failure
        self._on_renewed = on_renewed
        self.lost = False

    async def run(self) -> None:
        delay = self._every
        while not self.lost:
            await asyncio.sleep(delay)
            still_cancelling()
            sent = time.monotonic()
            try:
                alive = await renew(self._client, self._lease, ttl=self._ttl)
            except REDIS_ERRORS as exc:
                still_cancelling()
                log.warning("lease renew failed for %s: %s", self._lease.job_id, exc)
                self._on_failure()
                delay = min(1.0, self._every)
                continue
            delay = self._every
            if alive:
                self._on_renewed(sent + self._ttl)
            else:
                self.lost = True
                self._on_lost()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Heartbeat]:
        async with in_background(self.run(), name=f"lease-{self._lease.job_id}"):
            yield self


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None], *, name: str) -> AsyncIterator[None]:
    """Run ``work`` in a task for as long as the block, then cancel and collect it."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
