"""The order of a job's phases, and the cancel and deadline checks between them.

A cancel (or a lost lease) and the deadline are checked at every phase boundary: one
that comes before the agent is launched (already set when the job starts, or during
preparation) settles the job without launching it, with a notice saying so. Opening the
session is cut at either; the turn is interrupted by either (``turn.Turn``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from worker.credentials.redact import Redactor
from worker.errors import AgentError, HandedBack, LeaseLost, ModelUnavailable, WorkerError
from worker.events import notices
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import JobAccepted, JobStarted, UsageReported
from worker.events.sinks import EventSink
from worker.job.expect import unmet
from worker.job.identity import recipe_for
from worker.job.outcome import (
    JobOutcome,
    Stopped,
    StopStatus,
    after_agent_exit,
    after_expectations,
    after_teardown,
    after_upload,
    interrupted,
    settled,
)
from worker.job.prepare import Preparation
from worker.job.slot import Pool, Recipe, Slot, pooled
from worker.job.spend import BudgetGuard, tenant_of
from worker.job.state import (
    Created,
    Declared,
    JobContext,
    JobTools,
    Made,
    Staged,
    TornDown,
    handing_back,
    lease_gone,
    new_tools,
)
from worker.job.teardown import Teardown
from worker.job.turn import Turn
from worker.jobs.spec import JobSpec
from worker.packs.runtime import LaunchPlan, PreparedPack
from worker.sandbox.base import LABEL_TOKEN, LeaseDeadline, SandboxBackend, prime
from worker.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from worker.workspace.prepare import Prepared

log = logging.getLogger(__name__)


async def run_job(
    spec: JobSpec,
    *,
    settings: Settings,
    backend: SandboxBackend,
    sinks: Sequence[EventSink],
    environ: Mapping[str, str],
    base_dir: Path | None = None,
    attempt: int = 1,
    cancel: asyncio.Event | None = None,
    labels: Mapping[str, str] | None = None,
    control: aioredis.Redis | None = None,
    lease_gone: Callable[[], Awaitable[bool]] | None = None,
    lease_deadline: LeaseDeadline | None = None,
    handing_back: Callable[[], bool] | None = None,
    pool: Pool | None = None,
    on_settled: Callable[[], None] | None = None,
) -> JobOutcome:
    """Run ``spec`` once and return how it settled; events go to ``sinks``.

    With ``control`` (Redis), questions, plans and permission asks become durable
    interactions answered through ``acpw:{J}:control``; without it they are declined.
    ``lease_gone`` (an owned job's ``Owned.lease_gone``): once it answers True, the
    teardown saves no session, captures no change and uploads nothing (a notice says so).
    ``lease_deadline`` (``Owned.deadline``) bounds the sandbox by the lease
    (``SandboxSpec.lease_deadline``). ``handing_back``: once it answers True, a job stopped
    by ``cancel`` was handed back by a draining worker (``job.completed`` ``cancelled`` with
    the error ``handed_back``, after a ``handed_back`` notice). ``pool``: the process's
    warm pools (``worker.job.warm``): a job of the same launch identity as a free slot
    claims it instead of making its sandbox and starting its agent. ``on_settled``: called
    once every event is written, ``job.completed`` last, when the job ran to its end,
    before its leftovers are removed (what no result depends on: ``Job.remove_leftovers``).
    """
    emitter = EventEmitter(
        job_id=spec.job_id,
        attempt=attempt,
        sinks=sinks,
        redactor=Redactor(),
        max_bytes=settings.event_max_bytes,
    )
    ctx = JobContext(
        spec=spec,
        settings=settings,
        backend=backend,
        emitter=emitter,
        environ=environ,
        base_dir=base_dir,
        attempt=attempt,
        labels=labels or {},
        control=control,
        lease_gone=lease_gone,
        lease_deadline=lease_deadline,
        handing_back=handing_back,
        pool=pool,
    )
    job = Job(ctx)
    ran = False
    try:
        outcome = await job.run(cancel or asyncio.Event())
        ran = True
    finally:
        try:
            await emitter.close()  # every event written, ``job.completed`` last
            if ran and on_settled is not None and emitter.completed is not None:
                on_settled()
        finally:
            try:
                await job.remove_leftovers()
            finally:
                job.replenish()
    return outcome


class Job:
    """One run of a job: its phases in order, then exactly one ``job.completed``.

    Each phase returns what it made; the run records it in ``_made`` (replaced, never
    changed in place), passes on what the next phase needs, and hands the teardown
    whatever was made by then."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._tools: JobTools = new_tools(ctx)
        self._made = Made()
        #: The tenant budget it runs under (a served or ``--redis`` job whose tenant has one).
        self._budget: BudgetGuard | None = None
        #: time.monotonic() by which the job must settle (set when it starts executing).
        self._deadline = float("inf")
        self._turn: Turn | None = None
        #: The recipe of the warm slot to make once the job settled (``_claim``).
        self._refill: Recipe | None = None
        #: The release of the backend's head start while the job prepares (``_prepare``).
        self._primed: Callable[[], None] | None = None
        #: The job's directory (and disk) to remove once it settled (``remove_leftovers``).
        self._leftover: Prepared | None = None
        #: Its sandbox, quiesced (``Quiescing``), to destroy then, first.
        self._quiesced: str | None = None

    async def run(self, cancel: asyncio.Event) -> JobOutcome:
        """accepted → prepare → launch → session → turn, then teardown and completion."""
        await self._accepted()
        try:
            stop_reason = await self._execute(cancel)
            outcome = settled(stop_reason)
        except Stopped as stop:
            outcome = await self._interrupted(stop)
        except WorkerError as exc:
            outcome = JobOutcome("failed", None, self._with_stderr(exc), exc.exit_code)
        finally:
            self._tools.timings.cut()  # a phase a stop or an error ended still gets its time
            answered_at = None if self._turn is None else self._turn.answered_at
            made = self._made = replace(self._made, answered_at=answered_at)
            torn = await Teardown(self._ctx, self._tools, made).run()
            self._leftover, self._quiesced = torn.leftover, torn.quiesced
        memory_mb = self._ctx.spec.limits.memory_mb
        outcome = after_agent_exit(outcome, torn.agent_exit, memory_mb=memory_mb)
        outcome = after_upload(outcome, torn.upload_error)
        outcome = after_teardown(outcome, torn.error)
        tool_calls = self._tools.normalizer.tool_calls
        expected = unmet(self._ctx.spec.expect, tool_calls=tool_calls, changes=torn.changes)
        outcome = after_expectations(outcome, expected)
        await self._complete(outcome, torn)
        return outcome

    async def remove_leftovers(self) -> None:
        """Once the job settled (its ``job.completed`` written, ``run_job``), destroy its
        quiesced sandbox (the kernel's reaping of what was killed) and remove its
        directory: the staged workspace, the fetched source, the workspace disk (unmounted,
        its sparse image unlinked). Tens of milliseconds that no result depends on. The
        caller still holds the job's lease, so no reaper judges them meanwhile; a step
        that fails is logged and left to the reaper, which destroys a sandbox and removes
        a labelled directory once its job is over (its owner gone, or its lease)."""
        quiesced, self._quiesced = self._quiesced, None
        leftover, self._leftover = self._leftover, None
        ctx = self._ctx
        if quiesced is not None:
            try:
                await ctx.backend.destroy(quiesced)
            except Exception:  # a sandbox error or a bug: the job has settled already
                log.exception(
                    "could not destroy sandbox %s of job %s attempt %s; the reaper will",
                    quiesced,
                    ctx.spec.job_id,
                    ctx.attempt,
                )
                return  # its directory goes with it, once the reaper destroyed it
        if leftover is None:
            return
        try:
            await leftover.remove()
        except OSError:
            log.exception(
                "could not remove the work directory of job %s attempt %s; the reaper will",
                ctx.spec.job_id,
                ctx.attempt,
            )

    def replenish(self) -> None:
        """Once the job settled (its events all written, ``run_job``), start the slot
        that replaces the one it asked for (``_claim``). Made while the job ran, it took
        the job's CPU and its loop: the warm job ended slower than a cold one."""
        if self._refill is not None and self._ctx.pool is not None:
            self._ctx.pool.replenish(self._refill)
            self._refill = None

    async def _interrupted(self, stop: Stopped) -> JobOutcome:
        """The outcome of a job stopped early. A lost lease also sets ``cancel``, and the
        heartbeat or the sink may be first to see it: either way the job failed
        ``lease_lost``, never `cancelled` by nobody. A draining worker's cancel hands
        the job back."""
        outcome = interrupted(stop)
        if outcome.status != "cancelled":
            return outcome
        if not await lease_gone(self._ctx):
            return await self._handed_back(outcome) if handing_back(self._ctx) else outcome
        error = LeaseLost(
            "the job's lease was lost (another owner holds it now): it stopped",
            job_id=self._ctx.spec.job_id,
        )
        return JobOutcome("failed", outcome.stop_reason, error, error.exit_code)

    async def _handed_back(self, outcome: JobOutcome) -> JobOutcome:
        """The attempt ends ``cancelled`` with ``handed_back``: the sink that owns the
        job's state queues the next attempt in the same write (``lua/append.lua``)."""
        ctx = self._ctx
        grace = ctx.settings.drain_grace_s
        await ctx.emitter.emit(notices.handed_back(ctx.attempt, ctx.settings.worker_id, grace))
        error = HandedBack(
            f"the worker shut down: attempt {ctx.attempt} was handed back",
            next_attempt=ctx.attempt + 1,
            worker_id=ctx.settings.worker_id,
            drain_grace_s=grace,
        )
        return JobOutcome("cancelled", outcome.stop_reason, error, error.exit_code)

    async def _accepted(self) -> None:
        ctx = self._ctx
        await ctx.emitter.emit(
            JobAccepted(
                pack=ctx.spec.pack.name,
                platform=ctx.spec.pack.platform,
                backend=ctx.backend.name,
                labels=dict(ctx.spec.labels),
            )
        )
        await ctx.emitter.emit(JobStarted(worker_id=ctx.settings.worker_id))

    async def _execute(self, cancel: asyncio.Event) -> str:
        # limits.timeout_s bounds the whole job from here: preparation is checked at each
        # phase boundary, opening the session is cut at the deadline, the turn gets what
        # is left. Teardown, change capture and the bundle upload come after it.
        deadline = self._deadline = time.monotonic() + self._ctx.spec.limits.timeout_s
        self._model_policy()
        await self._load_budget()
        plan = await self._prepare(cancel)
        turn = self._turn = Turn(self._ctx, self._tools, self._made, self._budget)
        await self._boundary(cancel, "agent_spawn")
        launched = await turn.launch(plan)
        self._made = replace(self._made, launched=launched)
        client = turn.start(launched)
        session_id = await turn.open(launched, cancel, deadline)
        await self._boundary(cancel, "turn")  # no prompt once cancelled
        return await turn.prompt(client, session_id, cancel, deadline)

    def _model_policy(self) -> None:
        """With ``ACPW_MODEL_PARAMS_REQUIRED`` a job must name its model: one that leaves
        it to the agent is refused before anything is prepared (its parameters are
        checked once the agent lists them, ``worker.acp.session``)."""
        ctx = self._ctx
        if ctx.settings.model_params_required and ctx.spec.model is None:
            raise ModelUnavailable(
                "the operator requires jobs to name a model and its parameters "
                "(ACPW_MODEL_PARAMS_REQUIRED): this job names none; nothing was started",
                reason="model_required",
            )

    async def _load_budget(self) -> None:
        """The tenant budget the job runs under, if its operator set one: a spent budget
        refuses the job before anything is prepared (``budget_exceeded``)."""
        ctx = self._ctx
        tenant = tenant_of(dict(ctx.spec.labels), ctx.settings.budget_label)
        guard = await BudgetGuard.load(ctx.control, tenant, retry_for=ctx.settings.sink_retry_s)
        if guard is not None:
            guard.check_start()
            self._budget = guard

    async def _prepare(self, cancel: asyncio.Event) -> LaunchPlan:
        """Everything before the launch, checking for a cancel between phases. A job cold
        for sure gives the backend its head start at once (``Priming``: the local backend
        makes its cgroup joins cheap), released once the sandbox is made."""
        self._primed = None if self._may_claim() else prime(self._ctx.backend)
        try:
            return await self._prepare_phases(cancel)
        finally:
            primed, self._primed = self._primed, None
            if primed is not None:
                primed()

    async def _prepare_phases(self, cancel: asyncio.Event) -> LaunchPlan:
        prepare = Preparation(self._ctx, self._tools)
        await self._boundary(cancel, "credentials")
        declared = await prepare.declaration()
        self._made = replace(self._made, declared=declared)
        names = declared.pack.credentials
        credentials = await prepare.credentials(names)
        await self._boundary(cancel, "pack_verify")
        agent_credentials = {k: v for k, v in credentials.items() if k in names}
        endpoint = declared.network.endpoint
        url = None if endpoint is None else endpoint.agent_url
        slot = None
        if not self._may_claim():  # cold for sure: the pack is checked while staging
            pack, staged = await self._pack_and_workspace(prepare, declared, credentials, cancel)
        else:
            pack, hold = await prepare.pack(declared)
            self._made = replace(self._made, pack_hold=hold)
            await prepare.pack_ready(pack)
            plan = pack.launch_plan(agent_credentials, endpoint_url=url)
            slot = await self._claim(declared, pack, plan=plan, credentials=agent_credentials)
            if slot is None:  # a miss: made cold
                self._primed = prime(self._ctx.backend)
            await self._boundary(cancel, "workspace")
            staged = await prepare.workspace(declared, credentials, self._made.workspace, slot)
        self._made = replace(self._made, staged=staged)
        await self._boundary(cancel, "sandbox_create")
        if slot is None:
            created = await prepare.sandbox(declared, pack, staged)
        else:
            created = await prepare.warm_sandbox(slot, staged)
            self._made = replace(self._made, staged=replace(staged, path=slot.workspace))
            workspace = self._made.workspace
            if workspace.staged is not None:
                workspace.staged = replace(workspace.staged, path=slot.workspace)
        self._made = replace(self._made, created=created)
        await prepare.sandbox_ready(created, slot)
        return pack.launch_plan(agent_credentials, endpoint_url=url)

    def _may_claim(self) -> bool:
        """Whether the job may find a warm slot (its pack has a pool here): the claim
        needs the checked pack before the workspace is staged (into the slot's disk)."""
        return pooled(self._ctx.pool, self._ctx.spec.pack.name)

    async def _pack_and_workspace(
        self,
        prepare: Preparation,
        declared: Declared,
        secrets: Mapping[str, str],
        cancel: asyncio.Event,
    ) -> tuple[PreparedPack, Staged]:
        """The pack's check (the closure's stat walk against its verified record, or its
        hashing) and the workspace's staging at once: neither reads the other's result
        and staging runs nothing. Both always run to their end (each registers what it
        made for the teardown: the closure's hold, the job's directory); a failed check
        fails the job after that, before anything runs on the closure, whatever the
        staging did. ``pack_verify`` is marked when the check returns, ``workspace``
        when both did (the staging's time past the check). A cancel or the deadline
        once the pack is ready still stops the job before the workspace phase ends, as
        in the serial order (its staged directory goes with the teardown)."""
        checking = asyncio.ensure_future(prepare.pack(declared))
        staging = asyncio.ensure_future(prepare.stage(declared, secrets, self._made.workspace))
        try:
            await asyncio.wait((checking, staging))
        except asyncio.CancelledError:  # the job's task itself: the hold still goes
            checking.add_done_callback(_release_hold)
            staging.add_done_callback(_retrieve)
            raise
        failure = checking.exception()
        if failure is not None:  # the phase under way stays ``pack_verify``
            _retrieve(staging)  # the check's error is the job's
            raise failure
        pack, hold = checking.result()
        self._made = replace(self._made, pack_hold=hold)
        await prepare.pack_ready(pack)
        await self._boundary(cancel, "workspace")
        staged = staging.result()
        await prepare.workspace_ready(self._made.workspace, staged)
        return pack, staged

    async def _claim(
        self,
        declared: Declared,
        pack: PreparedPack,
        *,
        plan: LaunchPlan,
        credentials: Mapping[str, str],
    ) -> Slot | None:
        """A warm slot of the job's launch identity, claimed for this attempt, or None
        (the cold path). A replacement of the same identity is made either way, once the
        job settled."""
        ctx = self._ctx
        pool = ctx.pool
        assert pool is not None
        recipe = recipe_for(ctx, declared, pack, plan, credentials)
        if recipe is None:
            return None
        token = ctx.labels.get(LABEL_TOKEN, "0")
        slot = await pool.claim(recipe, job_id=ctx.spec.job_id, attempt=ctx.attempt, token=token)
        self._refill = recipe  # made once the job settled (``replenish``)
        if slot is None:
            return None
        # Recorded at once: whatever happens next, the teardown stops its agent, destroys
        # its sandbox and removes its directory (its disk unmounted).
        self._made.workspace.cleanup.append(slot.directory)
        self._made = replace(
            self._made, warm=slot, created=Created(sandbox=slot.sandbox, files=None)
        )
        if declared.sessions is not None:  # the job's sessions are recorded in the slot's
            declared.sessions.host_dir = slot.sessions_dir
        return slot

    async def _boundary(self, cancel: asyncio.Event, next_phase: str) -> None:
        """Stop at this phase boundary once ``cancel`` is set (a cancel, a lost lease) or
        the job's deadline passed; before the launch, a notice says that the agent was
        never started."""
        status: StopStatus
        if cancel.is_set():
            status = "cancelled"
        elif time.monotonic() >= self._deadline:
            status = "timed_out"
        else:
            self._tools.timings.begin(next_phase)
            return
        if self._made.launched is None:
            await self._ctx.emitter.emit(notices.not_launched(status, next_phase))
        raise Stopped(status, None)

    def _with_stderr(self, exc: WorkerError) -> WorkerError:
        launched = self._made.launched
        if isinstance(exc, AgentError) and launched is not None:
            exc.details.setdefault("stderr_preview", launched.agent.stderr.preview())
        return exc

    async def _complete(self, outcome: JobOutcome, torn: TornDown) -> None:
        """Delegations still running closed (``job_ended``), ``usage.reported``
        unavailable if the agent never reported usage, then
        ``job.completed``: with ``timings_ms`` and ``result`` (``null`` when no bundle was
        uploaded) always, ``result_error`` / ``teardown_error`` when that step failed."""
        tools, emitter = self._tools, self._ctx.emitter
        # The agent is gone: a subagent task it left running ends with the job, said so.
        for event in tools.normalizer.close_delegations():
            await emitter.emit(event)
        if not tools.normalizer.usage_seen:
            await emitter.emit(UsageReported(available=False))
        if self._budget is not None:
            notice = await self._budget.settle(tools.spend)
            if notice is not None:
                await emitter.emit(notice)
        completed = job_completed(
            status=outcome.status,
            stop_reason=outcome.stop_reason,
            error=outcome.error,
            duration_ms=tools.timings.total_ms(),
            timings_ms=tools.timings.marks,
            result=torn.result,
            result_error=torn.upload_error,
            teardown_error=torn.error,
            usage=tools.spend.summary(),
        )
        await emitter.emit(completed)


def _release_hold(checking: asyncio.Future[tuple[PreparedPack, int]]) -> None:
    """Close the closure's hold of a check whose job stopped waiting for it."""
    if not checking.cancelled() and checking.exception() is None:
        os.close(checking.result()[1])


def _retrieve(task: asyncio.Future[Staged]) -> None:
    if not task.cancelled():
        task.exception()  # its directory is registered: the teardown removes it
