"""A pack's agent in a sandbox of its own, outside any job: what ``acp-worker agents
probe`` talks to.

It is prepared with the job's own parts, so what a probe shows is what a job meets: the
pack's closure materialized, verified and held against a pack-cache gc as a job's is
(``prepare.hold_pack``), the pack's HOME files staged as a job's are, the sandbox labelled
as a job's without a lease (the reaper can tell when its owner is gone), and the agent
re-admitted in the sandbox's own view and launched with the pack's fixed argv and closed
environment (``turn.launch_agent``). The workspace is empty.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.acp.agent import AgentProcess
from worker.job.home import home_files, stage_home_files
from worker.job.prepare import hold_pack, sandbox_labels
from worker.job.turn import launch_agent
from worker.packs.manifest import Pack
from worker.packs.runtime import LaunchPlan, PreparedPack
from worker.rpc.connection import (
    MalformedHandler,
    NotificationHandler,
    OversizeHandler,
    StrayReplyHandler,
)
from worker.sandbox import base
from worker.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from worker.settings import Settings
from worker.workspace.stage import remove_staged, stage_local


@dataclass(frozen=True, slots=True, kw_only=True)
class StandaloneAgent:
    """The agent launched (not started: route its requests, then ``agent.start()``), the
    sandbox it runs in, its pack and its launch plan."""

    pack: PreparedPack
    sandbox: Sandbox
    agent: AgentProcess
    plan: LaunchPlan


@contextlib.asynccontextmanager
async def standalone_agent(
    declaration: Pack,
    settings: Settings,
    backend: SandboxBackend,
    *,
    platform: str | None,
    credentials: Mapping[str, str],
    limits: base.ResourceLimits,
    on_notification: NotificationHandler,
    on_malformed: MalformedHandler,
    on_oversize: OversizeHandler | None = None,
    on_stray_reply: StrayReplyHandler | None = None,
) -> AsyncIterator[StandaloneAgent]:
    """The pack's agent in a new sandbox with an empty workspace, for the length of the
    block; then the sandbox is destroyed, what was staged for it removed and the closure
    hold released, whatever happened. The caller shuts the agent down (its stdin EOF and
    escalation say how it ends, which is what a probe reports)."""
    pack, hold = await hold_pack(settings, declaration, platform=platform, backend=backend)
    job_id = f"probe-{secrets.token_hex(4)}"
    settings.work_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    workspace = settings.work_dir / job_id
    home = settings.work_dir / f"{job_id}.home"  # the pack's files for HOME, as a job's
    sandbox: Sandbox | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="acpw-probe-") as empty:
            staged = stage_local(Path(empty), workspace, owner=backend.stage_owner())
        home.mkdir(mode=0o711)
        mounts = stage_home_files(
            home, home_files(pack.pack.manifest.launch, None), backend.stage_owner()
        )
        spec = SandboxSpec(
            job_id=job_id,
            attempt=1,
            workspace=staged.path,
            pack_closure=pack.closure,
            limits=limits,
            state_mounts=mounts,
            labels=sandbox_labels(settings, job_id=job_id, attempt=1, labels={}),
        )
        sandbox = await backend.create(spec)
        plan = pack.launch_plan(credentials)
        agent = await launch_agent(
            sandbox,
            plan,
            settings,
            provider=pack.pack.manifest.provider,
            on_notification=on_notification,
            on_malformed=on_malformed,
            on_oversize=on_oversize,
            on_stray_reply=on_stray_reply,
        )
        yield StandaloneAgent(pack=pack, sandbox=sandbox, agent=agent, plan=plan)
    finally:
        try:
            if sandbox is not None:
                await backend.destroy(sandbox.sandbox_id)
        finally:
            remove_staged(workspace)
            shutil.rmtree(home, ignore_errors=True)
            os.close(hold)
