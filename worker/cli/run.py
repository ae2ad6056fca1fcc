"""``acp-worker run`` (one job in this process) and ``acp-worker schema``.

With ``--redis`` (or ``ACPW_REDIS_URL``) the job is owned the way the service owns a
delivered one (``worker.service.ownership.owning``): its lease is taken with a fencing token before
anything starts — a job id that already settled, or whose lease a live owner holds, is
refused with exit 2 — renewed while the job runs, and the events reach
``acpw:{J}:events`` only through the fenced sink, which settles the state hash and gives
the job's keys their TTL. ``status``, ``events``, ``cancel`` and ``answer`` work on such a
job as on a served one. If Redis stays away longer than ``sink_retry_s``, the job fails
with ``sink_unavailable`` while stdout and ``--events-out`` still get its
``job.completed``; its lease is then left to expire, so a reaper settles it ``lost``.

Only what the job uses is imported: the redis package, the lease and the ownership
modules only with ``--redis`` (docs/figures.md, "One-shot overhead", for what a plain
run loads and how long its start takes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from worker.cli import add_json_flag
from worker.errors import InvalidInput, InvalidJobSpec, SinkUnavailable
from worker.events.progress import ProgressSink
from worker.events.sinks import EventSink, JsonlSink
from worker.job import run_job
from worker.jobs.spec import JobSpec, LocalWorkspace, parse_job
from worker.sandbox import BACKENDS, backend_config, get_backend
from worker.sandbox.base import LeaseDeadline
from worker.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from worker.service.ownership import Claim, Owned
    from worker.store.lease import Refusal

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run one job in this process (no broker needed)")
    run.add_argument("job", type=Path, help="job spec JSON file (`-` for stdin)")
    run.add_argument("--backend", choices=BACKENDS, default=None, help="sandbox backend")
    run.add_argument("--events-out", type=Path, default=None, help="also write events (JSONL)")
    run.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="also stream events to Redis, under the job's lease (like a served job)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_json_flag(run)
    run.set_defaults(handler=_run)
    schema = sub.add_parser("schema", help="print the JSON Schema of canonical events")
    add_json_flag(schema)
    schema.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace, settings: Settings) -> int:
    from worker.events.schema import event_schema  # builds every event's model: only here

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


@dataclass(frozen=True, slots=True)
class _Ownership:
    """What running under the job's lease adds to a run (the default: no Redis)."""

    client: aioredis.Redis | None = None  # also reads acpw:{J}:control (cancel, answers)
    sinks: tuple[EventSink, ...] = ()
    attempt: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    lease_gone: Callable[[], Awaitable[bool]] | None = None
    lease_deadline: LeaseDeadline | None = None  # bounds the sandbox by the lease


async def _run_async(
    args: argparse.Namespace, settings: Settings, spec: JobSpec, base_dir: Path
) -> int:
    cancel = asyncio.Event()
    _install_signals(cancel)
    backend = get_backend(backend_config(settings))
    url = args.redis or settings.redis_url
    async with AsyncExitStack() as stack:
        owned = _Ownership()
        if url:
            owned = await _own(
                url, settings=settings, spec=spec, base_dir=base_dir, stack=stack, cancel=cancel
            )
        outcome = await run_job(
            spec,
            settings=settings,
            backend=backend,
            sinks=[*_local_sinks(args, stack), *owned.sinks],
            environ=dict(os.environ),
            base_dir=base_dir,
            attempt=owned.attempt,
            cancel=cancel,
            labels=owned.labels,
            control=owned.client,
            lease_gone=owned.lease_gone,
            lease_deadline=owned.lease_deadline,
        )
    return outcome.exit_code


async def _own(
    url: str,
    *,
    settings: Settings,
    spec: JobSpec,
    base_dir: Path,
    stack: AsyncExitStack,
    cancel: asyncio.Event,
) -> _Ownership:
    """Own the job (``owning``) until the stack closes, or refuse it.

    Raises:
        InvalidInput: the attempt has settled, or a live owner holds its lease.
        SinkUnavailable: Redis did not answer.
    """
    from worker.service.ownership import Claim, LeaseRefusedError
    from worker.store.lease import redis_client

    client = redis_client(url, settings)
    stack.push_async_callback(client.aclose)
    claim = Claim(spec.job_id, _recorded(spec, base_dir))
    with _reaching_redis():
        try:
            owned = await _enter(client, claim, settings, stack, cancel)
        except LeaseRefusedError as refused:
            if refused.refusal.reason != "orphaned":
                raise _refused(refused.refusal) from None
            # Its last owner's lease expired before it settled: it was settled `lost`
            # meanwhile (as the service does for a duplicate delivery, and as a reaper
            # would); asking again gets the refusal that says so.
            try:
                owned = await _enter(client, claim, settings, stack, cancel)
            except LeaseRefusedError as again:
                raise _refused(again.refusal) from None
    return _Ownership(
        client,
        (owned.sink,),
        owned.lease.attempt,
        owned.labels,
        owned.lease_gone,
        owned.deadline,
    )


async def _enter(
    client: aioredis.Redis,
    claim: Claim,
    settings: Settings,
    stack: AsyncExitStack,
    cancel: asyncio.Event,
) -> Owned:
    from worker.service.ownership import owning

    ownership = owning(client, claim, settings=settings, cancel=cancel, raise_when_broken=True)
    return await stack.enter_async_context(ownership)


def _recorded(spec: JobSpec, base_dir: Path) -> str:
    """The spec as the job's state records it: a relative local workspace made absolute,
    as ``submit`` records it, so that submitting the same file finds this job (``exists``)
    instead of a conflicting spec."""
    workspace = spec.workspace
    if isinstance(workspace, LocalWorkspace) and not Path(workspace.path).is_absolute():
        where = str((base_dir / workspace.path).resolve())
        spec = spec.model_copy(update={"workspace": workspace.model_copy(update={"path": where})})
    return spec.model_dump_json()


def _refused(refusal: Refusal) -> InvalidInput:
    job = f"job {refusal.job_id!r} attempt {refusal.attempt}"
    if refusal.reason == "settled":
        why = f"has already settled ({refusal.detail}); run it again under a new job_id"
    elif refusal.reason == "held":
        why = "is running: a live owner holds its lease"
    else:
        why = f"cannot be run here ({refusal.reason}: {refusal.detail})"
    return InvalidInput(
        f"{job} {why}; nothing was started",
        job_id=refusal.job_id,
        attempt=refusal.attempt,
        reason=refusal.reason,
    )


@contextlib.contextmanager
def _reaching_redis() -> Iterator[None]:
    import redis.exceptions

    from worker.errors import StoreRefused
    from worker.store.connect import refused

    try:
        yield
    except (redis.exceptions.RedisError, OSError) as exc:
        typed = refused(exc)
        if isinstance(typed, StoreRefused):  # TLS or ACL: retrying does not help
            raise typed from exc
        raise SinkUnavailable(f"cannot reach Redis: {exc}") from exc


def _local_sinks(args: argparse.Namespace, stack: AsyncExitStack) -> list[EventSink]:
    sinks: list[EventSink] = []
    if not args.quiet:
        sinks.append(ProgressSink(sys.stderr))
    if getattr(args, "json", False):
        sinks.append(JsonlSink(sys.stdout))
    if args.events_out is not None:
        handle = stack.enter_context(args.events_out.open("w", encoding="utf-8"))
        sinks.append(JsonlSink(handle, flush_each=False))
    return sinks


def _install_signals(cancel: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def first(signum: int) -> None:
        if cancel.is_set():
            os._exit(130)  # a second interrupt: the user wants out now
        print(f"\nacp-worker: {signal.Signals(signum).name}: cancelling the job…", file=sys.stderr)
        cancel.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, first, signum)
