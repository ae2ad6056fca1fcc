"""What one job runs with (``JobContext``, fixed) and what its phases made (``JobState``).

The phases are separate classes (preparation, turn, teardown); they share these two
objects instead of one class's attributes, so each phase can be read alone and the
teardown sees exactly what the earlier phases got as far as making.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.acp.agent import AgentProcess
from worker.acp.session import AcpSession
from worker.errors import ResultUploadFailed, WorkerError
from worker.events import notices
from worker.events.emitter import EventEmitter
from worker.events.normalizer import Normalizer
from worker.interactions import InteractionBroker, InteractionStore
from worker.job.network import NetworkPlan
from worker.job.outcome import Timings
from worker.job.spend import BudgetGuard, Spend
from worker.jobs.spec import JobSpec
from worker.sandbox import base
from worker.sandbox.base import ExitDiagnosis, Sandbox, SandboxBackend
from worker.sandbox.files import WorkspaceFiles
from worker.sessions import JobSessions
from worker.settings import Settings
from worker.workspace.capture import Change
from worker.workspace.prepare import Prepared

if TYPE_CHECKING:
    import redis.asyncio as aioredis


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext:
    """The job and the worker it runs in: set before the first event, never changed."""

    spec: JobSpec
    settings: Settings
    backend: SandboxBackend
    emitter: EventEmitter
    environ: Mapping[str, str]
    #: What a relative local workspace path is resolved against.
    base_dir: Path | None
    attempt: int
    #: The sandbox labels the caller fixed (``acpw.token``: the lease's fence, ``0``
    #: for a run without a lease).
    labels: Mapping[str, str]
    #: Redis for durable interactions; without it questions and plans are declined.
    control: aioredis.Redis | None
    #: Whether the job's lease is gone (``Owned.lease_gone``); None: a run without one.
    #: Once it is, the teardown runs nothing that writes results (see ``lease_gone``).
    lease_gone: Callable[[], Awaitable[bool]] | None = None
    #: When the lease expires unless renewed (``Owned.deadline``); None: no lease.
    lease_deadline: base.LeaseDeadline | None = None
    #: Whether a cancel now means "hand the job back" (a draining worker, not the control
    #: plane, stopped it); None: a run that is never handed back.
    handing_back: Callable[[], bool] | None = None


async def lease_gone(ctx: JobContext) -> bool:
    """True once the job's lease is gone: another attempt (or a reaper) owns the job
    now, so its results are not this attempt's to write."""
    return ctx.lease_gone is not None and await ctx.lease_gone()


def handing_back(ctx: JobContext) -> bool:
    """True once a draining worker asked for the job back (see ``JobContext``)."""
    return ctx.handing_back is not None and ctx.handing_back()


async def tell_results_skipped(ctx: JobContext, skipped: list[str]) -> None:
    """Say on the sinks that still take events that ``skipped`` did not run because the
    lease is gone. The fenced Redis sink refusing it is expected (that is how a lost
    lease shows there), not a teardown failure."""
    with contextlib.suppress(WorkerError):
        await ctx.emitter.emit(notices.results_skipped_lease_lost(skipped))


@dataclass(slots=True, kw_only=True)
class JobState:
    """What the phases made so far; the teardown dismantles what is set here."""

    normalizer: Normalizer
    broker: InteractionBroker
    timings: Timings = field(default_factory=Timings)
    #: time.monotonic() by which the job must settle (set when it starts executing).
    deadline: float = float("inf")
    provider: str = "cursor"
    sessions: JobSessions | None = None
    #: The job's network and model endpoint (set with the declaration).
    network: NetworkPlan | None = None
    #: A shared lock on the pack closure's digest (``hold_closure``): a pack-cache gc
    #: keeps the closure while the job runs. Released after the sandbox is destroyed.
    pack_hold: int | None = None
    prepared: Prepared = field(default_factory=Prepared)
    job_dir: Path | None = None
    sandbox: Sandbox | None = None
    #: The sandbox's workspace files (artifacts, links, ``fs/*``), when its backend
    #: gives them (``Sandbox.workspace_files``).
    files: WorkspaceFiles | None = None
    agent: AgentProcess | None = None
    #: The launch's ``exits_on_eof`` (see ``LaunchPlan``): how the teardown stops it.
    agent_exits_on_eof: bool = True
    #: Why the agent ended, when it ended on its own (the teardown did not signal it).
    agent_exit: ExitDiagnosis | None = None
    acp: AcpSession | None = None
    #: ``time.time()`` when the agent last answered a prompt (None: it never did).
    answered_at: float | None = None
    #: What the attempt spent, as its agent reported it.
    spend: Spend = field(default_factory=Spend)
    #: The tenant budget it runs under (a served or ``--redis`` job whose tenant has one).
    budget: BudgetGuard | None = None
    #: What the capture found (None: no capture ran, or it failed).
    changes: tuple[Change, ...] | None = None
    result: dict[str, Any] | None = None
    upload_error: ResultUploadFailed | None = None
    #: The first teardown step that failed (the teardown does not raise).
    teardown_error: WorkerError | None = None


def new_state(ctx: JobContext) -> JobState:
    """The state of a job that has not started: its normalizer and interaction broker
    (durable through ``ctx.control`` when there is one), and its clock started."""
    spec, settings = ctx.spec, ctx.settings
    store = None
    if ctx.control is not None:
        ttl = settings.events_ttl + int(spec.limits.timeout_s)
        fence = int(ctx.labels.get(base.LABEL_TOKEN, "0")) or None  # 0: no lease (`run`)
        store = InteractionStore(ctx.control, spec.job_id, ttl_s=ttl, token=fence)
    broker = InteractionBroker(
        job_id=spec.job_id,
        attempt=ctx.attempt,
        emit=ctx.emitter.emit,
        store=store,
        timeout_s=spec.interactions.answer_timeout_s,
        max_event_bytes=settings.event_max_bytes,
    )
    normalizer = Normalizer(workspace_root=base.WORKSPACE, text_limit=settings.tool_output_bytes)
    return JobState(normalizer=normalizer, broker=broker)
