"""The Celery side of the contract, shared by the worker (``tasks/``) and the client.

Jobs last minutes to hours, so: late acks (a message is acknowledged only after the job
settled), rejected back to the queue when a pool process dies, one message prefetched
per process, a broker visibility timeout longer than the longest job a spec may ask for,
and per-message time limits derived from the job's own timeout (a backstop: the runner
settles ``timed_out`` well before them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from worker.jobs.spec import JobSpec
from worker.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

RUN_TASK = "tasks.run_job"
REAP_TASK = "tasks.reap"
SETUP_ALLOWANCE_S = 300.0  # pack verification, sandbox, agent start and teardown
HARD_MARGIN_S = 60.0
MAX_JOB_TIMEOUT_S = 24 * 3600.0  # the ceiling of JobSpec.limits.timeout_s (a test pins it)


def time_limits(timeout_s: float, settings: Settings) -> tuple[float, float]:
    """(soft, hard) Celery time limits for a job that may run ``timeout_s`` seconds."""
    grace = settings.cancel_grace + settings.shutdown_eof_grace + settings.shutdown_term_grace
    soft = timeout_s + grace + SETUP_ALLOWANCE_S
    return soft, soft + HARD_MARGIN_S


def visibility_timeout(settings: Settings) -> int:
    """Longer than the hard limit of the longest job a spec may ask for."""
    return int(time_limits(MAX_JOB_TIMEOUT_S, settings)[1] + 3600)


def broker_url(settings: Settings) -> str | None:
    return settings.broker_url or settings.redis_url


def celery_config(settings: Settings) -> dict[str, Any]:
    soft, hard = time_limits(MAX_JOB_TIMEOUT_S, settings)
    return {
        "broker_url": broker_url(settings),
        "result_backend": settings.result_backend,
        "task_ignore_result": settings.result_backend is None,
        "task_default_queue": settings.queue,
        "task_routes": {RUN_TASK: {"queue": settings.queue}, REAP_TASK: {"queue": settings.queue}},
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "task_soft_time_limit": soft,
        "task_time_limit": hard,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {"visibility_timeout": visibility_timeout(settings)},
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
        "beat_schedule": {
            "reap": {
                "task": REAP_TASK,
                "schedule": settings.reaper_interval,
                "options": {"expires": settings.reaper_interval},
            }
        },
    }


def make_celery(settings: Settings, name: str = "acp-worker") -> Celery:
    """A Celery app configured for run jobs (celery is the optional ``celery`` extra)."""
    from celery import Celery  # the optional `celery` extra: loaded only when used

    app = Celery(name)
    app.conf.update(celery_config(settings))
    return app


def send_run(
    app: Celery, spec: JobSpec, *, settings: Settings, attempt: int, submitted_at: float
) -> None:
    """Enqueue ``tasks.run_job`` for ``spec`` with limits derived from its timeout."""
    soft, hard = time_limits(spec.limits.timeout_s, settings)
    app.send_task(
        RUN_TASK,
        args=[spec.model_dump(mode="json")],
        kwargs={"attempt": attempt, "submitted_at": submitted_at},
        queue=settings.queue,
        soft_time_limit=soft,
        time_limit=hard,
    )
