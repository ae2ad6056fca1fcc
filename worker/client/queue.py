"""The Celery side of the contract, shared by the worker (``tasks/``) and the client.

Jobs last minutes to hours, so: late acks (a message is acknowledged only after the job
settled), rejected back to the queue when a pool process dies, one message prefetched
per process, a broker visibility timeout longer than the longest job a spec may ask for,
and per-message time limits derived from the job's own timeout (a backstop: the runner
settles ``timed_out`` well before them). ``send_run`` sets them; for a producer that
publishes ``tasks.run_job`` itself (``apply_async``, ``send_task``) without them,
``fill_time_limits`` derives them at publish time (``tasks`` connects it to Celery's
``before_task_publish``), so no job gets the 24 h defaults meant for the longest one.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from worker.errors import InvalidJobSpec
from worker.jobs.spec import JobSpec, parse_job
from worker.settings import Settings
from worker.store import connect
from worker.store.url import choose_redis

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


SETTLED_MARGIN_S = 3600


def settled_ttl(settings: Settings) -> int:
    """How long a job's settlement record (``acpw:{J}:settled``) lives: past every window
    in which the broker may deliver a message of the job again (its visibility timeout,
    counted from the last delivery, which came before the job settled), so a redelivered
    message of a settled job whose other keys expired is refused, never run again."""
    floor = max(visibility_timeout(settings) + SETTLED_MARGIN_S, settings.events_ttl)
    return max(settings.settled_ttl or 0, floor)


def broker_url(settings: Settings) -> str:
    """The broker: ``broker_url``, else the job service's Redis, else the local default
    (the same Redis the commands default to, ``worker.store.url``)."""
    return settings.broker_url or choose_redis(settings.redis_url).url


def celery_config(settings: Settings) -> dict[str, object]:
    """The app's configuration; the broker connection (URL, TLS, ACL user, sentinel
    master) is :func:`worker.store.connect.broker_options`'s, as the store's."""
    soft, hard = time_limits(MAX_JOB_TIMEOUT_S, settings)
    broker = connect.broker_options(connect.target(broker_url(settings), settings))
    transport = {
        **broker.pop("broker_transport_options"),
        "visibility_timeout": visibility_timeout(settings),
    }
    return {
        **broker,
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
        # A worker fetches a message only for a free pool process: a draining worker holds
        # none it has not started (docs/operating.md, Draining a worker).
        "worker_disable_prefetch": True,
        "broker_transport_options": transport,
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


def make_celery(settings: Settings, name: str = "acp-worker", *, current: bool = True) -> Celery:
    """A Celery app configured for run jobs (celery is the optional ``celery`` extra).

    ``current=False`` leaves Celery's current app alone: a client made inside a worker
    process (a hand-back publishing the next attempt) must not replace the worker's app,
    which the pool's task tracing looks tasks up in.
    """
    from celery import Celery  # the optional `celery` extra: loaded only when used

    app = Celery(name, set_as_current=current)
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


def fill_time_limits(
    headers: MutableMapping[str, object], body: object, settings: Settings
) -> None:
    """Give a ``tasks.run_job`` message that lacks them the time limits of its job.

    ``headers`` and ``body`` are a protocol-2 message as ``before_task_publish`` sees it
    (``headers["timelimit"]`` is ``(hard, soft)``; ``body`` is ``(args, kwargs, embed)``).
    A limit the producer set is kept. One it did not set is derived from the job's
    ``limits.timeout_s`` (a soft limit never above a given hard one, a hard one never
    below the soft one); Celery writes the app's defaults (``celery_config``: the limits
    of the longest job a spec allows) into every message of a task the producer's app
    knows, so a value equal to its default counts as not set. A job that does not
    validate is left alone: the worker settles it as invalid at once.
    """
    given = headers.get("timelimit")
    hard, soft = given if isinstance(given, list | tuple) and len(given) == 2 else (None, None)
    default_soft, default_hard = time_limits(MAX_JOB_TIMEOUT_S, settings)
    hard = None if hard == default_hard else hard
    soft = None if soft == default_soft else soft
    if hard is not None and soft is not None:
        return
    timeout_s = _timeout_of(body)
    if timeout_s is None:
        return
    derived_soft, derived_hard = time_limits(timeout_s, settings)
    if soft is None:
        soft = derived_soft if hard is None else min(derived_soft, float(hard))
    if hard is None:
        hard = max(derived_hard, float(soft) + HARD_MARGIN_S)
    headers["timelimit"] = (hard, soft)


def _timeout_of(body: object) -> float | None:
    if not (isinstance(body, list | tuple) and len(body) >= 2):
        return None
    args, kwargs = body[0], body[1]
    job = args[0] if isinstance(args, list | tuple) and args else None
    if job is None and isinstance(kwargs, dict):
        job = kwargs.get("job")
    if not isinstance(job, str | bytes | dict):
        return None
    try:
        return parse_job(job).limits.timeout_s
    except InvalidJobSpec:
        return None
