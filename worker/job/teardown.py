"""Dismantling what a job made: stop the agent, destroy the sandbox (or quiesce it, where
the backend can say sooner that nothing in it can run: ``Quiescing``), then (only once
it is gone or quiesced) save the session, capture the changes and keep the workspace or
mark the job's directory for removal. A quiesced sandbox's destroy and the removal (the
staged copy, the fetched source, the workspace disk's unmount and its image's unlink)
run once ``job.completed`` is written (``Job.remove_leftovers``, from ``run_job``): no
result depends on them, and a worker that dies first leaves both, labelled, to the
reaper, as it always could.

The teardown never raises: a step that fails is logged and the first such error kept
(``TornDown.error``), so the job still settles with exactly one ``job.completed``,
and the later steps still run: the sandbox is destroyed whatever happened to the agent.
A sandbox that could not be destroyed may still run processes writing to the workspace
and hold mounts on it, though: then no session is saved, no change captured and nothing
removed; the job's directory is left to the reaper, which destroys the sandbox again
before it removes the directory.

Once the job's lease is gone (another attempt, or a reaper that settled it ``lost``, owns
the job now, and may be removing this work directory), nothing that writes the job's
results runs: no session saved, no change captured, no bundle uploaded, no workspace
kept. A ``notice`` says so (to the sinks that still take events) and a log line too; the
workspace is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from worker.acp.agent import AgentProcess
from worker.errors import OomKilled, WorkerError
from worker.events import notices
from worker.events.emitter import utc_timestamp
from worker.job.outcome import teardown_error
from worker.job.results import Capture
from worker.job.state import (
    JobContext,
    JobTools,
    Launched,
    Made,
    TornDown,
    lease_gone,
    tell_results_skipped,
)
from worker.sandbox.base import ExitDiagnosis, Quiescing
from worker.workspace.prepare import Prepared

#: A file's mtime comes from the kernel's coarse clock (one tick, 4 ms at HZ=250, behind
#: ``time.time()``): a write right after the answer may carry a time just before it.
_MTIME_TICK_S = 0.01
#: How often the recording is looked for: the wait holds the job's end back (a claude
#: job's transcript lands after its answer), by half a period on average.
_SETTLE_POLL_S = 0.003

log = logging.getLogger(__name__)


class Teardown:
    """One job's teardown, over what its phases made; ``run`` returns what it found."""

    def __init__(self, ctx: JobContext, tools: JobTools, made: Made) -> None:
        self._ctx = ctx
        self._tools = tools
        self._made = made
        self._agent_exit: ExitDiagnosis | None = None
        self._error: WorkerError | None = None
        self._capture = Capture(ctx, tools, made)
        #: Set once the sandbox is gone and the job's directory may go (``_dismantle``).
        self._leftover: Prepared | None = None
        #: The sandbox quiesced, not yet destroyed (``_destroy``).
        self._quiesced: str | None = None

    async def run(self) -> TornDown:
        """Every step, in order; the closure hold is released last, whatever happened."""
        try:
            await self._step("agent_shutdown", self._stop_agent)
            destroyed = await self._step("sandbox_destroy", self._destroy)
            await self._step("cleanup", self._dismantle if destroyed else self._abandon)
        finally:
            if self._made.pack_hold is not None:
                os.close(self._made.pack_hold)
        results = self._capture.results
        return TornDown(
            agent_exit=self._agent_exit,
            changes=results.changes,
            result=results.result,
            upload_error=results.upload_error,
            error=self._error,
            leftover=self._leftover,
            quiesced=self._quiesced,
        )

    async def _step(self, step: str, work: Callable[[], Awaitable[None]]) -> bool:
        """Run one teardown step: whether it completed; a failure is logged and kept."""
        try:
            await work()
        except Exception as exc:  # any failure (a sink, a bug too): the job must still settle
            log.exception("teardown step %s failed for job %s", step, self._ctx.spec.job_id)
            if self._error is None:
                self._error = teardown_error(step, exc)
            return False
        return True

    async def _stop_agent(self) -> None:
        launched, settings = self._made.launched, self._ctx.settings
        if launched is None:
            if self._made.warm is not None:  # a warm slot's agent, never launched for the job
                agent = self._made.warm.agent
                await agent.shutdown(eof_grace=0.0, term_grace=settings.shutdown_term_grace)
            return
        try:
            await launched.acp.terminals.close_all()
        finally:
            await self._await_recording(launched)
            agent = launched.agent
            # No EOF can reach it (a stream without half-close): escalate at once.
            eof = agent.process.stdin_eof
            if launched.exits_on_eof and not eof and agent.process.returncode is None:
                term_grace = settings.shutdown_term_grace
                await self._ctx.emitter.emit(notices.stdin_eof_unavailable(term_grace))
            await agent.shutdown(
                eof_grace=settings.shutdown_eof_grace if launched.exits_on_eof and eof else 0.0,
                term_grace=settings.shutdown_term_grace,
            )
            await self._diagnose(agent)

    async def _await_recording(self, launched: Launched) -> None:
        """Give an agent that records a turn after answering it (its pack's
        ``launch.sessions.recorded_after_answer``) the time to write the last one, at most
        ``ACPW_SESSION_SETTLE_S``, before its stdin closes: it exits on EOF without waiting
        for that write, and nothing of it outlives the sandbox."""
        sessions, answered = self._made.sessions, self._made.answered_at
        session_id = launched.acp.session_id
        if (
            sessions is None
            or answered is None
            or session_id is None
            or not sessions.files.recorded_after_answer
            or sessions.host_dir is None
            or launched.agent.process.returncode is not None
        ):
            return
        since = answered - _MTIME_TICK_S
        deadline = time.monotonic() + self._ctx.settings.session_settle_s
        while not await asyncio.to_thread(sessions.written_since, session_id, since):
            if time.monotonic() >= deadline:
                log.info(
                    "job %s: session %s not written within %.1f s of the answer",
                    self._ctx.spec.job_id,
                    session_id,
                    self._ctx.settings.session_settle_s,
                )
                return
            await asyncio.sleep(_SETTLE_POLL_S)

    async def _diagnose(self, agent: AgentProcess) -> None:
        """Why the agent ended, asked before its sandbox goes (the evidence goes with
        it); only when it ended on its own: a status the shutdown caused says nothing."""
        if agent.signalled:
            return
        diagnosis = await agent.process.exit_diagnosis()
        self._agent_exit = diagnosis
        ended_by = diagnosis.sandbox_error
        # A sandbox OOM-killed as a whole (a pod's container) hit the same bound.
        if diagnosis.oom_killed or (ended_by is not None and ended_by.code == OomKilled.code):
            memory_mb = self._ctx.spec.limits.memory_mb
            await self._ctx.emitter.emit(notices.oom_killed(memory_mb))

    async def _destroy(self) -> None:
        """Destroy the sandbox, or quiesce it where the backend can say sooner that
        nothing in it runs (``Quiescing``): its ``destroy`` (the kernel's reaping of what
        was killed, tens of milliseconds for a big agent) then waits until
        ``job.completed`` is written (``Job.remove_leftovers``)."""
        if self._made.sandbox is None:
            return
        backend, sandbox_id = self._ctx.backend, self._made.sandbox.sandbox_id
        if isinstance(backend, Quiescing):
            await backend.quiesce(sandbox_id)
            self._quiesced = sandbox_id
        else:
            await backend.destroy(sandbox_id)

    async def _abandon(self) -> None:
        """The sandbox survived its destroy: say what was left undone."""
        self._tools.timings.mark("teardown")
        sandbox = self._made.sandbox
        sandbox_id = sandbox.sandbox_id if sandbox is not None else None
        await self._ctx.emitter.emit(notices.sandbox_not_destroyed(sandbox_id))

    async def _dismantle(self) -> None:
        """Everything after the sandbox is destroyed."""
        ctx, made = self._ctx, self._made
        if await lease_gone(ctx):
            await self._lease_lost()
            return
        await self._step("session_save", self._save_session)
        self._tools.timings.mark("teardown")
        try:
            if made.workspace.staged is not None and made.sandbox is not None:
                await self._capture.run(made.workspace.staged)
        finally:  # a sink that failed on workspace.changed must not leave the workspace
            if ctx.spec.keep_workspace and made.staged is not None:
                await self._keep(made.staged.job_dir)
            else:
                self._leftover = made.workspace

    async def _lease_lost(self) -> None:
        """The lease went before the results were written: write none, say so, and
        remove the workspace (it is no longer this attempt's)."""
        ctx = self._ctx
        self._tools.timings.mark("teardown")
        skipped = ["session_save", "capture", "bundle_upload"]
        if ctx.spec.keep_workspace:
            skipped.append("keep_workspace")
        log.warning(
            "the lease of job %s attempt %s is gone: %s skipped",
            ctx.spec.job_id,
            ctx.attempt,
            ", ".join(skipped),
        )
        try:
            await tell_results_skipped(ctx, skipped)
        finally:
            self._leftover = self._made.workspace

    async def _save_session(self) -> None:
        """Keep the session the agent recorded (once ``session.started`` went out), then
        drop the per-job directory: now when the job's directory is kept (a kept
        workspace shows no agent state), else with that directory once ``job.completed``
        is written (``Job.remove_leftovers``). Runs only after the sandbox is destroyed."""
        made = self._made
        if made.sessions is None:
            return
        session_id = made.launched.acp.session_id if made.launched is not None else None
        answered = made.answered_at is not None
        saved = await asyncio.to_thread(made.sessions.save, session_id, answered=answered)
        if self._ctx.spec.keep_workspace:
            with contextlib.suppress(OSError):  # the job dir's removal retries it
                await asyncio.to_thread(made.sessions.remove)
        for notice in saved:
            await self._ctx.emitter.emit(notice)

    async def _keep(self, job_dir: Path) -> None:
        until = time.time() + self._ctx.settings.keep_workspace_s
        kept = await self._made.workspace.keep(job_dir, until=until)
        if kept is not None:
            notice = notices.workspace_kept(str(kept), utc_timestamp(until))
            await self._ctx.emitter.emit(notice)
