"""A warm slot's records (``worker.job.warm``): what it is made from, what it holds, and
the relay that points its agent's and proxy's messages at the job that claims it."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from worker.acp.agent import AgentProcess
from worker.acp.client import ClientCapabilities
from worker.job.network import NetworkPlan
from worker.launch import LaunchPlan
from worker.network import NetworkDenial
from worker.packs.runtime import PreparedPack
from worker.rpc.connection import StrayReply
from worker.rpc.oversize import OversizeLine
from worker.rpc.wire import JsonValue
from worker.sandbox import base
from worker.sandbox.base import Sandbox, SandboxBackend
from worker.workspace.disk import BoundedDisk

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """What one slot is made from: a job's launch identity, without the job."""

    pack_name: str
    provider: str
    pack: PreparedPack
    network: NetworkPlan
    model: str | None
    limits: base.ResourceLimits
    #: The size of the slot's own workspace disk (None: unbounded, on ``work_dir``).
    disk_mb: int | None
    plan: LaunchPlan
    capabilities: ClientCapabilities
    #: The digest of all of the above, of the backend and of the credential binding
    #: (``worker.job.identity.identity``; empty until ``recipe_for`` computed it).
    identity: str = ""


class Relay:
    """The handlers a slot's agent and network proxy were made with, pointed at the job
    that claims the slot (before that, what the agent says is dropped and logged)."""

    def __init__(self) -> None:
        self.notification: Callable[[str, object], Awaitable[None]] | None = None
        self.malformed: Callable[[str, str], Awaitable[None]] | None = None
        self.oversize: Callable[[OversizeLine], Awaitable[None]] | None = None
        self.stray_reply: Callable[[StrayReply], Awaitable[None]] | None = None
        self.denial: Callable[[NetworkDenial], Awaitable[None]] | None = None

    async def on_notification(self, method: str, params: object) -> None:
        if self.notification is None:
            log.debug("warm slot: %s before any job claimed it, dropped", method)
            return
        await self.notification(method, params)

    async def on_malformed(self, preview: str, reason: str) -> None:
        if self.malformed is not None:
            await self.malformed(preview, reason)

    async def on_oversize(self, line: OversizeLine) -> None:
        if self.oversize is not None:
            await self.oversize(line)

    async def on_stray_reply(self, reply: StrayReply) -> None:
        if self.stray_reply is not None:
            await self.stray_reply(reply)

    async def on_denial(self, denial: NetworkDenial) -> None:
        if self.denial is not None:
            await self.denial(denial)


@dataclass(slots=True, kw_only=True)
class Slot:
    """One warm slot: its sandbox, its started and initialized agent, what holds it."""

    slot_id: str
    recipe: Recipe
    directory: Path
    sandbox: Sandbox
    agent: AgentProcess
    initialized: Mapping[str, JsonValue]
    relay: Relay
    #: The shared hold on the pack closure (closed once claimed: the job holds its own).
    hold: int | None
    made_at: float = field(default_factory=time.monotonic)
    #: Seconds the claim took (set when claimed).
    claim_s: float = 0.0
    #: The slot's session store directory, mounted where the pack keeps sessions.
    sessions_dir: Path | None = None
    #: The host directory bound at ``/workspace`` (on ``disk`` when bounded).
    workspace: Path = Path()
    #: The slot's own bounded disk (``limits.disk_mb`` with ``ACPW_WORKSPACE_DISK=loop``).
    disk: BoundedDisk | None = None

    @property
    def staging(self) -> Path:
        """Where the claiming job stages its copy: next to ``workspace``, on its disk."""
        return self.workspace.parent / "staging"

    def release_hold(self) -> None:
        if self.hold is not None:
            os.close(self.hold)
            self.hold = None


class Pool(Protocol):
    """What a job asks of its process's warm pools (``worker.job.warm.WarmPool``)."""

    #: The credential bindings' key: drawn by the pool process, never stored.
    key: bytes
    backend: SandboxBackend
    backend_config: str

    def slots(self, pack: str) -> int:
        """The slots ``pack`` may have (0: no pool)."""
        ...

    def usable(self) -> bool:
        """Whether the backend can keep slots at all."""
        ...

    async def claim(self, recipe: Recipe, *, job_id: str, attempt: int, token: str) -> Slot | None:
        """A free slot of ``recipe``'s identity, claimed for the attempt (None: a miss)."""
        ...

    def replenish(self, recipe: Recipe) -> None:
        """Start making a slot of ``recipe`` in the background, if there is room."""
        ...


def pooled(pool: Pool | None, pack: str) -> bool:
    """Whether a job of ``pack`` may find a warm slot here: the process has pools, its
    backend keeps slots, and the pack has at least one."""
    return pool is not None and pool.usable() and pool.slots(pack) > 0
