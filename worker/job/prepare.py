"""The phases before the launch: credentials, pack (with its closure held), workspace,
sandbox.

Each phase is let finish once started (it runs in a thread or a child process; stopping
it half-way would leave what it was making behind); the pipeline checks for a cancel and
the deadline between them. ``hold_pack`` and ``sandbox_labels`` are also what
``acp-worker agents probe`` prepares its sandbox with, so a probe's closure is held
against a pack-cache gc exactly as a job's is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING

from worker.credentials.resolve import resolve_credentials, secret_sources
from worker.errors import SandboxError
from worker.events import notices
from worker.events.models import SandboxReady
from worker.job.home import home_files, stage_home_files
from worker.job.network import network_plan
from worker.job.state import Created, Declared, JobContext, JobTools, Staged
from worker.jobs.spec import JobSpec
from worker.network import NetworkDenial
from worker.packs.cache import hold_closure
from worker.packs.manifest import Pack, SessionFiles
from worker.packs.runtime import PreparedPack, check_runtime, load_declaration, prepare_pack
from worker.sandbox import base
from worker.sandbox.base import SandboxBackend, SandboxSpec, SlotHost
from worker.sessions import JobSessions
from worker.settings import Settings
from worker.store.owner import LABEL_STORE, owner_labels, store_label
from worker.workspace.prepare import Prepared, prepare_workspace, write_labels

if TYPE_CHECKING:
    from worker.job.slot import Slot

#: How often a pack is prepared again when a pack-cache gc removed its closure between
#: the preparation and the hold.
PACK_ATTEMPTS = 3


async def hold_pack(
    settings: Settings,
    declaration: Pack,
    *,
    platform: str | None,
    backend: SandboxBackend | None = None,
) -> tuple[PreparedPack, int]:
    """The pack's closure, materialized and verified, and a shared hold on it (a
    descriptor: close it once the sandbox using the closure is destroyed).

    With the ``backend`` that will run it, an unchanged closure is checked against its
    verified record rather than re-hashed, unless that backend's sandboxes run as the
    worker's own uid (``worker.packs.verified``).

    Raises:
        SandboxError: a gc kept removing the closure before it could be held.
        And whatever ``prepare_pack`` raises.
    """
    sandbox_uids = None if backend is None else (backend.stage_owner()[0],)
    for _ in range(PACK_ATTEMPTS):
        pack = await asyncio.to_thread(
            prepare_pack, settings, declaration, platform, sandbox_uids=sandbox_uids
        )
        hold = await asyncio.to_thread(hold_closure, settings.cache_dir, pack.closure)
        if hold is not None:
            return pack, hold
    raise SandboxError(
        "the pack's closure kept disappearing from the cache (a pack-cache gc with "
        "too small a budget?)",
        closure=str(pack.closure),
    )


def sandbox_labels(
    settings: Settings, *, job_id: str, attempt: int, labels: Mapping[str, str]
) -> dict[str, str]:
    """The labels of a job's sandbox and work directory: whose it is, for the reaper.

    ``labels`` are the caller's (its ``acpw.token`` is the lease's fence; ``0`` or none:
    no lease).
    """
    fence = labels.get(base.LABEL_TOKEN, "0")
    store = store_label(settings.redis_url)  # which Redis issued the lease token
    return {
        base.LABEL_JOB: job_id,
        base.LABEL_ATTEMPT: str(attempt),
        base.LABEL_TOKEN: fence,
        base.LABEL_WORKER: settings.worker_id,
        **owner_labels(),  # the reaper's proof that a `run` without a lease is over
        **({LABEL_STORE: store} if store is not None and fence != "0" else {}),
    }


def workspace_credential(spec: JobSpec) -> list[str]:
    """The credential a git workspace fetches with (never given to the agent)."""
    name = getattr(spec.workspace, "credential", None)
    return [name] if isinstance(name, str) else []


class Preparation:
    """One job's phases before the launch; each returns what it made."""

    def __init__(self, ctx: JobContext, tools: JobTools) -> None:
        self._ctx = ctx
        self._tools = tools

    async def declaration(self) -> Declared:
        """The job's pack declaration, its runtime checked against the backend, its
        network plan and its session store (a resume it cannot serve is refused here,
        before anything launches)."""
        ctx = self._ctx
        declaration = load_declaration(ctx.settings, ctx.spec.pack.name)
        await asyncio.to_thread(
            check_runtime, declaration, host_usr=ctx.backend.capabilities.runs_host_usr
        )
        sessions = self._sessions(declaration.manifest.launch.session_files)
        plan = network_plan(ctx.settings, ctx.spec, declaration)
        if plan.endpoint is not None:
            endpoint = plan.endpoint
            notice = notices.model_endpoint(endpoint.name, endpoint.agent_url, source=plan.source)
            await ctx.emitter.emit(notice)
        return Declared(pack=declaration, network=plan, sessions=sessions)

    async def credentials(self, agent_credentials: Sequence[str]) -> dict[str, str]:
        """The job's credentials resolved (each registered with the redactor)."""
        ctx = self._ctx
        credentials = await asyncio.to_thread(  # a source may call out (aws-sm)
            resolve_credentials,
            ctx.spec.credentials,
            allowed=[*agent_credentials, *workspace_credential(ctx.spec)],
            sources=secret_sources(ctx.settings, ctx.environ),
            redactor=ctx.emitter.redactor,
        )
        self._tools.timings.mark("credentials")
        return credentials

    async def pack(self, declared: Declared) -> tuple[PreparedPack, int]:
        """The pack prepared and a hold on its closure (release it after the sandbox is
        destroyed); ``pack_ready`` says so."""
        ctx = self._ctx
        pack, hold = await hold_pack(
            ctx.settings, declared.pack, platform=ctx.spec.pack.platform, backend=ctx.backend
        )
        self._tools.timings.mark("pack_verify")
        return pack, hold

    async def pack_ready(self, pack: PreparedPack) -> None:
        await self._ctx.emitter.emit(pack.event_data())

    async def workspace(
        self,
        declared: Declared,
        secrets: Mapping[str, str],
        prepared: Prepared,
        slot: Slot | None = None,
    ) -> Staged:
        """The job's directory (labelled for the reaper) and the workspace staged in it
        (or, for a warm ``slot``, next to the slot's workspace, on the slot's disk); what
        it creates is registered in ``prepared`` as it goes (removed at teardown)."""
        staged = await self.stage(declared, secrets, prepared, slot)
        await self.workspace_ready(prepared, staged)
        return staged

    async def stage(
        self,
        declared: Declared,
        secrets: Mapping[str, str],
        prepared: Prepared,
        slot: Slot | None = None,
    ) -> Staged:
        """``workspace`` without its mark and notices (``workspace_ready``): the staging
        alone, which a cold job runs while its pack is checked (it reads nothing of the
        pack and runs nothing)."""
        ctx = self._ctx
        settings, spec = ctx.settings, ctx.spec
        settings.work_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        job_dir = settings.work_dir / f"{spec.job_id}-{ctx.attempt}-{token_hex(4)}"
        job_dir.mkdir(mode=0o711)
        prepared.cleanup.append(job_dir)
        labels = {**self._labels(), "pid": str(os.getpid())}
        await asyncio.to_thread(write_labels, job_dir, labels)
        staged = await prepare_workspace(
            spec.workspace,
            prepared,
            settings=settings,
            job_dir=job_dir,
            base_dir=ctx.base_dir,
            provider=declared.provider,
            owner=ctx.backend.stage_owner(),
            secrets=secrets,
            disk_mb=spec.limits.disk_mb,
            into=None if slot is None else (slot.staging, slot.disk),
        )
        return Staged(job_dir=job_dir, path=staged.path, skipped=staged.skipped)

    async def workspace_ready(self, prepared: Prepared, staged: Staged) -> None:
        """The workspace phase ends: its mark, and the notices of what staging found."""
        ctx = self._ctx
        self._tools.timings.mark("workspace")
        if prepared.admission_notes:
            notes = [n.to_dict() for n in prepared.admission_notes]
            await ctx.emitter.emit(notices.admission_notes(notes))
        if staged.skipped:
            await ctx.emitter.emit(notices.workspace_special_files_skipped(staged.skipped))
        if prepared.disk is None:
            await ctx.emitter.emit(notices.workspace_disk_unbounded(ctx.spec.limits.disk_mb))

    async def sandbox(self, declared: Declared, pack: PreparedPack, staged: Staged) -> Created:
        """The job's sandbox and its workspace files: artifacts, links and ``fs/*`` go
        through them once the sandbox made the workspace its own (masks, ownership);
        ``sandbox_ready`` says so."""
        ctx = self._ctx
        limits = ctx.spec.limits
        net = declared.network
        spec = SandboxSpec(
            job_id=ctx.spec.job_id,
            attempt=ctx.attempt,
            workspace=staged.path,
            pack_closure=pack.closure,
            limits=base.ResourceLimits(
                memory_bytes=limits.memory_mb * 1024 * 1024, cpus=limits.cpus, pids=limits.pids
            ),
            labels=self._labels(),
            network=net.mode,
            network_allow=net.allow,
            network_private=net.private,
            network_tunnels=net.tunnels,
            on_network_denial=self._network_denied,
            state_mounts=await self._state_mounts(declared, pack, staged.job_dir),
            lease_deadline=ctx.lease_deadline,
            deadline_s=base.sandbox_deadline(limits.timeout_s),
        )
        sandbox = await ctx.backend.create(spec)
        return Created(sandbox=sandbox, files=sandbox.workspace_files())

    async def warm_sandbox(self, slot: Slot, staged: Staged) -> Created:
        """A claimed warm slot made the attempt's sandbox, exactly as a cold one is
        labelled and bounded (``SlotHost.assign``), then filled with the staged
        workspace (``SlotHost.fill``): its ``Created`` points at the filled workspace."""
        ctx = self._ctx
        host = ctx.backend
        assert isinstance(host, SlotHost)
        slot.relay.denial = self._network_denied
        labels = self._labels()
        await host.assign(
            slot.sandbox,
            labels=labels,
            lease_deadline=ctx.lease_deadline,
            deadline_s=base.sandbox_deadline(ctx.spec.limits.timeout_s),
        )
        labelled = {**labels, "pid": str(os.getpid())}
        await asyncio.to_thread(write_labels, slot.directory, labelled)
        await host.fill(slot.sandbox, staged.path)
        return Created(sandbox=slot.sandbox, files=slot.sandbox.workspace_files())

    async def sandbox_ready(self, created: Created, warm: Slot | None = None) -> None:
        """Artifacts judged through the sandbox's files from now on; ``sandbox.ready``
        (saying ``warm`` and the claim's time for a warm slot)."""
        ctx, tools = self._ctx, self._tools
        if created.files is not None:
            tools.normalizer.artifacts = created.files.artifact
        tools.timings.mark("sandbox_create")
        sandbox_id = created.sandbox.sandbox_id
        if warm is None:
            ready = SandboxReady(backend=ctx.backend.name, sandbox_id=sandbox_id)
        else:
            claim_ms = round(warm.claim_s * 1000, 1)
            ready = SandboxReady(
                backend=ctx.backend.name, sandbox_id=sandbox_id, warm=True, claim_ms=claim_ms
            )
        await ctx.emitter.emit(ready)

    def _sessions(self, files: SessionFiles | None) -> JobSessions | None:
        spec = self._ctx.spec
        resume = spec.session.resume if spec.session is not None else None
        sessions = JobSessions.for_job(
            self._ctx.settings, pack=spec.pack.name, files=files, resume=resume
        )
        if sessions is not None:
            sessions.check()
        return sessions

    async def _state_mounts(
        self, declared: Declared, pack: PreparedPack, job_dir: Path
    ) -> tuple[base.WritableMount, ...]:
        """The pack's files in HOME, then the session store (which may lie inside them)."""
        sessions = declared.sessions
        owner = self._ctx.backend.stage_owner()
        endpoint = declared.network.endpoint
        model = self._ctx.spec.model
        files = home_files(
            pack.pack.manifest.launch,
            None if endpoint is None else endpoint.agent_url,
            None if model is None or model.variant else model.id,
        )
        mounts = await asyncio.to_thread(stage_home_files, job_dir, files, owner)
        if sessions is not None:
            mounts += (await asyncio.to_thread(sessions.prepare, job_dir, owner),)
        targets = [m.target for m in mounts]
        if len(set(targets)) != len(targets):
            raise SandboxError("the pack's HOME files and its session store share a directory")
        return mounts

    async def _network_denied(self, denial: NetworkDenial) -> None:
        notice = notices.network_denied(
            message=denial.message, reason=denial.reason, target=denial.target, seq=denial.seq
        )
        await self._ctx.emitter.emit(notice)

    def _labels(self) -> dict[str, str]:
        ctx = self._ctx
        return sandbox_labels(
            ctx.settings, job_id=ctx.spec.job_id, attempt=ctx.attempt, labels=ctx.labels
        )
