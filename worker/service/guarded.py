"""Runs one delivered job under its lease: the service side of ``worker.job.run_job``.

    payload → validate → own the job (``worker.service.ownership.owning``: lease,
    heartbeat, control watcher, fenced sink; or drop the duplicate) → run_job → the
    lease is given back (unless the stream could not be settled: then it expires and a
    reaper settles the job ``lost``)

A delivery that does not get the lease (another live owner, an attempt that already
settled, a stale attempt) is acknowledged and counted in the job's state, never run.
``acp-worker run --redis`` owns its job with the same ``owning``.
An invalid job spec whose id can be read settles with one ``job.completed`` carrying
``invalid_job_spec``; one without a readable id is only logged. Neither is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from worker import metrics
from worker.client.client import REQUEUED, Client
from worker.errors import InvalidJobSpec, LeaseLost, WorkerError
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import TERMINAL_TYPE
from worker.job import run_job
from worker.job.warm import WarmPool
from worker.jobs.spec import JobSpec, parse_job
from worker.sandbox import backend_config, get_backend
from worker.service.drain import HandBack
from worker.service.ownership import Claim, LeaseRefusedError, Owned, owning
from worker.settings import Settings
from worker.store.lease import Refusal, redis_client
from worker.store.state import record_refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One Celery delivery of ``tasks.run_job``."""

    payload: object
    attempt: int | None = None
    submitted_at: float | None = None


@dataclass(frozen=True, slots=True)
class GuardedResult:
    """What became of one delivery; ``outcome`` is ``ran``, ``invalid``, ``handed_back``
    (a draining worker stopped it and queued the next attempt) or a refusal."""

    job_id: str | None
    outcome: str
    attempt: int | None = None
    status: str | None = None
    error: Mapping[str, object] | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "outcome": self.outcome,
            "attempt": self.attempt,
            "status": self.status,
            "error": dict(self.error) if self.error else None,
        }


async def run_delivery(
    delivery: Delivery,
    *,
    settings: Settings,
    environ: Mapping[str, str],
    hand_back: HandBack | None = None,
    pool: WarmPool | None = None,
    client: aioredis.Redis | None = None,
    settled: Callable[[GuardedResult], None] | None = None,
) -> GuardedResult:
    """Validate, lease and run one delivery; never raises for an anticipated failure.

    Once ``hand_back`` is tripped (a draining worker, ``worker.service.drain``) the job
    stops, is handed back (outcome ``handed_back``) and its next attempt is published.
    ``pool``: this process's warm pools (``worker.job.warm``), which the job may claim a
    slot of. ``client``: the process's Redis client, kept by the caller across
    deliveries on the same event loop (its connections too: a job opens a dozen, each a
    TCP connect and a handshake); without it, one is made for this delivery and closed.
    ``settled``: called with the delivery's result as soon as its job is settled (its
    ``job.completed`` written) and no hand-back is to follow, while the lease is still
    held: what remains (the job's leftovers removed, its warm slot replaced, the lease
    given back) changes nothing a client can see, so a caller may take its next delivery
    meanwhile (``tasks``). The result returned at the end is the same.
    """
    own = client is None
    if client is None:
        client = redis_client(settings.redis_url, settings)
    try:
        run = _GuardedRun(
            client, settings, environ, delivery, hand_back, pool=pool, settled=settled
        )
        return await run.run()
    finally:
        if own:
            await client.aclose()


@dataclass(slots=True)
class _Observer:
    """An ``EventSink`` that remembers the terminal event (for metrics and the result)."""

    completed: Mapping[str, Any] = field(default_factory=dict)

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        if event["type"] == TERMINAL_TYPE:
            self.completed = event["data"]

    async def close(self) -> None:
        return None


class _GuardedRun:
    def __init__(
        self,
        client: aioredis.Redis,
        settings: Settings,
        environ: Mapping[str, str],
        delivery: Delivery,
        hand_back: HandBack | None,
        *,
        pool: WarmPool | None = None,
        settled: Callable[[GuardedResult], None] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.environ = environ
        self.delivery = delivery
        self.hand_back = hand_back or HandBack()
        self.pool = pool
        self.settled = settled

    async def run(self) -> GuardedResult:
        try:
            spec = parse_job(_as_job(self.delivery.payload))
        except InvalidJobSpec as exc:
            return await self._invalid(exc)
        claim = Claim(spec.job_id, spec.model_dump_json(), self.delivery.attempt)
        observer = _Observer()
        started = time.monotonic()
        cancel = asyncio.Event()
        owned: Owned | None = None
        try:
            async with owning(self.client, claim, settings=self.settings, cancel=cancel) as owned:
                metrics.observe_queue_wait(self.delivery.submitted_at)
                with self.hand_back.watching(cancel):
                    status = await self._run_owned(spec, owned, observer, cancel)
        except LeaseRefusedError as refused:
            return await self._refused(refused.refusal)
        except LeaseLost as exc:
            log.warning("lost the lease of %s mid-run", spec.job_id)
            return GuardedResult(spec.job_id, "lease_lost", _attempt(owned), error=exc.to_dict())
        except WorkerError as exc:
            # The stream could not be settled: the lease is left to expire (``owning``),
            # and a reaper settles the job `lost`.
            log.error("job %s could not settle, lease left to expire: %s", spec.job_id, exc.message)
            return GuardedResult(spec.job_id, "unsettled", _attempt(owned), error=exc.to_dict())
        if owned.sink.handed_back:
            return await self._handed_back(spec.job_id, owned.lease.attempt, observer)
        metrics.job_settled(status, time.monotonic() - started)
        metrics.observe_phases(observer.completed.get("timings_ms"))
        return GuardedResult(
            spec.job_id, "ran", owned.lease.attempt, status, observer.completed.get("error")
        )

    async def _handed_back(self, job_id: str, attempt: int, observer: _Observer) -> GuardedResult:
        """Publish the next attempt's message (queued by the hand-back, not yet sent).

        ``Client.requeue`` claims the publish in the job's state first (``enqueue.lua``),
        so a ``submit`` or ``requeue`` racing it still publishes one message. Should the
        broker not answer, the attempt stays ``queued`` with ``enqueued`` 0 and the next
        ``submit`` of the job (or a ``requeue``) publishes it.
        """
        log.info("handed back %s attempt %d: publishing attempt %d", job_id, attempt, attempt + 1)
        try:
            done = await asyncio.to_thread(_requeue, self.settings, job_id)
        except WorkerError as exc:
            log.error("handed back %s but could not queue it again: %s", job_id, exc.message)
            return GuardedResult(job_id, "handed_back", attempt, "cancelled", exc.to_dict())
        if done != REQUEUED:
            log.warning("handed back %s: the next attempt was not published (%s)", job_id, done)
        metrics.job_settled("handed_back", None)
        error = observer.completed.get("error")
        return GuardedResult(job_id, "handed_back", attempt, "cancelled", error)

    async def _refused(self, refusal: Refusal) -> GuardedResult:
        log.info("not running %s: %s (%s)", refusal.job_id, refusal.reason, refusal.detail)
        await record_refusal(self.client, refusal.job_id, refusal.reason)
        return GuardedResult(refusal.job_id, refusal.reason, refusal.attempt)

    async def _invalid(self, exc: InvalidJobSpec) -> GuardedResult:
        job_id = exc.details.get("job_id")
        log.warning("invalid job spec (job %s): %s", job_id, exc.message)
        if not isinstance(job_id, str):
            return GuardedResult(None, "invalid", error=exc.to_dict())
        try:
            async with owning(
                self.client, Claim(job_id), settings=self.settings, cancel=asyncio.Event()
            ) as owned:
                with contextlib.suppress(LeaseLost):
                    await _settle_invalid(owned, exc)
        except LeaseRefusedError as refused:
            return await self._refused(refused.refusal)
        metrics.job_settled("failed", None)
        return GuardedResult(job_id, "invalid", owned.lease.attempt, "failed", exc.to_dict())

    async def _run_owned(
        self, spec: JobSpec, owned: Owned, observer: _Observer, cancel: asyncio.Event
    ) -> str:
        outcome = await run_job(
            spec,
            settings=self.settings,
            backend=self.pool.backend if self.pool else get_backend(backend_config(self.settings)),
            sinks=[observer, owned.sink],
            environ=self.environ,
            attempt=owned.lease.attempt,
            cancel=cancel,
            labels=owned.labels,
            control=self.client,
            lease_gone=owned.lease_gone,
            lease_deadline=owned.deadline,
            handing_back=lambda: self.hand_back.requested and not owned.control.requested,
            pool=self.pool,
            on_settled=lambda: self._settled(spec.job_id, owned, observer),
        )
        return outcome.status

    def _settled(self, job_id: str, owned: Owned, observer: _Observer) -> None:
        """The job's ``job.completed`` is written: tell ``settled`` what ``run`` will
        return, unless a hand-back (whose next attempt is published at the end) or a
        broken sink makes the end differ."""
        sink = owned.sink
        if self.settled is None or sink.handed_back or sink.broken or not observer.completed:
            return
        completed = observer.completed
        status = completed.get("status")
        self.settled(
            GuardedResult(
                job_id,
                "ran",
                owned.lease.attempt,
                status if isinstance(status, str) else None,
                completed.get("error"),
            )
        )


async def _settle_invalid(owned: Owned, exc: InvalidJobSpec) -> None:
    """Settle the job at once with one ``job.completed`` ``failed`` carrying ``exc``."""
    lease = owned.lease
    emitter = EventEmitter(job_id=lease.job_id, attempt=lease.attempt, sinks=[owned.sink])
    await emitter.emit(job_completed(status="failed", error=exc, duration_ms=0.0))
    await emitter.close()


def _requeue(settings: Settings, job_id: str) -> str:
    with Client(settings.redis_url or "", settings=settings) as client:
        return client.requeue(job_id).outcome


def _attempt(owned: Owned | None) -> int | None:
    return None if owned is None else owned.lease.attempt


def _as_job(payload: object) -> str | bytes | dict[str, object]:
    """The payload in a form ``parse_job`` accepts, or a JSON text that it refuses."""
    if isinstance(payload, str | bytes | dict):
        return payload
    return json.dumps(payload, default=repr)
