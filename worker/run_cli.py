"""``acp-worker run`` (one job in this process) and ``acp-worker schema``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from worker.cli import add_json_flag
from worker.errors import InvalidJobSpec, SinkUnavailable
from worker.events.progress import ProgressSink
from worker.events.schema import event_schema
from worker.events.sinks import EventSink, JsonlSink, RedisStreamSink
from worker.jobs.spec import JobSpec, parse_job
from worker.runner import run_job
from worker.sandbox import BACKENDS, get_backend
from worker.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run one job in this process (no broker needed)")
    run.add_argument("job", type=Path, help="job spec JSON file (`-` for stdin)")
    run.add_argument("--backend", choices=BACKENDS, default=None, help="sandbox backend")
    run.add_argument("--events-out", type=Path, default=None, help="also write events (JSONL)")
    run.add_argument("--redis", default=None, metavar="URL", help="also stream events to Redis")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_flag(run)
    run.set_defaults(handler=_run)
    schema = sub.add_parser("schema", help="print the JSON Schema of canonical events")
    add_json_flag(schema)
    schema.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(event_schema(), indent=2))
    return 0


def _read_job(path: Path) -> JobSpec:
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise InvalidJobSpec(f"cannot read job file {path}: {exc.strerror}") from None
    return parse_job(raw)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    spec = _read_job(args.job)
    base_dir = Path.cwd() if str(args.job) == "-" else args.job.resolve().parent
    if settings.secrets_dir is None:
        # Local runs: `file:` credential references resolve beside the job file.
        settings = settings.model_copy(update={"secrets_dir": base_dir / "secrets"})
    if args.backend:
        settings = settings.model_copy(update={"backend": args.backend})
    return asyncio.run(_run_async(args, settings, spec, base_dir))


async def _run_async(
    args: argparse.Namespace, settings: Settings, spec: JobSpec, base_dir: Path
) -> int:
    cancel = asyncio.Event()
    _install_signals(cancel)
    async with AsyncExitStack() as stack:
        sinks = await _sinks(args, settings, spec, stack)
        outcome = await run_job(
            spec,
            settings=settings,
            backend=get_backend(settings.backend, settings),
            sinks=sinks,
            environ=dict(os.environ),
            base_dir=base_dir,
            cancel=cancel,
            control=_control_client(sinks),
        )
    return outcome.exit_code


def _control_client(sinks: list[EventSink]) -> Any:
    """With --redis, the same connection carries interaction answers (acpw:{J}:control)."""
    return next((s.client for s in sinks if isinstance(s, RedisStreamSink)), None)


async def _sinks(
    args: argparse.Namespace, settings: Settings, spec: JobSpec, stack: AsyncExitStack
) -> list[EventSink]:
    sinks: list[EventSink] = []
    if not args.quiet:
        sinks.append(ProgressSink(sys.stderr))
    if getattr(args, "json", False):
        sinks.append(JsonlSink(sys.stdout))
    if args.events_out is not None:
        handle = stack.enter_context(args.events_out.open("w", encoding="utf-8"))
        sinks.append(JsonlSink(handle, flush_each=False))
    url = args.redis or settings.redis_url
    if url:
        sinks.append(await _redis_sink(url, settings, spec, stack))
    return sinks


async def _redis_sink(
    url: str, settings: Settings, spec: JobSpec, stack: AsyncExitStack
) -> EventSink:
    import redis.asyncio as aioredis
    import redis.exceptions

    client: Any = aioredis.Redis.from_url(url)
    stack.push_async_callback(client.aclose)
    try:
        await client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise SinkUnavailable(f"cannot reach Redis: {exc}") from None
    return RedisStreamSink(client, spec.job_id, maxlen=settings.events_maxlen)


def _install_signals(cancel: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def first(signum: int) -> None:
        if cancel.is_set():
            os._exit(130)  # a second interrupt: the user wants out now
        print(f"\nacp-worker: {signal.Signals(signum).name}: cancelling the job…", file=sys.stderr)
        cancel.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, first, signum)
