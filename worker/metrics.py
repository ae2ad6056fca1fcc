"""Prometheus metrics of the job service, and the endpoint that serves them.

Celery's prefork pool runs jobs in child processes, so the metrics use
prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set (``acp-worker
serve --metrics-port`` sets it before the pool forks); otherwise the default registry.
The same HTTP server answers ``/ready`` (Redis and the sandbox backend answer) and
``/healthz`` (the process is up).

``acpw_queue_depth``, ``acpw_jobs_running`` and ``acpw_leases_expired`` are read from
Redis at scrape time (the queue's length on the broker, the leases held, those past their
expiry): the autoscaling signal counts queued and running jobs, so a scale-in never aims
below the jobs still running; expired leases piling up mean no reaper is settling them.
They are the same for every worker of a pool (aggregate them with ``max``), and absent
while Redis does not answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis
import redis.exceptions
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.errors import WorkerError
from worker.settings import Settings
from worker.store import connect
from worker.store.keys import LEASES

log = logging.getLogger(__name__)

_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)
_SHORT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

JOBS = Counter(
    "acpw_jobs_total",
    "Jobs settled, by terminal status; handed_back: an attempt a draining worker gave back.",
    ["status"],
)
JOB_DURATION = Histogram(
    "acpw_job_duration_seconds", "Lease acquired to job settled.", buckets=_DURATION_BUCKETS
)
QUEUE_WAIT = Histogram(
    "acpw_queue_wait_seconds", "Submit to lease acquired.", buckets=_SHORT_BUCKETS
)
PHASES = Histogram(
    "acpw_phase_duration_seconds", "Duration of each job phase.", ["phase"], buckets=_SHORT_BUCKETS
)
EVENTS = Counter("acpw_events_written_total", "Canonical events appended to Redis.")
RENEW_FAILURES = Counter("acpw_lease_renew_failures_total", "Lease renewals Redis did not answer.")
REAPED = Counter("acpw_reaped_sandboxes_total", "Orphan sandboxes destroyed.", ["backend"])
REQUEUED_STRANDED = Counter(
    "acpw_jobs_requeued_stranded_total",
    "Queued jobs whose broker message was gone (a failover), requeued by the reaper.",
)
WARM_IDLE = Gauge(
    "acpw_warm_slots",
    "Warm slots ready and unclaimed, by pack (summed over the live pool processes).",
    ["pack"],
    multiprocess_mode="livesum",
)
WARM_CLAIMS = Counter(
    "acpw_warm_claims_total",
    "Jobs eligible for a warm slot, by pack and result: hit (claimed one) or miss (cold).",
    ["pack", "result"],
)
WARM_CLAIM_SECONDS = Histogram(
    "acpw_warm_claim_seconds", "Time to claim a warm slot (a hit).", buckets=_SHORT_BUCKETS
)


def job_settled(status: str, seconds: float | None) -> None:
    JOBS.labels(status=status).inc()
    if seconds is not None:
        JOB_DURATION.observe(seconds)


def observe_queue_wait(submitted_at: float | None) -> None:
    if submitted_at is not None:
        QUEUE_WAIT.observe(max(0.0, time.time() - submitted_at))


def observe_phases(timings_ms: object) -> None:
    if isinstance(timings_ms, Mapping):
        for phase, ms in timings_ms.items():
            if isinstance(ms, int | float):
                PHASES.labels(phase=str(phase)).observe(ms / 1000)


def events_written(count: int) -> None:
    EVENTS.inc(count)


def lease_renew_failed() -> None:
    RENEW_FAILURES.inc()


def warm_idle(pack: str, count: int) -> None:
    WARM_IDLE.labels(pack=pack).set(count)


def warm_claimed(pack: str, seconds: float) -> None:
    WARM_CLAIMS.labels(pack=pack, result="hit").inc()
    WARM_CLAIM_SECONDS.observe(seconds)


def warm_missed(pack: str) -> None:
    WARM_CLAIMS.labels(pack=pack, result="miss").inc()


def stranded_requeued(count: int) -> None:
    if count:
        REQUEUED_STRANDED.inc(count)


def sandboxes_reaped(backend: str, count: int) -> None:
    if count:
        REAPED.labels(backend=backend).inc(count)


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the pool has to do, as Redis says now."""

    queued: int  # messages waiting on the broker's queue
    running: int  # leases held: jobs a worker runs (or ran and the reaper has yet to see)
    expired: int  # of those, leases past their expiry: the reaper's to-do


#: The backlog now, or None when Redis does not answer.
BacklogRead = Callable[[], Backlog | None]


class BacklogCollector(Collector):
    """``acpw_queue_depth``, ``acpw_jobs_running`` and ``acpw_leases_expired``, read when
    scraped."""

    def __init__(self, read: BacklogRead) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._read()
        if now is None:  # no sample rather than a wrong zero that would scale in
            return
        yield GaugeMetricFamily(
            "acpw_queue_depth", "Run jobs waiting in the broker queue (pool-wide).", now.queued
        )
        yield GaugeMetricFamily(
            "acpw_jobs_running", "Jobs holding a lease, i.e. running (pool-wide).", now.running
        )
        yield GaugeMetricFamily(
            "acpw_leases_expired",
            "Leases past their expiry the reaper has not settled yet (pool-wide).",
            now.expired,
        )


def backlog(
    broker_url: str, redis_url: str, queue: str, settings: Settings | None = None
) -> Backlog | None:
    """LLEN of ``queue`` on the broker, and the leases held and expired in the job store;
    None if either Redis does not answer."""
    try:
        broker_at = connect.target(broker_url, settings)
        store_at = connect.target(redis_url, settings)
        with connect.sync_client(broker_at, socket_timeout=2) as broker:
            queued = int(broker.llen(queue))
        with connect.sync_client(store_at, socket_timeout=2) as store:
            running = int(store.zcard(LEASES))
            expired = int(store.zcount(LEASES, "-inf", time.time()))
    except (redis.exceptions.RedisError, OSError, WorkerError):
        return None
    return Backlog(queued=queued, running=running, expired=expired)


def backlog_of(settings: Settings) -> Backlog | None:
    """:func:`backlog` of the broker, job store and queue ``settings`` name."""
    if not settings.redis_url:
        return None
    broker = settings.broker_url or settings.redis_url
    return backlog(broker, settings.redis_url, settings.queue, settings)


#: Set by ``serve`` to the multiprocess directory it made for the worker: the worker's
#: main process removes that directory when it shuts down (``remove_made_dir``).
MADE_DIR_ENV = "ACPW_METRICS_DIR_MADE"


def remove_made_dir() -> None:
    """Remove the multiprocess directory ``serve`` made for this worker, if it did (a
    directory given by the operator in ``PROMETHEUS_MULTIPROC_DIR`` is theirs)."""
    made = os.environ.get(MADE_DIR_ENV)
    if made and made == os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        shutil.rmtree(made, ignore_errors=True)


def registry() -> CollectorRegistry | None:
    """The multiprocess registry when enabled, else None (the default registry)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


ReadyCheck = Callable[[], Mapping[str, object]]


def exposition(backlog_read: BacklogRead | None = None) -> bytes:
    """The ``/metrics`` body: this process's (or the pool's) metrics, then the backlog."""
    reg = registry()
    body = generate_latest(reg) if reg is not None else generate_latest()
    if backlog_read is not None:
        extra = CollectorRegistry()
        extra.register(BacklogCollector(backlog_read))
        body += generate_latest(extra)
    return body


def _handler(ready: ReadyCheck, backlog_read: BacklogRead | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, exposition(backlog_read), CONTENT_TYPE_LATEST)
            elif self.path == "/ready":
                report = dict(ready())
                code = 200 if report.get("ready") else 503
                self._reply(code, json.dumps(report).encode(), "application/json")
            elif self.path == "/healthz":
                self._reply(200, b'{"ok": true}', "application/json")
            else:
                self._reply(404, b"not found", "text/plain")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("metrics http: %s", fmt % args)

    return Handler


def start_server(
    port: int,
    ready: ReadyCheck,
    host: str = "0.0.0.0",  # noqa: S104
    *,
    backlog_read: BacklogRead | None = None,
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (with the backlog gauges when ``backlog_read`` is given),
    ``/ready`` and ``/healthz`` from a daemon thread."""
    server = ThreadingHTTPServer((host, port), _handler(ready, backlog_read))
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def readiness(
    redis_url: str | None, backend_check: Callable[[], object], settings: Settings | None = None
) -> dict[str, object]:
    """``{"ready", "redis", "backend", "redis_at"}``: both must answer. ``redis_at`` says
    which Redis was reached and how (its redacted URL, TLS and whether it is verified, the
    ACL user, the sentinel master and the address the sentinels gave for it), no secret;
    a refusal's ``redis`` names its code and reason (``error: redis_refused
    (certificate_unverified)``)."""
    report: dict[str, object] = {"redis": "unconfigured", "backend": "unknown"}
    if redis_url:
        try:
            at = connect.target(redis_url, settings)
            described = at.describe()
            report["redis_at"] = described
            with connect.sync_client(at, socket_connect_timeout=2, socket_timeout=2) as r:
                r.ping()
                if at.master:
                    host, port = r.connection_pool.get_master_address()
                    described["master_address"] = f"{host}:{port}"
            report["redis"] = "ok"
        except WorkerError as exc:
            report["redis"] = f"error: {exc.code}"
        except (redis.exceptions.RedisError, OSError) as exc:
            typed = connect.refused(exc)
            reason = typed.details.get("reason")
            report["redis"] = f"error: {typed.code}" + (f" ({reason})" if reason else "")
            if not reason:
                report["redis"] = f"error: {type(exc).__name__}"
    try:
        backend_check()
        report["backend"] = "ok"
    except Exception as exc:  # any failure of the backend means not ready
        report["backend"] = f"error: {type(exc).__name__}"
    report["ready"] = report["redis"] == "ok" and report["backend"] == "ok"
    return report


def readiness_of(settings: Settings) -> dict[str, object]:
    """:func:`readiness` for the Redis and the sandbox backend ``settings`` name."""
    from worker.sandbox import backend_config, get_backend  # backends load lazily

    def backend_answers() -> object:
        return asyncio.run(get_backend(backend_config(settings)).list({}))

    return readiness(settings.redis_url, backend_answers, settings)
