"""``acp-worker serve | reap | submit | events | status | cancel | requeue | ready``: the job
service.

``serve`` and ``reap`` are the worker side. ``serve`` starts, next to the Celery worker,
this host's reaper (``reap --loop`` as a child that exits with the worker; ``--no-reaper``
for operators who run ``reap --loop`` themselves): local and docker sandboxes and work
directories belong to a host, so every worker host reaps; passes are idempotent and the
reapers of one host take turns (``worker.service.reaper.reap_pass``).

``submit``, ``events``, ``status``, ``cancel`` and ``requeue`` are the control-plane side
over Redis, with a readable live view on a terminal and JSON lines with ``--json``
(``events`` prints ``{"id", "event"}`` so a reader can resume with ``--after ID``; events
trimmed off the bounded stream before they were read end it with an ``events_trimmed``
error naming the id to resume after). ``submit --follow`` shows the submitted attempt's
events only; ``events --follow`` ends at the completion of the attempt current when it
started. ``requeue`` publishes a still-queued job's message again (after Redis came back
from an older snapshot, docs/durability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeAlias

from worker import metrics
from worker.cli import add_json_flag
from worker.client import Client, StreamEvent
from worker.errors import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_SUCCEEDED,
    EXIT_TIMED_OUT,
    InvalidJobSpec,
    ServiceUnavailable,
    WorkerError,
)
from worker.events.models import JobCompleted
from worker.events.progress import ProgressSink
from worker.service.children import REAPER_PID_ENV, die_with_parent
from worker.service.reaper import reap_pass
from worker.settings import Settings
from worker.store.url import DEFAULT_REDIS_URL, choose_redis

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

log = logging.getLogger(__name__)

EXIT_BY_STATUS = {
    "succeeded": EXIT_SUCCEEDED,
    "failed": EXIT_FAILED,
    "lost": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "timed_out": EXIT_TIMED_OUT,
}


def register(sub: SubParsers) -> None:
    _register_worker_side(sub)
    _register_client_side(sub)


def redis_flag(parser: argparse.ArgumentParser, *, default: bool = True) -> None:
    """``--redis URL`` (saying which Redis is the default) and ``--json``."""
    where = f"default: ACPW_REDIS_URL, else {DEFAULT_REDIS_URL}" if default else "ACPW_REDIS_URL"
    parser.add_argument("--redis", default=None, metavar="URL", help=f"Redis ({where})")
    add_json_flag(parser)


def _register_worker_side(sub: SubParsers) -> None:
    serve = sub.add_parser("serve", help="run a Celery worker for run jobs")
    serve.add_argument("--concurrency", type=int, default=None, help="parallel jobs")
    serve.add_argument(
        "--no-reaper",
        dest="reaper",
        action="store_false",
        help="do not reap on this host (run `acp-worker reap --loop` instead)",
    )
    serve.add_argument("--metrics-port", type=int, default=None, help="Prometheus port")
    serve.add_argument("--loglevel", default="INFO", help="Celery log level")
    redis_flag(serve)
    serve.set_defaults(handler=_serve)
    reap = sub.add_parser("reap", help="one reaper pass (or --loop every reaper_interval)")
    reap.add_argument("--loop", action="store_true", help="keep reaping")
    # `serve`'s own reaper: exit once PID (the worker) is gone; report only passes that did
    # something (an idle pass every few seconds would flood the worker's log).
    reap.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    redis_flag(reap)
    reap.set_defaults(handler=_reap)
    ready = sub.add_parser("ready", help="readiness: Redis and the sandbox backend answer")
    redis_flag(ready, default=False)
    ready.set_defaults(handler=_ready)


def _register_client_side(sub: SubParsers) -> None:
    submit = sub.add_parser("submit", help="submit a job (idempotent by job_id)")
    submit.add_argument("job", type=Path, help="job spec JSON file")
    submit.add_argument("--follow", action="store_true", help="show events until it settles")
    submit.add_argument(
        "--new-attempt", action="store_true", help="re-run a settled job (the spec may change)"
    )
    redis_flag(submit)
    submit.set_defaults(handler=_submit)
    events = sub.add_parser("events", help="print a job's events")
    events.add_argument("job_id")
    events.add_argument("--follow", action="store_true", help="wait until it settles")
    events.add_argument("--after", default=None, metavar="ID", help="resume after stream id")
    redis_flag(events)
    events.set_defaults(handler=_events)
    for name, handler, text in (
        ("status", _status, "print a job's state"),
        ("cancel", _cancel, "cancel a job's current attempt"),
        ("requeue", _requeue, "publish a queued job's broker message again"),
    ):
        parser = sub.add_parser(name, help=text)
        parser.add_argument("job_id")
        redis_flag(parser)
        parser.set_defaults(handler=handler)


def with_redis(args: argparse.Namespace, settings: Settings) -> Settings:
    """``settings`` with the Redis of ``--redis``, ``ACPW_REDIS_URL`` or the local default
    (``worker.store.url``: saying so on stderr, never on stdout where ``--json`` goes)."""
    choice = choose_redis(args.redis, settings.redis_url)
    if choice.notice is not None:
        print(choice.notice, file=sys.stderr, flush=True)
    return settings.model_copy(update={"redis_url": choice.url})


def _configured_redis(args: argparse.Namespace, settings: Settings) -> Settings:
    """For ``ready``: a health check with no Redis configured fails, it takes no default."""
    url = args.redis or settings.redis_url
    if not url:
        raise ServiceUnavailable("no Redis configured: pass --redis URL or set ACPW_REDIS_URL")
    return settings.model_copy(update={"redis_url": url})


def _as_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


# --- worker side -------------------------------------------------------------------


#: Celery's worker-to-worker features, which the service does not use: mingle asks the
#: other workers for their revoked tasks and logical clock at every start (about a second
#: of "mingle: searching for neighbors"); gossip follows their events (elections, clock)
#: and logs a traceback when the broker restarts. Jobs are cancelled, fenced and
#: deduplicated through Redis, never through Celery's revokes. Remote control (`celery
#: inspect`, Flower) and the event heartbeats Flower shows a worker online by are kept.
QUIET_CELERY = ("--without-gossip", "--without-mingle")


def serve_argv(args: argparse.Namespace, settings: Settings) -> list[str]:
    """The ``celery worker`` command line ``serve`` replaces itself with."""
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", settings.queue]
    argv += ["-O", "fair", "--loglevel", args.loglevel, *QUIET_CELERY]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    return argv


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    """Replace this process with the Celery worker, so its environment is final.

    ``tasks`` reads the settings from the environment once, and prometheus_client picks
    its multiprocess mode when it is first imported: both must see the values set here.
    The reaper, started first, watches this pid, which the worker keeps.
    """
    _check_backends(settings)
    settings = with_redis(args, settings)
    env = dict(os.environ, ACPW_REDIS_URL=settings.redis_url or "")
    if args.metrics_port is not None:
        env["ACPW_METRICS_PORT"] = str(args.metrics_port)
        made = tempfile.mkdtemp(prefix="acpw-metrics-")
        env["PROMETHEUS_MULTIPROC_DIR"] = env[metrics.MADE_DIR_ENV] = made  # removed at exit
    argv = serve_argv(args, settings)
    if args.reaper:  # kept referenced until the exec, so nothing collects it meanwhile
        _reaper = subprocess.Popen(
            reaper_argv(args, os.getpid()), env=env, stdin=subprocess.DEVNULL
        )
        env[REAPER_PID_ENV] = str(_reaper.pid)  # the worker stops it when it shuts down
    os.execve(sys.executable, argv, env)  # noqa: S606 - fixed argv, our own interpreter
    return 0  # pragma: no cover - execve does not return


def _check_backends(settings: Settings) -> None:
    """The config of every backend this host runs, built once at the start: a bad
    ``ACPW_*`` value of one fails the command there (``invalid_settings``, one line), not
    each job or reaper pass later.

    Raises:
        InvalidInput: an unknown backend name, or ``InvalidSettings``.
    """
    from worker.sandbox import backend_config  # backends load lazily

    for name in dict.fromkeys((settings.backend, *settings.reap_backends)):
        backend_config(settings, name)


def reaper_argv(args: argparse.Namespace, parent: int) -> list[str]:
    """The command line of ``serve``'s reaper: ``reap --loop`` bound to ``parent``."""
    argv = [sys.executable, "-m", "worker.cli", "reap", "--loop", "--parent", str(parent)]
    return argv + (["--json"] if _as_json(args) else [])


def _ready(args: argparse.Namespace, settings: Settings) -> int:
    report = metrics.readiness_of(_configured_redis(args, settings))
    print(json.dumps(report) if _as_json(args) else _ready_text(report))
    return 0 if report["ready"] else 1


def _ready_text(report: dict[str, Any]) -> str:
    head = "ready" if report["ready"] else "NOT ready"
    where = report.get("redis_at")
    how = ""
    if where:
        tls = (
            ("TLS verified" if where["verify"] else "TLS UNVERIFIED") if where["tls"] else "no TLS"
        )
        how = f"{where['url']}, {tls}"
        if where.get("username"):
            how += f", user {where['username']}"
        if where.get("sentinel_master"):
            how += f", sentinel master {where['sentinel_master']}"
            if where.get("master_address"):
                how += f" at {where['master_address']}"
        how = f" ({how})"
    return f"{head}: redis {report['redis']}{how}, backend {report['backend']}"


def _reap(args: argparse.Namespace, settings: Settings) -> int:
    """One pass, or with ``--loop`` one every ``reaper_interval`` seconds.

    Raises:
        ServiceUnavailable: (one pass) Redis did not answer; a loop reports a failed pass
            on stderr and carries on.
    """
    _check_backends(settings)
    settings = with_redis(args, settings)
    if args.loop:
        _stop_on_signal()
    if args.parent is not None:
        die_with_parent()
        if os.getppid() != args.parent:  # gone before the call above could notice
            return 0
    while True:
        report = _one_pass(settings, keep_going=args.loop)
        if report is not None and (args.parent is None or _did_something(report)):
            print(json.dumps(report) if _as_json(args) else _reap_text(report), flush=True)
        if not args.loop or _STOP.is_set():
            return 0
        if not _pause(settings.reaper_interval, args.parent):
            return 0


#: Set by SIGTERM or SIGINT in ``reap --loop``: it ends after the pass under way (its
#: worker stops it so at shutdown; Ctrl-C reaches it with the worker's process group).
_STOP = threading.Event()


def _stop_on_signal() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: _STOP.set())


def _one_pass(settings: Settings, *, keep_going: bool) -> dict[str, list[str]] | None:
    try:
        return asyncio.run(reap_pass(settings)).to_dict()
    except WorkerError as exc:
        if not keep_going:
            raise
        print(f"acp-worker reap: pass failed: {exc.message} [{exc.code}]", file=sys.stderr)
    except Exception:  # a loop outlives any one pass; the next one may well succeed
        if not keep_going:
            raise
        log.exception("acp-worker reap: pass failed")
        print("acp-worker reap: pass failed (see the traceback above)", file=sys.stderr)
    return None


def _did_something(report: dict[str, list[str]]) -> bool:
    return any(report.values())


def _pause(seconds: float, parent: int | None) -> bool:
    """Sleep ``seconds``; False as soon as ``parent`` (if any) is no longer our parent, or
    a signal asked the loop to stop."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if parent is not None and os.getppid() != parent:
            return False
        if _STOP.wait(min(left, 1.0)):
            return False
    return parent is None or os.getppid() == parent


def _reap_text(report: dict[str, list[str]]) -> str:
    return (
        f"reaped: {len(report['lost'])} job(s) lost {report['lost']}, "
        f"{len(report['destroyed'])} sandbox(es) destroyed, {len(report['failed'])} failed, "
        f"{len(report['workspaces'])} work dir(s), {len(report['results'])} result(s) and "
        f"{len(report.get('sessions', []))} session(s) removed"
    )


# --- control-plane side --------------------------------------------------------------


def _client(args: argparse.Namespace, settings: Settings) -> Client:
    settings = with_redis(args, settings)
    return Client(settings.redis_url or "", settings=settings)


def _load_job(path: Path) -> dict[str, object]:
    """The job file, with a relative local workspace made absolute (the worker is elsewhere)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidJobSpec(f"cannot read job file {path}: {exc}") from None
    workspace = data.get("workspace") if isinstance(data, dict) else None
    if isinstance(workspace, dict) and isinstance(workspace.get("path"), str):
        where = Path(workspace["path"])
        if not where.is_absolute():
            workspace["path"] = str((path.resolve().parent / where).resolve())
    return data if isinstance(data, dict) else {"job": data}


def _submit(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        submission = client.submit(_load_job(args.job), new_attempt=args.new_attempt)
        state = submission.state
        _say(
            args,
            {"submitted": submission.outcome, **state.to_dict()},
            f"job {state.job_id} attempt {state.attempt}: {submission.outcome} ({state.status})",
        )
        if not args.follow:
            return 0
        return _show(args, client.events(state.job_id, follow=True, attempt=state.attempt))


def _events(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        client.get(args.job_id)  # JobNotFound rather than waiting on a stream that never comes
        return _show(args, client.events(args.job_id, after=args.after, follow=args.follow))


def _status(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        state = client.get(args.job_id)
    _say(args, state.to_dict(), f"job {state.job_id} attempt {state.attempt}: {state.status}")
    return 0


def _cancel(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        state = client.cancel(args.job_id)
    text = "already settled" if state.settled else "cancel requested"
    _say(args, {"cancel": text, **state.to_dict()}, f"job {state.job_id}: {text}")
    return 0


def _requeue(args: argparse.Namespace, settings: Settings) -> int:
    with _client(args, settings) as client:
        done = client.requeue(args.job_id)
    state = done.state
    _say(
        args,
        {"requeue": done.outcome, **state.to_dict()},
        f"job {state.job_id} attempt {state.attempt}: {done.outcome} ({state.status})",
    )
    return 0


def _say(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    if _as_json(args):
        print(json.dumps(data), flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


def _show(args: argparse.Namespace, items: Iterable[StreamEvent]) -> int:
    """Print events (JSON lines or the live view); exit code from the last ``job.completed``.

    Raises:
        EventsTrimmed: events were trimmed before they were read; ``main`` prints it as
            one line and exits with its code, 1.
    """
    status = asyncio.run(_render(items, as_json=_as_json(args)))
    return EXIT_BY_STATUS.get(status or "", EXIT_SUCCEEDED)


async def _render(items: Iterable[StreamEvent], *, as_json: bool) -> str | None:
    """Render ``items``; an error they raise (``EventsTrimmed``) is left to ``main`` to
    print, on a line of its own: the view ends a half-streamed agent line first."""
    view = ProgressSink(sys.stderr)
    status: str | None = None
    try:
        for item in items:
            if as_json:
                print(json.dumps({"id": item.id, "event": item.event}), flush=True)
            else:
                await view.write(item.event, item.line)
            if isinstance(item.envelope.data, JobCompleted):
                status = item.envelope.data.status
    finally:
        await view.close()
    return status
