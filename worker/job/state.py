"""What one job runs with (``JobContext``, fixed), the instruments its phases share
(``JobTools``), and what each phase made, as the phase returned it.

Each phase returns its result as a small frozen record (``Declared``, ``Staged``,
``Created``, ``Launched``, and the teardown's ``TornDown``); the pipeline keeps them in a
``Made`` and passes on what the next phase needs, so no phase writes another's fields and
which phase depends on which is in the signatures. The teardown gets exactly what the
earlier phases got as far as making.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from worker.acp.agent import AgentProcess
from worker.acp.session import AcpSession
from worker.errors import ResultUploadFailed, WorkerError
from worker.events import notices
from worker.events.emitter import EventEmitter
from worker.events.normalizer import Normalizer
from worker.interactions import InteractionBroker, InteractionStore
from worker.job.network import NetworkPlan
from worker.job.outcome import Timings
from worker.job.spend import Spend
from worker.jobs.spec import JobSpec
from worker.packs.manifest import Pack
from worker.sandbox import base
from worker.sandbox.base import ExitDiagnosis, Sandbox, SandboxBackend
from worker.sandbox.files import WorkspaceFiles
from worker.sessions import JobSessions
from worker.settings import Settings
from worker.workspace.capture import Change
from worker.workspace.prepare import Prepared

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from worker.job.slot import Pool, Slot
    from worker.rpc.wire import JsonValue


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
    #: This process's warm pools (``worker.job.warm``); None: every job is cold.
    pool: Pool | None = None


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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTools:
    """The job's instruments, made before its first phase and shared by every phase: each
    is an object with its own rules (the normalizer's state, the broker's interactions,
    the clock's marks, what the agent spent); none of these fields is ever reassigned."""

    normalizer: Normalizer
    broker: InteractionBroker
    timings: Timings = field(default_factory=Timings)
    #: What the attempt spent, as its agent reported it.
    spend: Spend = field(default_factory=Spend)


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """The pack's declaration phase: the declaration (its runtime checked), the job's
    network and model endpoint, and its session store (None: the pack keeps none)."""

    pack: Pack
    network: NetworkPlan
    sessions: JobSessions | None

    @property
    def provider(self) -> str:
        """Whose ambient config the admission looks for: the pack's provider."""
        return self.pack.manifest.provider


@dataclass(frozen=True, slots=True, kw_only=True)
class Staged:
    """The workspace phase: the job's labelled directory and the staged workspace in it
    (``skipped``: the special files staging did not copy)."""

    job_dir: Path
    path: Path
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Created:
    """The sandbox phase: the sandbox, and its workspace files (artifacts, links,
    ``fs/*``) when its backend gives them (``Sandbox.workspace_files``)."""

    sandbox: Sandbox
    files: WorkspaceFiles | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    """The launch: the agent process, its ACP session, and how the teardown stops it
    (the launch's ``exits_on_eof``, see ``LaunchPlan``)."""

    agent: AgentProcess
    acp: AcpSession
    exits_on_eof: bool
    #: A warm slot's agent: its answer to ``initialize`` (already started and asked).
    initialized: Mapping[str, JsonValue] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Made:
    """What the job made so far, one field per phase, recorded by the pipeline as each
    phase returns (None: that phase has not returned). ``workspace`` exists from the
    start: the workspace phase registers what it creates there as it goes, so a staging
    that fails half-way is still removed."""

    workspace: Prepared = field(default_factory=Prepared)
    declared: Declared | None = None
    #: A shared lock on the pack closure's digest (``hold_closure``): a pack-cache gc
    #: keeps the closure while the job runs. Released after the sandbox is destroyed.
    pack_hold: int | None = None
    staged: Staged | None = None
    created: Created | None = None
    launched: Launched | None = None
    #: The warm slot the job claimed (its sandbox is ``created.sandbox``); None: cold.
    warm: Slot | None = None
    #: ``time.time()`` when the agent last answered a prompt (None: it never did).
    answered_at: float | None = None

    @property
    def sessions(self) -> JobSessions | None:
        return None if self.declared is None else self.declared.sessions

    @property
    def sandbox(self) -> Sandbox | None:
        return None if self.created is None else self.created.sandbox

    @property
    def files(self) -> WorkspaceFiles | None:
        return None if self.created is None else self.created.files


@dataclass(frozen=True, slots=True, kw_only=True)
class TornDown:
    """What the teardown found: why the agent ended when it ended on its own, what the
    capture found (None: no capture ran, or it failed), the uploaded bundle, and the
    first failures of the upload and of a teardown step. ``leftover``: what is still to
    be removed once ``job.completed`` is written (the job's directory, its disk image);
    None when nothing is (kept, left to the reaper, or never made). ``quiesced``: the
    sandbox only quiesced (``Quiescing``), whose ``destroy`` comes then too, first."""

    agent_exit: ExitDiagnosis | None = None
    changes: tuple[Change, ...] | None = None
    result: dict[str, object] | None = None
    upload_error: ResultUploadFailed | None = None
    error: WorkerError | None = None
    leftover: Prepared | None = None
    quiesced: str | None = None


def new_tools(ctx: JobContext) -> JobTools:
    """The instruments of a job that has not started: its normalizer and interaction
    broker (durable through ``ctx.control`` when there is one), and its clock started."""
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
    return JobTools(normalizer=normalizer, broker=broker)
