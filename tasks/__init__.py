"""The Celery application: queue ``runs``, the task ``tasks.run_job``, the periodic reaper.

Thin and sync: each task validates its input and calls one async entry point of
``worker`` (``run_delivery`` or ``reap_once``). Settings come from the environment once,
here, at the entry point; with no ``ACPW_REDIS_URL`` the local default Redis is used
(``worker.store.url``), as by ``acp-worker serve``, which sets it for this process.
``celery -A tasks worker`` or ``acp-worker serve`` runs it (``serve`` also starts this
host's reaper; a bare ``celery worker`` does not).

A producer that imports this module and publishes ``run_job`` itself
(``tasks.run_job.apply_async(...)``, ``app.send_task``) gets the message's Celery time
limits derived from the job's ``limits.timeout_s`` when it set none
(``before_task_publish``), like ``Client.submit``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import before_task_publish, worker_init

from worker import metrics
from worker.client.queue import REAP_TASK, RUN_TASK, fill_time_limits, make_celery
from worker.service.guarded import Delivery, run_delivery
from worker.service.reaper import reap_pass
from worker.settings import Settings
from worker.store.url import choose_redis

log = logging.getLogger(__name__)

settings = Settings()
settings = settings.model_copy(update={"redis_url": choose_redis(settings.redis_url).url})
app = make_celery(settings)


@app.task(name=RUN_TASK)  # type: ignore[untyped-decorator]
def run_job(
    job: Any, attempt: int | None = None, submitted_at: float | None = None
) -> dict[str, Any]:
    """Run one job delivered by the broker; returns what became of the delivery.

    Never raises for a bad payload or a duplicate delivery: those are acknowledged and
    recorded, not retried.
    """
    delivery = Delivery(job, _int_or_none(attempt), _float_or_none(submitted_at))
    try:
        result = asyncio.run(run_delivery(delivery, settings=settings, environ=dict(os.environ)))
    except SoftTimeLimitExceeded:
        # Backstop beyond the job's own timeout: the lease expires and the reaper settles.
        log.error("run_job exceeded its Celery soft time limit")
        return {"outcome": "time_limit"}
    return result.to_dict()


@app.task(name=REAP_TASK)  # type: ignore[untyped-decorator]
def reap() -> dict[str, list[str]]:
    """One reaper pass over expired leases and orphan sandboxes."""
    return asyncio.run(reap_pass(settings)).to_dict()


@before_task_publish.connect(sender=RUN_TASK)  # type: ignore[untyped-decorator]
def _job_time_limits(headers: dict[str, Any] | None = None, body: Any = None, **_: object) -> None:
    """Limits from the job's own timeout for a ``run_job`` published without them."""
    if headers is not None:
        fill_time_limits(headers, body, settings)


@worker_init.connect  # type: ignore[untyped-decorator]
def _serve_metrics(**_: object) -> None:
    """In the worker's main process: ``/metrics``, ``/ready``, ``/healthz``."""
    if settings.metrics_port is not None:
        metrics.start_server(
            settings.metrics_port,
            lambda: metrics.readiness_of(settings),
            backlog_read=lambda: metrics.backlog_of(settings),
        )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
