"""Runs one delivered job under its lease: the service side of ``worker.job.run_job``.

    payload → validate → acquire lease (or drop the duplicate) → heartbeat + control
    watcher + fenced sink → run_job → release (unless the stream could not be settled:
    then the lease expires and a reaper settles the job ``lost``)

A delivery that does not get the lease (another live owner, an attempt that already
settled, a stale attempt) is acknowledged and counted in the job's state, never run.
``acp-worker run --redis`` owns its job with the same pieces: ``sink_policy``,
``lease_guards`` and ``release_lease``.
An invalid job spec whose id can be read settles with one ``job.completed`` carrying
``invalid_job_spec``; one without a readable id is only logged. Neither is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from worker import metrics
from worker.errors import InvalidJobSpec, LeaseLost, WorkerError
from worker.events.emitter import EventEmitter
from worker.events.models import TERMINAL_TYPE
from worker.job import run_job
from worker.jobs.spec import JobSpec, parse_job
from worker.sandbox import backend_config, get_backend
from worker.sandbox.base import LABEL_TOKEN
from worker.service.reaper import mark_lost
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.control import ControlWatcher
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Heartbeat, Lease, Refusal, redis_client

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One Celery delivery of ``tasks.run_job``."""

    payload: object
    attempt: int | None = None
    submitted_at: float | None = None


@dataclass(frozen=True, slots=True)
class GuardedResult:
    """What became of one delivery; ``outcome`` is ``ran``, ``invalid`` or a refusal."""

    job_id: str | None
    outcome: str
    attempt: int | None = None
    status: str | None = None
    error: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "outcome": self.outcome,
            "attempt": self.attempt,
            "status": self.status,
            "error": dict(self.error) if self.error else None,
        }


def sink_policy(settings: Settings) -> SinkPolicy:
    return SinkPolicy(
        maxlen=settings.events_maxlen,
        ttl_s=settings.events_ttl,
        buffer_events=settings.sink_buffer_events,
        retry_for=settings.sink_retry_s,
    )


@contextlib.asynccontextmanager
async def lease_guards(
    client: aioredis.Redis, lease: Lease, settings: Settings, cancel: asyncio.Event
) -> AsyncIterator[None]:
    """While the body runs, renew ``lease`` and follow the job's control stream; a lost
    lease or a ``cancel`` entry sets ``cancel``."""
    heartbeat = Heartbeat(
        client,
        lease,
        ttl=settings.lease_ttl,
        every=settings.lease_renew,
        on_lost=cancel.set,
        on_failure=metrics.lease_renew_failed,
    )
    watcher = ControlWatcher(client, lease.job_id, lease.attempt, cancel)
    async with heartbeat.running(), watcher.running():
        yield


async def release_lease(client: aioredis.Redis, lease: Lease) -> None:
    """Give the lease back; if Redis is away it expires and the reaper settles the job."""
    try:
        await leases.release(client, lease)
    except leases.REDIS_ERRORS as exc:
        log.warning("could not release the lease of %s: %s", lease.job_id, exc)


async def run_delivery(
    delivery: Delivery, *, settings: Settings, environ: Mapping[str, str]
) -> GuardedResult:
    """Validate, lease and run one delivery; never raises for an anticipated failure."""
    client = redis_client(settings.redis_url)
    try:
        return await _GuardedRun(client, settings, environ, delivery).run()
    finally:
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
    ) -> None:
        self.client = client
        self.settings = settings
        self.environ = environ
        self.delivery = delivery

    async def run(self) -> GuardedResult:
        try:
            spec = parse_job(_as_job(self.delivery.payload))
        except InvalidJobSpec as exc:
            return await self._invalid(exc)
        got = await self._acquire(spec.job_id, spec.model_dump_json())
        if isinstance(got, Refusal):
            return await self._refused(got)
        metrics.observe_queue_wait(self.delivery.submitted_at)
        return await self._run_owned(spec, got)

    async def _acquire(self, job_id: str, job_json: str) -> Lease | Refusal:
        return await leases.acquire(
            self.client,
            job_id,
            worker_id=self.settings.worker_id,
            ttl=self.settings.lease_ttl,
            attempt=self.delivery.attempt,
            job_json=job_json,
        )

    async def _refused(self, refusal: Refusal) -> GuardedResult:
        log.info("not running %s: %s (%s)", refusal.job_id, refusal.reason, refusal.detail)
        state = keys.state(refusal.job_id)
        await self.client.hincrby(state, "duplicates", 1)
        await self.client.hset(state, "last_refusal", refusal.reason)
        if refusal.reason == "orphaned":
            await mark_lost(self.client, refusal.job_id, self.settings)
        return GuardedResult(refusal.job_id, refusal.reason, refusal.attempt)

    async def _invalid(self, exc: InvalidJobSpec) -> GuardedResult:
        job_id = exc.details.get("job_id")
        log.warning("invalid job spec (job %s): %s", job_id, exc.message)
        if not isinstance(job_id, str):
            return GuardedResult(None, "invalid", error=exc.to_dict())
        got = await self._acquire(job_id, "{}")
        if isinstance(got, Refusal):
            return await self._refused(got)
        with contextlib.suppress(LeaseLost):
            await self._settle_invalid(got, exc)
        await self._release(got)
        metrics.job_settled("failed", None)
        return GuardedResult(job_id, "invalid", got.attempt, "failed", exc.to_dict())

    async def _settle_invalid(self, lease: Lease, exc: InvalidJobSpec) -> None:
        sink = FencedStreamSink(self.client, lease, policy=sink_policy(self.settings))
        emitter = EventEmitter(job_id=lease.job_id, attempt=lease.attempt, sinks=[sink])
        await emitter.emit(
            TERMINAL_TYPE,
            {"status": "failed", "stop_reason": None, "error": exc.to_dict(), "duration_ms": 0.0},
        )
        await emitter.close()

    async def _run_owned(self, spec: JobSpec, lease: Lease) -> GuardedResult:
        observer = _Observer()
        started = time.monotonic()
        try:
            status = await self._run_with_guards(spec, lease, observer)
        except LeaseLost as exc:
            log.warning("lost the lease of %s mid-run", spec.job_id)
            return GuardedResult(spec.job_id, "lease_lost", lease.attempt, error=exc.to_dict())
        except WorkerError as exc:
            # The stream could not be settled. Releasing would drop the job from the
            # reaper's index and leave it `running` for good: the lease is left to
            # expire instead, and a reaper settles the job `lost`.
            log.error("job %s could not settle, lease left to expire: %s", spec.job_id, exc.message)
            return GuardedResult(spec.job_id, "unsettled", lease.attempt, error=exc.to_dict())
        await self._release(lease)
        metrics.job_settled(status, time.monotonic() - started)
        metrics.observe_phases(observer.completed.get("timings_ms"))
        return GuardedResult(
            spec.job_id, "ran", lease.attempt, status, observer.completed.get("error")
        )

    async def _run_with_guards(self, spec: JobSpec, lease: Lease, observer: _Observer) -> str:
        cancel = asyncio.Event()
        async with lease_guards(self.client, lease, self.settings, cancel):
            sink = FencedStreamSink(
                self.client,
                lease,
                policy=sink_policy(self.settings),
                on_broken=cancel.set,
                on_written=metrics.events_written,
            )
            outcome = await run_job(
                spec,
                settings=self.settings,
                backend=get_backend(backend_config(self.settings)),
                sinks=[observer, sink],
                environ=self.environ,
                attempt=lease.attempt,
                cancel=cancel,
                labels={LABEL_TOKEN: str(lease.token)},
                control=self.client,
            )
        return outcome.status

    async def _release(self, lease: Lease) -> None:
        await release_lease(self.client, lease)


def _as_job(payload: object) -> str | bytes | dict[str, Any]:
    """The payload in a form ``parse_job`` accepts, or a JSON text that it refuses."""
    if isinstance(payload, str | bytes | dict):
        return payload
    return json.dumps(payload, default=repr)
