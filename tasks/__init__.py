"""The Celery application: queue ``runs``, the task ``tasks.run_job``, the periodic reaper.

Thin and sync: each task validates its input and calls one async entry point of
``worker`` (``run_delivery`` or ``reap_once``). Settings come from the environment once,
here, at the entry point; with no ``ACPW_REDIS_URL`` the local default Redis is used
(``worker.store.url``), as by ``acp-worker serve``, which sets it for this process.
``celery -A tasks worker`` or ``acp-worker serve`` runs it (``serve`` also starts this
host's reaper; a bare ``celery worker`` does not).

SIGTERM drains the worker (``worker.service.drain``): Celery stops consuming at once and
waits for the running jobs (a message still arriving goes back to the queue at once);
after ``ACPW_DRAIN_GRACE_S`` the main process signals its pool processes, whose jobs still
running are handed back and queued again as a new attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import bootsteps
from celery.exceptions import SoftTimeLimitExceeded
from celery.platforms import EX_FAILURE, EX_OK
from celery.signals import (
    before_task_publish,
    task_received,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from celery.worker import state as worker_state
from celery.worker.state import revoked as revoked_tasks

from worker import metrics
from worker.client.queue import (
    HARD_MARGIN_S,
    REAP_TASK,
    RUN_TASK,
    fill_time_limits,
    make_celery,
)
from worker.job.warm import WarmPool
from worker.sandbox import backend_config, get_backend
from worker.service.children import REAPER_PID_ENV, keep_pool_files_in, stop_child
from worker.service.drain import HAND_BACK_SIGNAL, DrainTimer, HandBack
from worker.service.guarded import Delivery, GuardedResult, run_delivery
from worker.service.reaper import reap_pass
from worker.settings import Settings
from worker.store.control import stopped_readers
from worker.store.lease import redis_client
from worker.store.url import choose_redis

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)

settings = Settings()
settings = settings.model_copy(update={"redis_url": choose_redis(settings.redis_url).url})
app = make_celery(settings)
# In each pool process: tripped by the main process once the drain grace is over.
hand_back = HandBack()
_drain: list[DrainTimer] = []  # the main process's, made at worker_init
REAPER_STOP_GRACE_S = 5.0  # a pass under way ends first (well under a second here)
WARM_CLOSE_S = 30.0  # what a pool process waits for its warm slots to be destroyed
#: What a task past its soft time limit waits for its cancelled job's teardown: it
#: returns before the hard limit (``HARD_MARGIN_S`` later) would kill the process.
TEARDOWN_WAIT_S = HARD_MARGIN_S - 10
_loop_lock = threading.Lock()
_loop: list[asyncio.AbstractEventLoop] = []  # this process's, made at its first delivery
_pool: list[WarmPool] = []  # this process's warm pools, when ACPW_WARM_POOLS names packs
_client: list[aioredis.Redis] = []  # this process's Redis client, on its loop
#: This process's deliveries not yet ended, on its loop (a settled job's tail among them).
_tails: set[asyncio.Task[GuardedResult]] = set()


@app.task(name=RUN_TASK)  # type: ignore[untyped-decorator]
def run_job(
    job: Any, attempt: int | None = None, submitted_at: float | None = None
) -> dict[str, Any]:
    """Run one job delivered by the broker; returns what became of the delivery.

    Never raises for a bad payload or a duplicate delivery: those are acknowledged and
    recorded, not retried.
    """
    delivery = Delivery(job, _int_or_none(attempt), _float_or_none(submitted_at))
    loop = process_loop()
    ended = threading.Event()
    settled: list[GuardedResult] = []

    def on_settled(result: GuardedResult) -> None:  # on the loop's thread
        settled.append(result)
        ended.set()

    task = asyncio.run_coroutine_threadsafe(_start(delivery, ended, on_settled), loop).result()
    try:
        ended.wait()  # interrupted by the soft time limit (raised in this thread)
    except SoftTimeLimitExceeded:
        # Backstop beyond the job's own timeout: the job is cancelled on its loop, where
        # its teardown runs (its sandbox destroyed; its events unsettled, its lease is
        # left to expire and a reaper settles it lost). The task returns only once that
        # teardown ended, bounded, so that the next delivery of this process never runs
        # beside it.
        loop.call_soon_threadsafe(task.cancel)
        log.error("run_job exceeded its Celery soft time limit: the job is cancelled")
        if not ended.wait(TEARDOWN_WAIT_S):
            log.error(
                "the cancelled job's teardown has not ended %.0f s after the soft time "
                "limit; a reaper finds what it leaves",
                TEARDOWN_WAIT_S,
            )
        return {"outcome": "time_limit"}
    if settled:  # its tail (leftovers, the warm slot's replacement, the lease) goes on
        return settled[0].to_dict()
    return task.result().to_dict()  # done: read once, from this thread


async def _start(
    delivery: Delivery, ended: threading.Event, on_settled: Callable[[GuardedResult], None]
) -> asyncio.Task[GuardedResult]:
    """The delivery as a task of this process's loop; ``ended`` set once it is done,
    whether it ran to its end, failed or was cancelled (before it began too), or as soon
    as its job settled (``run_delivery``'s ``settled``): the task then ends beside the
    process's next delivery, and the process waits for it on its way out (``_tails``)."""
    task = asyncio.ensure_future(_deliver(delivery, on_settled))
    _tails.add(task)
    task.add_done_callback(_tails.discard)
    task.add_done_callback(lambda _: ended.set())
    return task


async def _deliver(
    delivery: Delivery, on_settled: Callable[[GuardedResult], None] | None = None
) -> GuardedResult:
    environ = dict(os.environ)
    return await run_delivery(
        delivery,
        settings=settings,
        environ=environ,
        hand_back=hand_back,
        pool=_warm_pool(),
        client=_redis(),
        settled=on_settled,
    )


async def _finish_tails() -> None:
    """Wait for this process's deliveries still ending (their jobs settled already), and
    for their control stream readers' last ``XREAD`` (``stopped_readers``)."""
    while _tails:
        await asyncio.wait(list(_tails))
    await stopped_readers()


def _redis() -> aioredis.Redis:
    """This process's Redis client (made on its loop at the first delivery, closed on the
    way out): its deliveries reuse its connections instead of each opening its own."""
    if not _client:
        _client.append(redis_client(settings.redis_url, settings))
    return _client[0]


def process_loop() -> asyncio.AbstractEventLoop:
    """This process's one long-lived event loop, on a daemon thread started on first use.

    Every delivery of the process runs on it, so what outlives one job (the warm slots'
    agents, whose stdio belongs to the loop that spawned them) stays usable by the next.
    The main thread waits on each delivery, so Celery's soft time limit still interrupts
    it there. Child processes are watched from this thread by asyncio's default
    (threaded) child watcher, which needs no main-thread loop.
    """
    with _loop_lock:
        if _loop and not _loop[0].is_closed():
            return _loop[0]
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="acpw-loop", daemon=True)
        thread.start()
        _loop[:] = [loop]
        return loop


def _warm_pool() -> WarmPool | None:
    """This process's warm pools (made on the loop at the first delivery), or None when
    ``ACPW_WARM_POOLS`` names no pack."""
    if not settings.warm_pools:
        return None
    if not _pool:
        config = backend_config(settings)
        _pool.append(
            WarmPool(
                settings,
                get_backend(config),
                backend_config=config.model_dump_json(),
                draining=lambda: hand_back.requested,
            )
        )
    return _pool[0]


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _close_warm_pool(**_: object) -> None:
    """In each pool process, on its way out: the tails of its settled jobs end (their
    leftovers removed, their leases given back), its warm slots are destroyed, never
    handed back (a process killed first leaves all of them to the reaper); its Redis
    client closed."""
    if not _loop:
        return
    ending = asyncio.run_coroutine_threadsafe(_finish_tails(), _loop[0])
    try:
        ending.result(timeout=WARM_CLOSE_S)
    except Exception:
        log.exception("a settled job's leftovers were not all removed; the reaper finds them")
    if _pool:
        closing = asyncio.run_coroutine_threadsafe(_pool[0].close(), _loop[0])
        try:
            closing.result(timeout=WARM_CLOSE_S)
        except Exception:
            log.exception("the warm slots were not all destroyed; the reaper finds the rest")
    if _client:
        client = _client.pop()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(client.aclose(), _loop[0]).result(timeout=5.0)


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


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _remove_metrics_dir(**_: object) -> None:
    """In the main process, its pool stopped: the metrics directory ``serve`` made goes."""
    metrics.remove_made_dir()


@worker_init.connect  # type: ignore[untyped-decorator]
def _pool_files_in_work_dir(**_: object) -> None:
    """In the main process, before the pool starts: its shared-memory files are made (and
    unlinked at once) in the work dir, not in a ``pymp-*`` folder left in the temp dir."""
    keep_pool_files_in(settings.work_dir)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop_reaper(**_: object) -> None:
    """In the main process, its pool stopped: ``serve``'s reaper ends with it, reaped."""
    pid = os.environ.get(REAPER_PID_ENV, "")
    if pid.isdigit():
        stop_child(int(pid), grace=REAPER_STOP_GRACE_S)


@worker_init.connect  # type: ignore[untyped-decorator]
def _drain_timer(sender: Any = None, **_: object) -> None:
    """In the main process: the timer a SIGTERM arms (``worker.service.drain``)."""
    worker = sender
    _drain.append(DrainTimer(settings.drain_grace_s, lambda: _pool_pids(worker)))


@worker_shutting_down.connect  # type: ignore[untyped-decorator]
def _drain_started(**_: object) -> None:
    """SIGTERM (or SIGINT, SIGQUIT): Celery has stopped consuming; the grace starts."""
    for timer in _drain:
        timer.arm()


@worker_ready.connect  # type: ignore[untyped-decorator]
def _ctrl_c_drains_to_exit_0(**_: object) -> None:
    """In the main process, once ready: Ctrl-C (SIGINT) is still Celery's warm shutdown
    (the drain; a second Ctrl-C its cold shutdown, as Celery's own handler arranges),
    but a drain that ends cleanly exits 0, as after SIGTERM. Celery's own exit status
    for it is 1, which a caller cannot tell from a failure: ``make serve-demo`` stopped
    with Ctrl-C printed ``Error 1``."""
    celery_handler = signal.getsignal(signal.SIGINT)
    if not callable(celery_handler):
        return

    def first_ctrl_c(signum: int, frame: Any) -> None:
        celery_handler(signum, frame)  # it installs the cold shutdown for the next one
        if worker_state.should_stop == EX_FAILURE and worker_state.should_terminate is None:
            worker_state.should_stop = EX_OK

    signal.signal(signal.SIGINT, first_ctrl_c)


class _FetchInFlight(bootsteps.StartStopStep):  # type: ignore[misc]
    """At the warm shutdown, the reply of a fetch (BRPOP) still in flight is read before
    the queue consumer is cancelled, so its message reaches ``_not_while_draining``.

    Otherwise the popped message waits unread in the connection until the worker exits
    (kombu reads it when it closes the channel, then requeues it), the whole drain long.
    Reading it costs at most kombu's BRPOP timeout (1 s).
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)  # so it stops before Tasks does

    def stop(self, parent: Any) -> None:
        channel = getattr(getattr(parent, "task_consumer", None), "channel", None)
        if channel is None or not getattr(channel, "_in_poll", None):  # none, or not Redis
            return
        try:
            channel._brpop_read()  # kombu has no public way to finish a fetch
            log.info("draining: read the fetch in flight")
        except Exception as exc:  # an empty reply (kombu's Empty) or a broken connection
            log.info("draining: no message in flight (%s)", type(exc).__name__)


app.steps["consumer"].add(_FetchInFlight)


@task_received.connect  # type: ignore[untyped-decorator]
def _not_while_draining(request: Any = None, **_: object) -> None:
    """A message that reaches a draining worker goes back to the head of the queue now.

    Cancelling the consumer does not cut a fetch already in flight (kombu delays it until
    the read completes, celery#1773): its message would otherwise sit in this worker,
    never run, until the worker exits (kombu restores unacknowledged messages then).
    Rejected with requeue it is another worker's at once; marked revoked, this worker
    drops it instead of running it.
    """
    if request is None or not any(timer.armed for timer in _drain):
        return
    log.info("draining: message %s goes back to the queue", request.id)
    request.reject(requeue=True)
    revoked_tasks.add(request.id)


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _hand_back_on_signal(**_: object) -> None:
    """In each pool process: ``HAND_BACK_SIGNAL`` trips the switch its jobs watch."""
    signal.signal(HAND_BACK_SIGNAL, lambda *_: hand_back.trip())


def _pool_pids(worker: Any) -> list[int]:
    pool = getattr(worker, "pool", None)
    info = pool.info if pool is not None else {}
    pids = info.get("processes", []) if isinstance(info, dict) else []
    return [pid for pid in pids if isinstance(pid, int)]


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
