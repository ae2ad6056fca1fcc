"""The async core: run one job from a validated spec to exactly one ``job.completed``.

    validate (caller) → job.accepted → credentials → pack verify → workspace → sandbox
    → agent → initialize → session/new (+mode/model) → session/prompt → settle → teardown

Every failure on the way becomes a typed error in the terminal event; the sandbox and
the agent are torn down in ``finally`` blocks whatever happened. A cancel is honoured at
every phase boundary: one that arrives before the agent is launched (already set when
the job starts, or during preparation) settles ``cancelled`` without launching it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from worker.acp.agent import AgentProcess
from worker.acp.client import AcpClient
from worker.acp.paths import WorkspacePaths
from worker.acp.session import AcpSession, SessionWiring
from worker.credentials.redact import Redactor
from worker.credentials.resolve import resolve_credentials, secret_sources
from worker.errors import (
    EXIT_CANCELLED,
    EXIT_SUCCEEDED,
    EXIT_TIMED_OUT,
    AgentError,
    ResultUploadFailed,
    SandboxError,
    WorkerError,
)
from worker.events.emitter import EventEmitter, utc_timestamp
from worker.events.normalizer import Normalizer
from worker.events.sinks import EventSink
from worker.interactions import AnswerReader, InteractionBroker, InteractionStore
from worker.jobs.spec import JobSpec
from worker.network import NetworkDenial
from worker.packs.cache import hold_closure
from worker.packs.runtime import (
    LaunchPlan,
    PreparedPack,
    check_runtime,
    load_declaration,
    prepare_pack,
)
from worker.sandbox import base
from worker.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from worker.sessions import JobSessions
from worker.settings import Settings
from worker.store.owner import LABEL_STORE, owner_labels, store_label
from worker.workspace.bundle import BundleTarget, upload_bundle
from worker.workspace.changes import (
    Captured,
    capture,
    capture_limits,
    incomplete_notice,
    write_patch,
)
from worker.workspace.changes import event_data as changes_event
from worker.workspace.prepare import Prepared, prepare_workspace, write_labels
from worker.workspace.stage import StagedWorkspace

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)
SUCCESS_STOPS = {"end_turn", "max_tokens", "max_turn_requests"}


@dataclass(frozen=True, slots=True)
class JobOutcome:
    status: str
    stop_reason: str | None
    error: WorkerError | None
    exit_code: int


@dataclass(slots=True)
class _Phases:
    start: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter)

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.marks[name] = round((now - self._last) * 1000, 2)
        self._last = now

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.start) * 1000, 2)


class _Stop(Exception):
    """The turn was interrupted by cancel or timeout; carries the status."""

    def __init__(self, status: str, stop_reason: str | None) -> None:
        super().__init__(status)
        self.status = status
        self.stop_reason = stop_reason


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
) -> JobOutcome:
    """Run ``spec`` once and return how it settled; events go to ``sinks``.

    With ``control`` (Redis), questions, plans and permission asks become durable
    interactions answered through ``acpw:{J}:control``; without it they are declined.
    """
    redactor = Redactor()
    emitter = EventEmitter(
        job_id=spec.job_id,
        attempt=attempt,
        sinks=sinks,
        redactor=redactor,
        max_bytes=settings.event_max_bytes,
    )
    job = _Job(
        spec=spec,
        settings=settings,
        backend=backend,
        emitter=emitter,
        environ=environ,
        base_dir=base_dir,
        attempt=attempt,
        labels=labels or {},
        control=control,
    )
    try:
        outcome = await job.run(cancel or asyncio.Event())
    finally:
        await emitter.close()
    return outcome


class _Job:
    def __init__(
        self,
        *,
        spec: JobSpec,
        settings: Settings,
        backend: SandboxBackend,
        emitter: EventEmitter,
        environ: Mapping[str, str],
        base_dir: Path | None,
        attempt: int,
        labels: Mapping[str, str],
        control: aioredis.Redis | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.backend = backend
        self.emitter = emitter
        self.environ = environ
        self.base_dir = base_dir
        self.attempt = attempt
        self.labels = labels
        self.phases = _Phases()
        #: time.monotonic() by which the job must settle (set when it starts executing).
        self.deadline = float("inf")
        self.sandbox: Sandbox | None = None
        self.agent: AgentProcess | None = None
        self.prepared = Prepared()
        self.job_dir: Path | None = None
        self.provider = "cursor"
        self.result: dict[str, Any] | None = None
        self.upload_error: ResultUploadFailed | None = None
        self.normalizer = Normalizer(
            workspace_root=base.WORKSPACE, text_limit=settings.tool_output_bytes
        )
        self.control = control
        self.host_workspace: Path | None = None
        self.acp: AcpSession | None = None
        self.sessions: JobSessions | None = None
        #: A shared lock on the pack closure's digest (``hold_closure``): a pack-cache gc
        #: keeps the closure while the job runs. Released after the sandbox is destroyed.
        self.pack_hold: int | None = None
        #: The first teardown step that failed (``_teardown`` does not raise).
        self.teardown_error: WorkerError | None = None
        store = None
        if control is not None:
            ttl = settings.events_ttl + int(spec.limits.timeout_s)
            fence = int(labels.get(base.LABEL_TOKEN, "0")) or None  # 0: no lease (`run`)
            store = InteractionStore(control, spec.job_id, ttl_s=ttl, token=fence)
        self.broker = InteractionBroker(
            job_id=spec.job_id,
            attempt=attempt,
            emit=emitter.emit,
            store=store,
            timeout_s=spec.interactions.answer_timeout_s,
            max_event_bytes=settings.event_max_bytes,
        )

    async def run(self, cancel: asyncio.Event) -> JobOutcome:
        await self._accepted()
        try:
            stop_reason = await self._execute(cancel)
            outcome = _settled(stop_reason)
        except _Stop as stop:
            outcome = _interrupted(stop)
        except WorkerError as exc:
            outcome = JobOutcome("failed", None, self._with_stderr(exc), exc.exit_code)
        finally:
            await self._teardown()
        if self.upload_error is not None and outcome.status == "succeeded":
            # The turn succeeded but its result could not be delivered: not a success.
            error = self.upload_error
            outcome = JobOutcome("failed", outcome.stop_reason, error, error.exit_code)
        outcome = _after_teardown(outcome, self.teardown_error)
        await self._complete(outcome)
        return outcome

    async def _accepted(self) -> None:
        await self.emitter.emit(
            "job.accepted",
            {
                "pack": self.spec.pack.name,
                "platform": self.spec.pack.platform,
                "backend": self.backend.name,
                "labels": dict(self.spec.labels),
            },
        )
        await self.emitter.emit("job.started", {"worker_id": self.settings.worker_id})

    async def _execute(self, cancel: asyncio.Event) -> str:
        # limits.timeout_s bounds the whole job from here: preparation is checked at each
        # phase boundary, opening the session is cut at the deadline, the turn gets what
        # is left. Teardown, change capture and the bundle upload come after it.
        deadline = self.deadline = time.monotonic() + self.spec.limits.timeout_s
        plan = await self._prepare(cancel)
        await self._unless_cancelled(cancel, "agent_spawn")
        client = await self._launch(plan)
        session_id = await self._opened(client, cancel, deadline)
        await self._unless_cancelled(cancel, "turn")  # no prompt once cancelled
        return await self._turn(client, session_id, cancel, deadline)

    async def _opened(self, client: AcpClient, cancel: asyncio.Event, deadline: float) -> str:
        """The session, opened unless a cancel (or a lost lease) or the deadline comes
        first: each of its requests may otherwise wait up to the ACP request timeout."""
        opening = asyncio.create_task(self._session(client))
        cancelled = asyncio.create_task(cancel.wait())
        try:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.wait(
                {opening, cancelled}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if opening.done():
                return opening.result()
            raise _Stop("cancelled" if cancel.is_set() else "timed_out", None)
        finally:
            cancelled.cancel()
            if not opening.done():
                opening.cancel()
            await asyncio.gather(opening, cancelled, return_exceptions=True)

    async def _prepare(self, cancel: asyncio.Event) -> LaunchPlan:
        """Everything before the launch, checking for a cancel between phases. A phase
        itself is let finish (it runs in a thread or a child process; stopping it
        half-way would leave what it was making behind)."""
        await self._unless_cancelled(cancel, "credentials")
        declaration = load_declaration(self.settings, self.spec.pack.name)
        await asyncio.to_thread(
            check_runtime, declaration, host_usr=self.backend.capabilities.runs_host_usr
        )
        self._sessions(declaration.manifest.launch.session_store)
        credentials = await self._credentials(declaration.credentials)
        await self._unless_cancelled(cancel, "pack_verify")
        pack = await self._pack(declaration)
        self.provider = declaration.manifest.provider
        await self._unless_cancelled(cancel, "workspace")
        workspace = await self._workspace(self.provider, credentials)
        if self.backend.capabilities.shares_host_workspace:
            # The agent's /workspace is this host directory: artifacts and fs/* are
            # checked and served against it.
            self.host_workspace = workspace
            self.normalizer.artifacts = WorkspacePaths(workspace, base.WORKSPACE).artifact
        await self._unless_cancelled(cancel, "sandbox_create")
        await self._sandbox(pack, workspace)
        agent_credentials = {k: v for k, v in credentials.items() if k in declaration.credentials}
        return pack.launch_plan(agent_credentials)

    async def _unless_cancelled(self, cancel: asyncio.Event, next_phase: str) -> None:
        """Stop at this phase boundary once ``cancel`` is set (a cancel, a lost lease) or
        the job's deadline passed; before the launch, a notice says that the agent was
        never started."""
        if cancel.is_set():
            status = "cancelled"
        elif time.monotonic() >= self.deadline:
            status = "timed_out"
        else:
            return
        if self.agent is None:
            await self.emitter.emit("notice", _not_launched_notice(status, next_phase))
        raise _Stop(status, None)

    async def _credentials(self, agent_credentials: Sequence[str]) -> dict[str, str]:
        credentials = await asyncio.to_thread(  # a source may call out (aws-sm)
            resolve_credentials,
            self.spec.credentials,
            allowed=[*agent_credentials, *_workspace_credential(self.spec)],
            sources=secret_sources(self.settings, self.environ),
            redactor=self.emitter.redactor,
        )
        self.phases.mark("credentials")
        return credentials

    def _sessions(self, home_path: str | None) -> None:
        """The pack's session store, if it declares one; a resume it cannot serve is
        refused here, before anything launches."""
        resume = self.spec.session.resume if self.spec.session is not None else None
        self.sessions = JobSessions.for_job(
            self.settings, pack=self.spec.pack.name, home_path=home_path, resume=resume
        )
        if self.sessions is not None:
            self.sessions.check()

    async def _state_mounts(self) -> tuple[base.WritableMount, ...]:
        if self.sessions is None or self.job_dir is None:
            return ()
        owner = self.backend.stage_owner()
        return (await asyncio.to_thread(self.sessions.prepare, self.job_dir, owner),)

    async def _save_session(self) -> None:
        """Keep the session the agent recorded (once ``session.started`` went out), then
        drop the per-job directory. Runs only after the sandbox is destroyed."""
        if self.sessions is None:
            return
        session_id = self.acp.session_id if self.acp is not None else None
        notices = await asyncio.to_thread(self.sessions.save, session_id)
        with contextlib.suppress(OSError):  # the job dir's removal retries it
            await asyncio.to_thread(self.sessions.remove)
        for notice in notices:
            await self.emitter.emit("notice", notice)

    async def _pack(self, declaration: Any) -> PreparedPack:
        for _ in range(3):  # a pack-cache gc may remove the closure before the hold
            pack = await asyncio.to_thread(
                prepare_pack, self.settings, declaration, self.spec.pack.platform
            )
            hold = await asyncio.to_thread(hold_closure, self.settings.cache_dir, pack.closure)
            if hold is not None:
                self.pack_hold = hold
                break
        else:
            raise SandboxError(
                "the pack's closure kept disappearing from the cache (a pack-cache gc with "
                "too small a budget?)",
                closure=str(pack.closure),
            )
        self.phases.mark("pack_verify")
        await self.emitter.emit("pack.ready", pack.event_data())
        return pack

    async def _workspace(self, provider: str, secrets: Mapping[str, str]) -> Path:
        self.settings.work_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        name = f"{self.spec.job_id}-{self.attempt}-{token_hex(4)}"
        job_dir = self.settings.work_dir / name
        job_dir.mkdir(mode=0o711)
        self.prepared.cleanup.append(job_dir)
        self.job_dir = job_dir
        labels = {**self._sandbox_labels(), "pid": str(os.getpid())}
        await asyncio.to_thread(write_labels, job_dir, labels)
        staged = await prepare_workspace(
            self.spec.workspace,
            self.prepared,
            settings=self.settings,
            job_dir=job_dir,
            base_dir=self.base_dir,
            provider=provider,
            owner=self.backend.stage_owner(),
            secrets=secrets,
            disk_mb=self.spec.limits.disk_mb,
        )
        self.phases.mark("workspace")
        if staged.skipped:
            await self.emitter.emit("notice", _skipped_notice(staged.skipped))
        if self.prepared.disk is None:
            await self.emitter.emit("notice", _unbounded_notice(self.spec.limits.disk_mb))
        return staged.path

    async def _sandbox(self, pack: PreparedPack, workspace: Path) -> None:
        limits = self.spec.limits
        spec = SandboxSpec(
            job_id=self.spec.job_id,
            attempt=self.attempt,
            workspace=workspace,
            pack_closure=pack.closure,
            limits=base.ResourceLimits(
                memory_bytes=limits.memory_mb * 1024 * 1024, cpus=limits.cpus, pids=limits.pids
            ),
            labels=self._sandbox_labels(),
            network=self.spec.network.mode,
            network_allow=tuple(self.spec.network.allow),
            on_network_denial=self._network_denied,
            state_mounts=await self._state_mounts(),
        )
        self.sandbox = await self.backend.create(spec)
        self.phases.mark("sandbox_create")
        await self.emitter.emit(
            "sandbox.ready", {"backend": self.backend.name, "sandbox_id": self.sandbox.sandbox_id}
        )

    async def _network_denied(self, denial: NetworkDenial) -> None:
        await self.emitter.emit(
            "notice",
            {
                "level": "warning",
                "code": "network_denied",
                "message": denial.message,
                "details": {"reason": denial.reason, "target": denial.target, "seq": denial.seq},
            },
        )

    def _sandbox_labels(self) -> dict[str, str]:
        return {
            base.LABEL_JOB: self.spec.job_id,
            base.LABEL_ATTEMPT: str(self.attempt),
            base.LABEL_TOKEN: self.labels.get(base.LABEL_TOKEN, "0"),
            base.LABEL_WORKER: self.settings.worker_id,
            **owner_labels(),  # the reaper's proof that a `run` without a lease is over
            **self._store_labels(),
        }

    def _store_labels(self) -> dict[str, str]:
        """Which Redis issued the job's lease token (none for a `run` without a lease)."""
        store = store_label(self.settings.redis_url)
        leased = self.labels.get(base.LABEL_TOKEN, "0") != "0"
        return {LABEL_STORE: store} if store is not None and leased else {}

    async def _readmit(self) -> None:
        """Admission again, in the sandbox's own mount view, right before launch (where the
        backend can show its view; its masks guard the whole run either way)."""
        assert self.sandbox is not None
        result = await asyncio.to_thread(self.sandbox.admission_view, provider=self.provider)
        if result is not None:
            result.raise_if_refused()

    async def _launch(self, plan: LaunchPlan) -> AcpClient:
        assert self.sandbox is not None
        settings = self.settings
        await self._readmit()
        process = await self.sandbox.spawn(
            plan.argv, env=plan.env, cwd=base.WORKSPACE, stdout_limit=settings.acp_line_limit
        )
        self.agent = AgentProcess(
            process,
            line_limit=settings.acp_line_limit,
            request_timeout=settings.acp_request_timeout,
            stderr_limit=settings.stderr_buffer_bytes,
            on_notification=self._notification,
            on_malformed=self._malformed,
        )
        self.acp = AcpSession(
            self.agent.connection,
            SessionWiring(
                spec=self.spec,
                dialect=plan.dialect,
                emit=self.emitter.emit,
                normalizer=self.normalizer,
                broker=self.broker,
                sandbox=self.sandbox,
                host_workspace=self.host_workspace,
                terminal_output_bytes=settings.tool_output_bytes,
                authenticate=plan.authenticate,
            ),
        )
        self.agent.start()
        self.phases.mark("agent_spawn")
        return self.acp.client

    async def _session(self, client: AcpClient) -> str:
        assert self.acp is not None
        return await self.acp.open(self.phases.mark)

    async def _turn(
        self, client: AcpClient, session_id: str, cancel: asyncio.Event, deadline: float
    ) -> str:
        self.broker.begin_turn()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.control is not None:
                    reader = AnswerReader(self.control, self.broker)
                    await stack.enter_async_context(reader.running())
                return await self._prompt(client, session_id, cancel, deadline)
        finally:
            await self.broker.end_turn("turn_ended")
            self.normalizer.settled = True

    async def _prompt(
        self, client: AcpClient, session_id: str, cancel: asyncio.Event, deadline: float
    ) -> str:
        prompt = asyncio.create_task(client.prompt(session_id, self.spec.prompt_blocks()))
        cancelled = asyncio.create_task(cancel.wait())
        try:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.wait(
                {prompt, cancelled}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if prompt.done():
                stop = prompt.result()
                self.phases.mark("turn")
                return stop
            status = "cancelled" if cancel.is_set() else "timed_out"
            # Open questions are answered `cancelled` first, so nothing waits on them.
            await self.broker.end_turn(status)
            raise _Stop(status, await self._interrupt(client, session_id, prompt))
        finally:
            cancelled.cancel()
            if not prompt.done():
                prompt.cancel()
            await asyncio.gather(prompt, cancelled, return_exceptions=True)

    async def _interrupt(
        self, client: AcpClient, session_id: str, prompt: asyncio.Task[str]
    ) -> str | None:
        """session/cancel, then wait the grace period for the agent's own stop reason."""
        with contextlib.suppress(WorkerError):
            await client.cancel(session_id)
        try:
            return await asyncio.wait_for(asyncio.shield(prompt), self.settings.cancel_grace)
        except (TimeoutError, WorkerError):
            return None

    async def _notification(self, method: str, params: Any) -> None:
        if method != "session/update":
            await self.emitter.emit(
                "provider.unmapped", self.normalizer.unmapped(method, params)[1]
            )
            return
        for type_, data in self.normalizer.normalize(params):
            await self.emitter.emit(type_, data)

    async def _malformed(self, preview: str, reason: str) -> None:
        await self.emitter.emit(
            "notice",
            {
                "level": "warning",
                "code": "acp_malformed_line",
                "message": f"the agent wrote a non-JSON-RPC line ({reason}); it was skipped",
                "details": {"preview": preview},
            },
        )

    def _with_stderr(self, exc: WorkerError) -> WorkerError:
        if isinstance(exc, AgentError) and self.agent is not None:
            exc.details.setdefault("stderr_preview", self.agent.stderr.preview())
        return exc

    async def _teardown(self) -> None:
        """Dismantle what the job made, as far as that is safe; never raises.

        A step that fails is logged and the first such error kept in ``teardown_error``, so
        the job still settles with exactly one ``job.completed``, and the later steps still
        run: the sandbox is destroyed whatever happened to the agent. A sandbox that could
        not be destroyed may still run processes writing to the workspace and hold mounts
        on it, though: then no session is saved, no change captured and nothing removed;
        the job's directory is left to the reaper, which destroys the sandbox again before
        it removes the directory.
        """
        try:
            await self._step("agent_shutdown", self._stop_agent)
            destroyed = await self._step("sandbox_destroy", self._destroy)
            await self._step("cleanup", self._dismantle if destroyed else self._abandon)
        finally:
            if self.pack_hold is not None:
                os.close(self.pack_hold)
                self.pack_hold = None

    async def _step(self, step: str, work: Callable[[], Awaitable[None]]) -> bool:
        """Run one teardown step: whether it completed; a failure is logged and kept."""
        try:
            await work()
        except Exception as exc:  # any failure (a sink, a bug too): the job must still settle
            log.exception("teardown step %s failed for job %s", step, self.spec.job_id)
            if self.teardown_error is None:
                self.teardown_error = _teardown_error(step, exc)
            return False
        return True

    async def _stop_agent(self) -> None:
        try:
            if self.acp is not None:
                await self.acp.terminals.close_all()
        finally:
            if self.agent is not None:
                await self.agent.shutdown(
                    eof_grace=self.settings.shutdown_eof_grace,
                    term_grace=self.settings.shutdown_term_grace,
                )

    async def _destroy(self) -> None:
        if self.sandbox is not None:
            await self.backend.destroy(self.sandbox.sandbox_id)

    async def _abandon(self) -> None:
        """The sandbox survived its destroy: say what was left undone."""
        self.phases.mark("teardown")
        sandbox_id = self.sandbox.sandbox_id if self.sandbox is not None else None
        await self.emitter.emit("notice", _not_destroyed_notice(sandbox_id))

    async def _dismantle(self) -> None:
        """Everything after the sandbox is destroyed."""
        await self._step("session_save", self._save_session)
        self.phases.mark("teardown")
        try:
            if self.prepared.staged is not None and self.sandbox is not None:
                await self._capture(self.prepared.staged)
        finally:  # a sink that failed on workspace.changed must not leave the workspace
            if self.spec.keep_workspace and self.job_dir is not None:
                await self._keep(self.job_dir)
            else:
                await self.prepared.remove()

    async def _keep(self, job_dir: Path) -> None:
        until = time.time() + self.settings.keep_workspace_s
        kept = await self.prepared.keep(job_dir, until=until)
        if kept is not None:
            await self.emitter.emit(
                "notice",
                {
                    "level": "info",
                    "code": "workspace_kept",
                    "message": f"the job's workspace is kept at {kept} until the reaper removes it",
                    "details": {"path": str(kept), "until": utc_timestamp(until)},
                },
            )

    async def _capture(self, workspace: StagedWorkspace) -> None:
        """What the agent changed, measured after nothing in its sandbox can run."""
        settings = self.settings
        patch_path = settings.results_dir / self.spec.job_id / str(self.attempt) / "changes.patch"
        try:
            captured = await asyncio.to_thread(capture, workspace, limits=capture_limits(settings))
            ref = None
            if captured.changes:
                ref = await asyncio.to_thread(write_patch, captured.patch, patch_path)
        except Exception as exc:  # any failure (a bug, a pathological tree) still settles the job
            log.exception("change capture failed for job %s", self.spec.job_id)
            await self.emitter.emit("notice", _capture_failed(exc))
            return
        self.phases.mark("capture")
        data = changes_event(captured, ref, max_paths=settings.changed_paths_max)
        data["base"] = {"kind": self.spec.workspace.kind, **self.prepared.source_info}
        await self.emitter.emit("workspace.changed", data)
        notice = incomplete_notice(captured)
        if notice is not None:
            await self.emitter.emit("notice", notice)
        target = self._bundle_target()
        if target is not None and captured.changes:
            self.result = await self._upload(target, captured, workspace)

    def _bundle_target(self) -> BundleTarget | None:
        settings = self.settings
        if self.spec.results is not None:
            bucket, prefix = self.spec.results.bucket, self.spec.results.prefix
        elif settings.results_bucket is not None:
            bucket, prefix = settings.results_bucket, settings.results_prefix
        else:
            return None
        return BundleTarget(bucket=bucket, prefix=prefix, max_bytes=settings.bundle_max_bytes)

    async def _upload(
        self, target: BundleTarget, captured: Captured, workspace: StagedWorkspace
    ) -> dict[str, Any] | None:
        from worker.workspace.s3 import s3_client  # boto3 is an optional extra

        try:
            ref = await asyncio.to_thread(
                upload_bundle, s3_client(self.settings), target, job_id=self.spec.job_id,
                attempt=self.attempt, captured=captured, workspace=workspace.path,
            )  # fmt: skip
        except ResultUploadFailed as exc:
            # Whatever the job's status: said now, and again in job.completed.
            self.upload_error = exc
            await self.emitter.emit("notice", _upload_failed_notice(exc))
            return None
        self.phases.mark("bundle_upload")
        return ref

    async def _complete(self, outcome: JobOutcome) -> None:
        if not self.normalizer.usage_seen:
            await self.emitter.emit("usage.reported", {"available": False})
        error = None
        if outcome.error is not None:
            error = outcome.error.to_dict()
        data: dict[str, Any] = {
            "status": outcome.status,
            "stop_reason": outcome.stop_reason,
            "error": error,
            "duration_ms": self.phases.total_ms(),
            "timings_ms": dict(self.phases.marks),
            "result": self.result,
        }
        if self.upload_error is not None:  # `result` is null: the bundle is not there
            data["result_error"] = self.upload_error.to_dict()
        if self.teardown_error is not None:
            data["teardown_error"] = self.teardown_error.to_dict()
        await self.emitter.emit("job.completed", data)


def _after_teardown(outcome: JobOutcome, error: WorkerError | None) -> JobOutcome:
    """The outcome once teardown is over. A job whose turn succeeded but that could not be
    torn down failed (its sandbox may live on, its changes may not have been captured): the
    teardown error is its error. One that had failed, been cancelled or timed out already
    keeps its status and error, which say more about the job; ``job.completed`` carries the
    teardown error apart (``teardown_error``) either way, and it is logged."""
    if error is None or outcome.status != "succeeded":
        return outcome
    return JobOutcome("failed", outcome.stop_reason, error, error.exit_code)


def _teardown_error(step: str, exc: Exception) -> WorkerError:
    if isinstance(exc, WorkerError):
        return exc
    # No message: an exception's text may quote what the agent wrote.
    return SandboxError(
        f"the job's teardown failed at {step}: internal error ({type(exc).__name__})", step=step
    )


def _not_destroyed_notice(sandbox_id: str | None) -> dict[str, Any]:
    return {
        "level": "error",
        "code": "sandbox_not_destroyed",
        "message": "the sandbox could not be destroyed: the workspace changes were not "
        "captured, the session was not saved, and the reaper removes the sandbox and the "
        "job's directory later",
        "details": {"sandbox_id": sandbox_id},
    }


def _workspace_credential(spec: JobSpec) -> list[str]:
    """The credential a git workspace fetches with (never given to the agent)."""
    name = getattr(spec.workspace, "credential", None)
    return [name] if isinstance(name, str) else []


def _upload_failed_notice(exc: ResultUploadFailed) -> dict[str, Any]:
    return {
        "level": "error",
        "code": exc.code,
        "message": f"the result bundle was not uploaded: {exc.message}",
        "details": dict(exc.details),
    }


def _capture_failed(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, OSError):
        reason, path = exc.strerror, str(exc.filename or "")
    else:  # no message: an exception's text may quote what the agent wrote
        reason, path = f"internal error ({type(exc).__name__})", ""
    return {
        "level": "error",
        "code": "capture_failed",
        "message": f"the workspace changes could not be captured: {reason}",
        "details": {"path": path},
    }


def _not_launched_notice(status: str, next_phase: str) -> dict[str, Any]:
    what = "cancelled" if status == "cancelled" else "out of time (limits.timeout_s)"
    return {
        "level": "info",
        "code": f"{status}_before_launch",
        "message": f"the job was {what} before {next_phase}; its agent was never started",
        "details": {"next_phase": next_phase},
    }


def _unbounded_notice(disk_mb: int) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "workspace_disk_unbounded",
        "message": f"limits.disk_mb ({disk_mb} MiB) is not enforced: this worker runs with "
        "ACPW_WORKSPACE_DISK=off, so the workspace shares the host's disk",
        "details": {"disk_mb": disk_mb},
    }


def _skipped_notice(skipped: Sequence[str]) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "workspace_special_files_skipped",
        "message": f"{len(skipped)} socket/FIFO/device entries of the workspace were not copied",
        "details": {"paths": list(skipped[:50])},
    }


def _settled(stop_reason: str) -> JobOutcome:
    if stop_reason in SUCCESS_STOPS:
        return JobOutcome("succeeded", stop_reason, None, EXIT_SUCCEEDED)
    if stop_reason == "cancelled":
        error = AgentError("the agent cancelled the turn on its own", stop_reason=stop_reason)
        return JobOutcome("failed", stop_reason, error, error.exit_code)
    error = AgentError(f"the agent stopped with {stop_reason!r}", stop_reason=stop_reason)
    return JobOutcome("failed", stop_reason, error, error.exit_code)


def _interrupted(stop: _Stop) -> JobOutcome:
    code = EXIT_CANCELLED if stop.status == "cancelled" else EXIT_TIMED_OUT
    return JobOutcome(stop.status, stop.stop_reason, None, code)
