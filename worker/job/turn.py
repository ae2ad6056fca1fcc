"""The agent's part of a job: launch (after admission in the sandbox's view), the session
opened, the prompt, and an interrupt on cancel or deadline.

``launch_agent`` is also how ``acp-worker agents probe`` starts its agent, so a probe
is admitted in the sandbox's own view exactly as a job is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from worker.acp.agent import AgentProcess
from worker.acp.client import AcpClient, PromptResult
from worker.acp.prompt import check_links
from worker.acp.session import AcpSession, SessionWiring
from worker.admission import Note
from worker.errors import SandboxError, WorkerError
from worker.events import artifacts, notices
from worker.events.models import EventData, UsageReported
from worker.job.outcome import Stopped, StopStatus
from worker.job.spend import BudgetGuard
from worker.job.state import JobContext, JobTools, Launched, Made
from worker.jobs.prompt import workspace_path
from worker.packs.runtime import LaunchPlan
from worker.rpc.connection import (
    MalformedHandler,
    NotificationHandler,
    OversizeHandler,
    StrayReply,
    StrayReplyHandler,
)
from worker.rpc.oversize import OversizeLine
from worker.sandbox import base
from worker.sandbox.base import Sandbox
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.job.slot import Slot


async def readmit(sandbox: Sandbox, *, provider: str) -> tuple[Note, ...]:
    """Admission again, in the sandbox's own mount view, right before launch (where the
    backend can show its view; its masks guard the whole run either way). Returns what
    it could not judge there.

    Raises:
        AdmissionRefused: something the admission refuses appeared since staging.
    """
    result = await asyncio.to_thread(sandbox.admission_view, provider=provider)
    if result is None:
        return ()
    result.raise_if_refused()
    return result.notes


async def launch_agent(
    sandbox: Sandbox,
    plan: LaunchPlan,
    settings: Settings,
    *,
    provider: str,
    on_notification: NotificationHandler,
    on_malformed: MalformedHandler,
    on_oversize: OversizeHandler | None = None,
    on_stray_reply: StrayReplyHandler | None = None,
    on_admission_notes: Callable[[tuple[Note, ...]], Awaitable[None]] | None = None,
) -> AgentProcess:
    """The agent spawned in ``sandbox`` once re-admitted; not started yet, so that the
    caller can route inbound requests before the first line is read. What the
    re-admission could not judge goes to ``on_admission_notes`` before the spawn."""
    notes = await readmit(sandbox, provider=provider)
    if notes and on_admission_notes is not None:
        await on_admission_notes(notes)
    process = await sandbox.spawn(
        plan.argv, env=plan.env, cwd=base.WORKSPACE, stdout_limit=settings.acp_line_limit
    )
    return AgentProcess(
        process,
        line_limit=settings.acp_line_limit,
        request_timeout=settings.acp_request_timeout,
        stderr_limit=settings.stderr_buffer_bytes,
        on_notification=on_notification,
        on_malformed=on_malformed,
        on_oversize=on_oversize,
        on_stray_reply=on_stray_reply,
    )


class Turn:
    """One job's agent: launched, its session opened, prompted once, in what the
    preparation made (``made``: its declaration, workspace and sandbox)."""

    def __init__(
        self, ctx: JobContext, tools: JobTools, made: Made, budget: BudgetGuard | None = None
    ) -> None:
        self._ctx = ctx
        self._tools = tools
        self._made = made
        self._budget = budget
        #: ``time.time()`` when the agent last answered a prompt (None: it never did).
        self.answered_at: float | None = None

    async def launch(self, plan: LaunchPlan) -> Launched:
        """The agent spawned in the job's sandbox, its session wired; not started yet
        (``start``), so that the caller records it before a line is read."""
        ctx, tools, made = self._ctx, self._tools, self._made
        assert made.created is not None
        assert made.declared is not None
        sandbox, files = made.created.sandbox, made.created.files
        slot = made.warm
        if slot is not None:
            agent = await self._warm_agent(slot)
        else:
            agent = await launch_agent(
                sandbox,
                plan,
                ctx.settings,
                provider=made.declared.provider,
                on_notification=self._notification,
                on_malformed=self._malformed,
                on_oversize=self._oversize,
                on_stray_reply=self._stray_reply,
                on_admission_notes=self._admission_notes,
            )
        acp = AcpSession(
            agent.connection,
            SessionWiring(
                spec=ctx.spec,
                dialect=plan.dialect,
                emit=ctx.emitter.emit,
                normalizer=tools.normalizer,
                broker=tools.broker,
                sandbox=sandbox,
                # No fs methods for a pack that opts out: the agent uses its own.
                files=files if plan.client_fs else None,
                look_up=None if files is None else files.look_up,
                terminal_output_bytes=ctx.settings.tool_output_bytes,
                authenticate=plan.authenticate,
                default_mode=plan.default_mode,
                params_required=ctx.settings.model_params_required,
            ),
        )
        if slot is not None and acp.capabilities != slot.recipe.capabilities:
            raise SandboxError("the warm slot's agent was initialized with other capabilities")
        initialized = None if slot is None else slot.initialized
        return Launched(
            agent=agent, acp=acp, exits_on_eof=plan.exits_on_eof, initialized=initialized
        )

    async def _warm_agent(self, slot: Slot) -> AgentProcess:
        """A warm slot's agent, re-admitted in its sandbox's view as a cold launch is
        (the job's workspace is in it now) and its messages routed to this job."""
        assert self._made.declared is not None
        notes = await readmit(slot.sandbox, provider=self._made.declared.provider)
        if notes:
            await self._admission_notes(notes)
        relay = slot.relay
        relay.notification = self._notification
        relay.malformed = self._malformed
        relay.oversize = self._oversize
        relay.stray_reply = self._stray_reply
        return slot.agent

    def start(self, launched: Launched) -> AcpClient:
        """The launched agent's stdout read from now on (``agent_spawn``); a warm slot's
        agent is read from already."""
        if launched.initialized is None:
            launched.agent.start()
        self._tools.timings.mark("agent_spawn")
        return launched.acp.client

    async def _admission_notes(self, notes: tuple[Note, ...]) -> None:
        """The sandbox view's notes that the staging admission did not already give."""
        said = {(n.path, n.code) for n in self._made.workspace.admission_notes}
        new = [n.to_dict() for n in notes if (n.path, n.code) not in said]
        if new:
            await self._ctx.emitter.emit(notices.admission_notes(new))

    async def open(self, launched: Launched, cancel: asyncio.Event, deadline: float) -> str:
        """The session, opened unless a cancel (or a lost lease) or the deadline comes
        first: each of its requests may otherwise wait up to the ACP request timeout.

        Raises:
            Stopped: cancelled or out of time first.
        """
        timings, session = self._tools.timings, self._ctx.spec.session
        opened = "session_load" if session is not None and session.resume else "session_new"

        def mark(phase: str) -> None:  # each phase reached is under way until marked
            timings.mark(phase)
            if phase == "initialize":
                timings.begin(opened)

        timings.begin("initialize")
        opening = asyncio.create_task(launched.acp.open(mark, initialized=launched.initialized))
        try:
            if await _done_first(opening, cancel, deadline):
                return opening.result()
            raise Stopped("cancelled" if cancel.is_set() else "timed_out", None)
        finally:
            await _end(opening)

    async def prompt(
        self, client: AcpClient, session_id: str, cancel: asyncio.Event, deadline: float
    ) -> str:
        """The turn: the job's prompt, answered interactions meanwhile; its stop reason.

        Raises:
            Stopped: cancelled or out of time (the agent was asked to stop).
            PromptRefused: a linked workspace file is missing or reached through a link.
        """
        broker = self._tools.broker
        broker.begin_turn()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self._ctx.control is not None:
                    from worker.interactions.control import AnswerReader  # redis: only here

                    reader = AnswerReader(self._ctx.control, broker)
                    await stack.enter_async_context(reader.running())
                return await self._prompt(client, session_id, cancel, deadline)
        finally:
            await broker.end_turn("turn_ended")
            self._tools.normalizer.settled = True

    async def _prompt(
        self, client: AcpClient, session_id: str, cancel: asyncio.Event, deadline: float
    ) -> str:
        blocks = self._ctx.spec.prompt_blocks()
        # Linked files checked against the workspace as the agent will find them.
        files = self._made.files
        if files is not None:
            links = [b for b in blocks if b.get("type") == "resource_link"]
            await files.look_up([workspace_path(str(b["uri"])) for b in links])
        check_links(blocks, self._tools.normalizer.artifacts)
        prompt = asyncio.create_task(client.turn(session_id, blocks))
        prompt.add_done_callback(self._answered)
        budget = self._budget
        over = budget.exceeded if budget is not None else None
        try:
            if await _done_first(prompt, cancel, deadline, over):
                result = prompt.result()
                self._tools.timings.mark("turn")
                await self._ctx.emitter.flush_text()  # the turn's streamed text, held back
                if result.usage is not None:
                    await self._emit(self._tools.normalizer.prompt_usage(result.usage))
                return result.stop_reason
            if budget is not None and budget.error is not None and not cancel.is_set():
                await self._tools.broker.end_turn("cancelled")
                await self._interrupt(client, session_id, prompt)
                raise budget.error
            status: StopStatus = "cancelled" if cancel.is_set() else "timed_out"
            # Open questions are answered `cancelled` first, so nothing waits on them.
            await self._tools.broker.end_turn(status)
            raise Stopped(status, await self._interrupt(client, session_id, prompt))
        finally:
            await _end(prompt)

    def _answered(self, prompt: asyncio.Task[PromptResult]) -> None:
        if not prompt.cancelled() and prompt.exception() is None:
            self.answered_at = time.time()

    async def _interrupt(
        self, client: AcpClient, session_id: str, prompt: asyncio.Task[PromptResult]
    ) -> str | None:
        """session/cancel, then wait the grace period for the agent's own stop reason."""
        with contextlib.suppress(WorkerError):
            await client.cancel(session_id)
        try:
            grace = self._ctx.settings.cancel_grace
            return (await asyncio.wait_for(asyncio.shield(prompt), grace)).stop_reason
        except (TimeoutError, WorkerError):
            return None

    async def _emit(self, events: list[EventData]) -> None:
        """Emit ``events``; what a ``usage.reported`` among them adds is this attempt's
        spend, charged to its budget (if any) right after the event went out."""
        tools, emitter, budget = self._tools, self._ctx.emitter, self._budget
        for event in events:
            await emitter.emit(event)
            if isinstance(event, UsageReported):
                added = tools.spend.observe(event, replay=tools.normalizer.replay)
                if budget is not None:
                    notice = await budget.charge(added, tools.spend)
                    if notice is not None:
                        await emitter.emit(notice)

    async def _notification(self, method: str, params: object) -> None:
        """A ``session/update`` as its events; any other notification is kept as
        ``provider.unmapped`` (nothing the agent says is dropped)."""
        emitter, normalizer = self._ctx.emitter, self._tools.normalizer
        if method != "session/update":
            await emitter.emit(normalizer.provider_unmapped(method, params))
            return
        paths = artifacts.named_paths(method, params)
        files = self._made.files
        if paths and files is not None:
            await files.look_up(paths)
        await self._emit(normalizer.session_update(params))

    async def _malformed(self, preview: str, reason: str) -> None:
        await self._ctx.emitter.emit(notices.acp_malformed_line(preview, reason))

    async def _stray_reply(self, reply: StrayReply) -> None:
        notice = notices.acp_stray_reply(reply.id, duplicate=reply.duplicate, method=reply.method)
        await self._ctx.emitter.emit(notice)

    async def _oversize(self, line: OversizeLine) -> None:
        """A line over the bound, skipped: a tool update's event from its first bytes
        (output cut), then the notice saying what was lost."""
        events = self._tools.normalizer.oversize_update(line)
        for event in events:
            await self._ctx.emitter.emit(event)
        await self._ctx.emitter.emit(notices.acp_line_skipped(line, tool_event=bool(events)))


async def _done_first(
    work: asyncio.Task[object],
    cancel: asyncio.Event,
    deadline: float,
    over: asyncio.Event | None = None,
) -> bool:
    """Wait until ``work`` is done, ``cancel`` (or ``over``: a budget exceeded) is set or
    ``deadline`` (monotonic) passes; whether ``work`` finished first."""
    stops = [asyncio.create_task(event.wait()) for event in (cancel, over) if event is not None]
    try:
        remaining = max(0.0, deadline - time.monotonic())
        await asyncio.wait({work, *stops}, timeout=remaining, return_when=FIRST_COMPLETED)
    finally:
        for stop in stops:
            stop.cancel()
        await asyncio.gather(*stops, return_exceptions=True)
    return work.done()


async def _end(work: asyncio.Task[object]) -> None:
    """Cancel ``work`` unless it is done, and collect it (its error, if any, is not ours)."""
    if not work.done():
        work.cancel()
    await asyncio.gather(work, return_exceptions=True)
