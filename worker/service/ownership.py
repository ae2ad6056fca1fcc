"""Owning a job's lease while it runs: one context manager for every way a job is owned.

Both the service (``worker.service.guarded``, a Celery delivery) and
``acp-worker run --redis`` run a job under :func:`owning`:

    acquire the lease (an attempt whose last owner vanished is settled ``lost`` first, as
    a reaper would, and refused) → renew it on a heartbeat (whose ``on_lost`` sets
    ``cancel``) and follow the job's control stream (a ``cancel`` entry sets it) → the
    body runs the job with the fenced sink → on the way out, release the lease once the
    sink settled the stream (drop its index entry if the attempt was handed back);
    otherwise leave it to expire, so the reaper's index keeps the job and a reaper settles
    it ``lost`` (releasing would drop it from the index and leave it ``running`` for good).

What differs between the two is only what a broken sink does: the service cancels the
job (``on_broken``); ``run`` has the sink raise, so the job fails with the typed error
while its other sinks (stdout, ``--events-out``) still get its ``job.completed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import redis.asyncio as aioredis

from worker import metrics
from worker.client.queue import settled_ttl
from worker.errors import EXIT_INVALID, WorkerError
from worker.sandbox.base import LABEL_TOKEN, LeaseDeadline
from worker.service.reaper import mark_lost
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.control import ControlWatcher
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Heartbeat, Lease, Refusal
from worker.store.state import text

log = logging.getLogger(__name__)


class LeaseRefusedError(WorkerError):
    """The job's lease was not granted; ``refusal`` says why. Nothing was started."""

    code = "lease_refused"
    exit_code = EXIT_INVALID

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(
            f"{refusal.job_id}: {refusal.reason} ({refusal.detail})",
            job_id=refusal.job_id,
            reason=refusal.reason,
        )
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Claim:
    """What to own: the job, its spec as the state records it for a job never submitted,
    and the attempt (None: the state's current one)."""

    job_id: str
    job_json: str = "{}"
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class Owned:
    """A job owned for the duration of an :func:`owning` block."""

    client: aioredis.Redis
    lease: Lease
    sink: FencedStreamSink
    heartbeat: Heartbeat
    #: When the lease expires unless renewed, moved on by each renewal: the job's
    #: sandbox is bounded by it (``SandboxSpec.lease_deadline``).
    deadline: LeaseDeadline
    #: Follows the job's control stream: ``control.requested`` once it asked for a cancel.
    control: ControlWatcher

    @property
    def labels(self) -> dict[str, str]:
        """Labels for what the job creates: the token the reaper judges it by."""
        return {LABEL_TOKEN: str(self.lease.token)}

    async def lease_gone(self) -> bool:
        """True once this attempt's lease is not ours: the heartbeat or the sink saw it
        go, or Redis says so now. A check Redis does not answer is not a loss (the lease
        may well be alive; the heartbeat keeps watching)."""
        if self.heartbeat.lost or self.sink.fenced:
            return True
        try:
            return not await leases.held(self.client, self.lease)
        except leases.REDIS_ERRORS as exc:
            log.warning("could not check the lease of %s: %s", self.lease.job_id, exc)
            return False


def sink_policy(settings: Settings) -> SinkPolicy:
    return SinkPolicy(
        maxlen=settings.events_maxlen,
        ttl_s=settings.events_ttl,
        settled_ttl_s=settled_ttl(settings),
        buffer_events=settings.sink_buffer_events,
        retry_for=settings.sink_retry_s,
    )


@contextlib.asynccontextmanager
async def owning(
    client: aioredis.Redis,
    claim: Claim,
    *,
    settings: Settings,
    cancel: asyncio.Event,
    raise_when_broken: bool = False,
) -> AsyncIterator[Owned]:
    """Own ``claim``'s job while the block runs (see the module docstring).

    Raises:
        LeaseRefusedError: the lease was not granted (held, settled, stale, orphaned).
    """
    lease, asked = await claim_lease(client, claim, settings=settings)
    deadline = LeaseDeadline(asked + settings.lease_ttl)
    sink = FencedStreamSink(
        client,
        lease,
        policy=sink_policy(settings),
        on_broken=(lambda: None) if raise_when_broken else cancel.set,
        on_written=metrics.events_written,
        raise_when_broken=raise_when_broken,
    )
    heartbeat = Heartbeat(
        client,
        lease,
        ttl=settings.lease_ttl,
        every=settings.lease_renew,
        on_lost=cancel.set,
        on_failure=metrics.lease_renew_failed,
        on_renewed=deadline.extend,
    )
    watcher = ControlWatcher(client, lease.job_id, lease.attempt, cancel)
    try:
        async with heartbeat.running(), watcher.running():
            yield Owned(client, lease, sink, heartbeat, deadline, watcher)
    finally:
        await _give_back(client, lease, sink)


async def claim_lease(
    client: aioredis.Redis, claim: Claim, *, settings: Settings
) -> tuple[Lease, float]:
    """The lease of ``claim``'s attempt, and when (``time.monotonic()``) the acquire that
    got it was sent: the lease lives at most ``lease_ttl`` from then.

    A Redis that does not answer is asked again for up to ``ACPW_SINK_RETRY_S`` (a
    delivery taken as the sentinels promote a replica gets its lease on the new master):
    a task that failed here would have its message acknowledged, and the job never run.

    Raises:
        LeaseRefusedError: not granted. An ``orphaned`` attempt (its owner's lease expired
            before it settled) has been settled ``lost`` meanwhile.
    """
    deadline = time.monotonic() + settings.sink_retry_s
    pause = 0.1
    while True:
        asked = time.monotonic()
        try:
            got = await _ask(client, claim, settings)
            break
        except leases.REDIS_ERRORS as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("the lease of %s could not be asked for (%s); retrying", claim.job_id, exc)
            await asyncio.sleep(pause)  # a backoff between attempts, bounded by the deadline
            pause = min(pause * 2, 1.0)
    if isinstance(got, Refusal):
        if got.reason == "held" and await _next_attempt_queued(client, claim, got):
            return await _after_previous(client, claim, settings=settings)
        if got.reason == "orphaned":
            await mark_lost(client, got.job_id, settings)
        raise LeaseRefusedError(got)
    return got, asked


def _ask(client: aioredis.Redis, claim: Claim, settings: Settings) -> Awaitable[Lease | Refusal]:
    return leases.acquire(
        client,
        claim.job_id,
        worker_id=settings.worker_id,
        ttl=settings.lease_ttl,
        attempt=claim.attempt,
        job_json=claim.job_json,
    )


async def _next_attempt_queued(client: aioredis.Redis, claim: Claim, held: Refusal) -> bool:
    """Whether a ``held`` lease belongs to the attempt before the one delivered: the job's
    state names the delivered attempt and it is still ``queued`` (no acquire of it ever
    succeeded, so the holder is an earlier attempt). That earlier attempt settled (a new
    attempt is only queued after it did) and is finishing what follows ``job.completed``
    (its work directory's removal), or its worker died and its lease is expiring. A
    duplicate delivery of a running attempt finds it ``running`` instead."""
    attempt, status = await client.hmget(keys.state(claim.job_id), ["attempt", "status"])
    return attempt is not None and int(attempt) == held.attempt and text(status) == "queued"


async def _after_previous(
    client: aioredis.Redis, claim: Claim, *, settings: Settings
) -> tuple[Lease, float]:
    """The lease, asked for again until the previous attempt's holder lets it go: it
    releases it once its teardown's last step is done, or it expires within
    ``ACPW_LEASE_TTL`` of the holder's last renewal. Refusing the delivery instead would
    acknowledge its message and leave the new attempt queued with nothing to run it."""
    log.info(
        "job %s: attempt %s waits for the previous attempt's lease", claim.job_id, claim.attempt
    )
    until = time.monotonic() + settings.lease_ttl + settings.sink_retry_s
    pause = 0.02
    while True:
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)
        try:
            asked = time.monotonic()
            got = await _ask(client, claim, settings)
        except leases.REDIS_ERRORS as exc:
            if time.monotonic() > until:
                raise
            log.warning("the lease of %s could not be asked for (%s); retrying", claim.job_id, exc)
            continue
        if not isinstance(got, Refusal):
            return got, asked
        if got.reason != "held" or time.monotonic() > until:
            if got.reason == "orphaned":
                await mark_lost(client, got.job_id, settings)
            raise LeaseRefusedError(got)


async def _give_back(client: aioredis.Redis, lease: Lease, sink: FencedStreamSink) -> None:
    """Release the lease once the stream is settled; otherwise let it expire for a reaper.
    A handed-back attempt's lease is gone already (``lua/hand_back.lua``): only its entry
    in the reaper's index is dropped, before the next attempt's message is published, so
    it can never drop that attempt's entry."""
    if sink.handed_back:
        with contextlib.suppress(*leases.REDIS_ERRORS):  # a stale hint: the reaper skips it
            await leases.forget_lease(client, lease.job_id)
        return
    if not sink.settled:
        log.warning(
            "the events of %s could not be settled in Redis: its lease is left to "
            "expire, then a reaper settles it lost",
            lease.job_id,
        )
        return
    try:
        await leases.release(client, lease)
    except leases.REDIS_ERRORS as exc:
        log.warning("could not release the lease of %s: %s", lease.job_id, exc)
