"""Prometheus metrics of the job service, and the endpoint that serves them.

Celery's prefork pool runs jobs in child processes, so the metrics use
prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set (``acp-worker
serve --metrics-port`` sets it before the pool forks); otherwise the default registry.
The same HTTP server answers ``/ready`` (Redis and the sandbox backend answer) and
``/healthz`` (the process is up).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
import redis.exceptions
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from worker.settings import Settings

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


def sandboxes_reaped(backend: str, count: int) -> None:
    if count:
        REAPED.labels(backend=backend).inc(count)


def registry() -> CollectorRegistry | None:
    """The multiprocess registry when enabled, else None (the default registry)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


ReadyCheck = Callable[[], Mapping[str, Any]]


def _handler(ready: ReadyCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                reg = registry()
                body = generate_latest(reg) if reg is not None else generate_latest()
                self._reply(200, body, CONTENT_TYPE_LATEST)
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

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("metrics http: %s", fmt % args)

    return Handler


def start_server(port: int, ready: ReadyCheck, host: str = "0.0.0.0") -> ThreadingHTTPServer:  # noqa: S104
    """Serve ``/metrics``, ``/ready`` and ``/healthz`` from a daemon thread."""
    server = ThreadingHTTPServer((host, port), _handler(ready))
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def readiness(redis_url: str | None, backend_check: Callable[[], object]) -> dict[str, Any]:
    """``{"ready", "redis", "backend"}``: both must answer."""
    report: dict[str, Any] = {"redis": "unconfigured", "backend": "unknown"}
    if redis_url:
        try:
            with redis.Redis.from_url(redis_url, socket_connect_timeout=2, socket_timeout=2) as r:
                r.ping()
            report["redis"] = "ok"
        except (redis.exceptions.RedisError, OSError) as exc:
            report["redis"] = f"error: {type(exc).__name__}"
    try:
        backend_check()
        report["backend"] = "ok"
    except Exception as exc:  # any failure of the backend means not ready
        report["backend"] = f"error: {type(exc).__name__}"
    report["ready"] = report["redis"] == "ok" and report["backend"] == "ok"
    return report


def readiness_of(settings: Settings) -> dict[str, Any]:
    """:func:`readiness` for the Redis and the sandbox backend ``settings`` name."""
    from worker.sandbox import backend_config, get_backend  # backends load lazily

    def backend_answers() -> object:
        return asyncio.run(get_backend(backend_config(settings)).list({}))

    return readiness(settings.redis_url, backend_answers)
