"""Warm pools: a job finds its agent already started, initialized and waiting.

A *slot* is a sandbox made with no job (``SlotHost``), the pack's agent spawned in it
and its ``initialize`` answered, and nothing of any job in it yet. Slots are kept per
*launch identity* (``Recipe.identity``, ``worker.job.identity``): the pack closure, the
launch argv and environment, the backend and its config, the network plan, the model
(HOME files depend on it), the limits, the client capabilities, and the *credential
binding*: an HMAC of the agent's resolved credentials under a key this process draws at
random and never stores. A job claims a slot only when its own identity is the same, so
a slot holds no secret but the claiming job's own; a miss (any difference, or no slot
free) is the cold path, unchanged.

Where slots live: an agent's stdio belongs to the process that spawned it, so each pool
process keeps its own slots on its one long-lived event loop (``tasks``) and a job of
that process claims among them. The claim is atomic and recorded in Redis
(``worker.store.warm``): the slot's record is a lease its pool renews while it lives, so
a reaper destroys the slots of a dead worker like any orphan sandbox. One use: a claimed
slot becomes the attempt's sandbox and is destroyed by the job's teardown; once the job
settled, the pool makes slots from the same job's recipe in the background until the
pack's pool is full again (so the first job of an identity is cold, the next one warm).
Idle slots age out after ``ACPW_WARM_MAX_IDLE_S`` and are destroyed, never handed back,
on drain and shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from worker import metrics
from worker.acp.agent import AgentProcess
from worker.acp.client import AcpClient
from worker.errors import WorkerError
from worker.job.home import home_files, stage_home_files
from worker.job.slot import Recipe, Relay, Slot
from worker.job.turn import launch_agent
from worker.packs.cache import hold_closure
from worker.sandbox import base
from worker.sandbox.base import Sandbox, SandboxBackend, SlotHost
from worker.sessions import JobSessions
from worker.settings import Settings
from worker.store import warm as records
from worker.store.owner import LABEL_STORE, owner_labels, store_label
from worker.workspace.disk import TEMPLATES, BoundedDisk, mount_bounded
from worker.workspace.prepare import write_labels
from worker.workspace.stage import remove_staged

if TYPE_CHECKING:
    import redis.asyncio as aioredis


log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Seconds a claimed slot's record outlives its claim (the reaper then judges the
#: sandbox by the attempt's own lease, whose labels it carries by then).
CLAIMED_TTL_S = 60.0


class WarmPool:
    """One pool process's warm slots, on that process's long-lived event loop."""

    def __init__(
        self,
        settings: Settings,
        backend: SandboxBackend,
        *,
        backend_config: str,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.backend_config = backend_config
        #: The credential bindings' key: drawn here, never stored.
        self.key = secrets.token_bytes(32)
        self._draining = draining
        self._idle: list[Slot] = []
        self._making: dict[str, int] = {}  # pack name -> slots being made
        self._tasks: set[asyncio.Task[None]] = set()
        #: The tasks that only make slots: cancelled on ``close`` (a destroy is not: a
        #: sandbox whose deletion is cut short is left to the reaper).
        self._making_tasks: set[asyncio.Task[None]] = set()
        self._client: aioredis.Redis | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False
        owner = owner_labels().get("acpw.owner")
        #: Who renews the slots' records: this process (its ``acpw.owner`` label).
        self.owner = owner or f"pid:{os.getpid()}:{secrets.token_hex(4)}"

    def slots(self, pack: str) -> int:
        return self.settings.warm_pools.get(pack, 0)

    def usable(self) -> bool:
        return isinstance(self.backend, SlotHost) and self.backend.capabilities.warm_slots

    def idle(self) -> list[Slot]:
        return list(self._idle)

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            from worker.store.lease import redis_client

            self._client = redis_client(self.settings.redis_url, self.settings)
        return self._client

    # --- claim -------------------------------------------------------------------------

    async def claim(self, recipe: Recipe, *, job_id: str, attempt: int, token: str) -> Slot | None:
        """A free slot of ``recipe``'s identity, claimed for the attempt (None: a miss)."""
        started = time.monotonic()
        for slot in [s for s in self._idle if s.recipe.identity == recipe.identity]:
            self._idle.remove(slot)  # no other coroutine of this loop can take it now
            if slot.agent.process.returncode is not None:
                self._spawn(self._destroy(slot, retire=True))
                continue
            try:
                won = await records.claim(
                    self._redis(),
                    slot.slot_id,
                    owner=self.owner,
                    job_id=job_id,
                    attempt=attempt,
                    token=token,
                    ttl_s=CLAIMED_TTL_S,
                )
            except Exception:  # Redis did not answer: the cold path, the slot goes
                log.exception("warm slot %s: the claim failed", slot.slot_id)
                won = False
            if won:
                slot.claim_s = time.monotonic() - started
                slot.release_hold()
                metrics.warm_claimed(recipe.pack_name, slot.claim_s)
                self._gauge()
                return slot
            self._spawn(self._destroy(slot, retire=False))
        metrics.warm_missed(recipe.pack_name)
        self._gauge()
        return None

    # --- making slots ------------------------------------------------------------------

    def replenish(self, recipe: Recipe) -> None:
        """Start making slots of ``recipe`` in the background until its pack's pool is
        full (a pool that ran dry, a burst's jobs each claiming a slot, is full again
        after one job instead of one slot a job); with no room, an idle slot of another
        identity of the same pack is evicted for one."""
        if self._closed or self._draining():
            return
        pack = recipe.pack_name
        limit = self.slots(pack)
        same = [s for s in self._idle if s.recipe.pack_name == pack]
        room = limit - len(same) - self._making.get(pack, 0)
        if room <= 0:
            others = [s for s in same if s.recipe.identity != recipe.identity]
            if not others or self._making.get(pack, 0) >= limit:
                return
            self._idle.remove(others[0])
            self._spawn(self._destroy(others[0], retire=True))
            room = 1
        for _ in range(room):
            self._making[pack] = self._making.get(pack, 0) + 1
            self._making_tasks.add(self._spawn(self._make(recipe)))
        self._start_keeper()

    async def _make(self, recipe: Recipe) -> None:
        started = time.monotonic()
        try:
            slot = await self.make(recipe)
        except WorkerError as exc:
            log.warning("warm slot of %s not made: %s", recipe.pack_name, exc.message)
            slot = None
        except Exception:
            log.exception("warm slot of %s not made", recipe.pack_name)
            slot = None
        finally:
            self._making[recipe.pack_name] -= 1
        if slot is None:
            return
        if self._closed or self._draining():
            await self._destroy(slot, retire=True)
            return
        self._idle.append(slot)
        self._gauge()
        took = (time.monotonic() - started) * 1000
        log.info("warm slot %s of %s ready (made in %.0f ms)", slot.slot_id, recipe.pack_name, took)

    async def make(self, recipe: Recipe) -> Slot | None:
        """A new slot of ``recipe``: recorded, its sandbox made, its agent spawned and
        initialized. None when the pack's closure could not be held.

        Raises:
            WorkerError: the sandbox or the agent could not be made (nothing is left).
        """
        settings, backend = self.settings, self.backend
        slot_id = secrets.token_hex(8)
        hold = await asyncio.to_thread(hold_closure, settings.cache_dir, recipe.pack.closure)
        if hold is None:
            return None
        directory = settings.work_dir / f"warm-{slot_id}"
        relay = Relay()
        sandbox: Sandbox | None = None
        agent: AgentProcess | None = None
        disk: BoundedDisk | None = None
        try:
            # Recorded before anything labelled exists: a reaper judges an unclaimed slot
            # by its record, so it must never find the labels without it.
            await records.register(
                self._redis(), slot_id, owner=self.owner, ttl_s=settings.lease_ttl
            )
            labels = self._labels(slot_id)
            await _made(_make_dir, directory, labels)
            if recipe.disk_mb is not None:
                disk = await _made(
                    mount_bounded,
                    directory,
                    size_mb=recipe.disk_mb,
                    templates=settings.cache_dir / TEMPLATES,
                )
            root = directory if disk is None else disk.mount
            workspace = root / "workspace"
            await _made(_make_workspace, workspace, backend.stage_owner())
            endpoint = recipe.network.endpoint
            files = home_files(
                recipe.pack.pack.manifest.launch,
                None if endpoint is None else endpoint.agent_url,
                recipe.model,
            )
            owner = backend.stage_owner()
            mounts = await _made(stage_home_files, directory, files, owner)
            # The pack's session store, empty (a job that resumes a session is cold):
            # the claiming job's sessions adopt it (``Slot.sessions_dir``).
            launch = recipe.pack.pack.manifest.launch
            sessions = JobSessions.for_job(
                settings, pack=recipe.pack_name, files=launch.session_files, resume=None
            )
            if sessions is not None:
                mounts += (await _made(sessions.prepare, directory, owner),)
            net = recipe.network
            spec = base.SandboxSpec(
                job_id=f"warm-{slot_id}",
                attempt=1,
                workspace=workspace,
                pack_closure=recipe.pack.closure,
                limits=recipe.limits,
                labels=labels,
                network=net.mode,
                network_allow=net.allow,
                network_private=net.private,
                network_tunnels=net.tunnels,
                on_network_denial=relay.on_denial,
                state_mounts=mounts,
            )
            sandbox = await backend.create(spec)
            agent = await launch_agent(
                sandbox,
                recipe.plan,
                settings,
                provider=recipe.provider,
                on_notification=relay.on_notification,
                on_malformed=relay.on_malformed,
                on_oversize=relay.on_oversize,
                on_stray_reply=relay.on_stray_reply,
            )
            agent.start()
            init = await AcpClient(agent.connection).initialize(recipe.capabilities)
        except BaseException:
            await self._dismantle(slot_id, directory, sandbox, agent, hold, retire=True)
            raise
        # A start slower than the record's TTL let it lapse: a reaper may be at it.
        ttl = settings.lease_ttl
        if not await records.renew(self._redis(), slot_id, owner=self.owner, ttl_s=ttl):
            log.warning("warm slot %s: its record lapsed while it was made", slot_id)
            await self._dismantle(slot_id, directory, sandbox, agent, hold, retire=True)
            return None
        return Slot(
            slot_id=slot_id,
            recipe=recipe,
            directory=directory,
            sandbox=sandbox,
            agent=agent,
            initialized=init,
            relay=relay,
            hold=hold,
            sessions_dir=None if sessions is None else sessions.host_dir,
            workspace=workspace,
            disk=disk,
        )

    def _labels(self, slot_id: str) -> dict[str, str]:
        store = store_label(self.settings.redis_url)
        return {
            base.LABEL_JOB: f"warm-{slot_id}",
            base.LABEL_ATTEMPT: "1",
            base.LABEL_TOKEN: "0",
            base.LABEL_WORKER: self.settings.worker_id,
            base.LABEL_SLOT: slot_id,
            **owner_labels(),
            **({LABEL_STORE: store} if store is not None else {}),
        }

    # --- keeping and ending ------------------------------------------------------------

    def _start_keeper(self) -> None:
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.create_task(self._keep(), name="warm-keeper")

    async def _keep(self) -> None:
        """Renew the idle slots' records; destroy the aged, the lapsed and the dead."""
        settings = self.settings
        while not self._closed:
            await asyncio.sleep(settings.lease_renew)
            await self.tend()
            if not self._idle and not any(self._making.values()):
                return

    async def tend(self) -> None:
        """One round of the keeper (also what a test calls)."""
        now = time.monotonic()
        draining = self._draining()
        for slot in list(self._idle):
            aged = now - slot.made_at >= self.settings.warm_max_idle_s
            dead = slot.agent.process.returncode is not None
            renewed = False
            if not (aged or dead or draining):
                try:
                    renewed = await records.renew(
                        self._redis(), slot.slot_id, owner=self.owner, ttl_s=self.settings.lease_ttl
                    )
                except Exception:
                    log.exception("warm slot %s: renewal failed", slot.slot_id)
            if not renewed and slot in self._idle:
                self._idle.remove(slot)
                await self._destroy(slot, retire=True)
        self._gauge()

    async def close(self) -> None:
        """Destroy every idle slot (never handed back) and stop making new ones (a slot
        being made is cancelled, one being destroyed is waited for)."""
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
        for task in list(self._making_tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        slots, self._idle = self._idle, []
        for slot in slots:
            await self._destroy(slot, retire=True)
        self._gauge()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _destroy(self, slot: Slot, *, retire: bool) -> None:
        await self._dismantle(
            slot.slot_id, slot.directory, slot.sandbox, slot.agent, slot.hold, retire=retire
        )
        slot.hold = None

    async def _dismantle(
        self,
        slot_id: str,
        directory: Path,
        sandbox: Sandbox | None,
        agent: AgentProcess | None,
        hold: int | None,
        *,
        retire: bool,
    ) -> None:
        """Everything a slot holds, gone: its record, agent, sandbox, directory, hold."""
        if retire:
            with contextlib.suppress(Exception):
                await records.retire(self._redis(), slot_id, owner=self.owner)
        if agent is not None:
            with contextlib.suppress(Exception):
                await agent.shutdown(eof_grace=0.0, term_grace=self.settings.shutdown_term_grace)
        try:
            if sandbox is not None:
                await self.backend.destroy(sandbox.sandbox_id)
            await asyncio.to_thread(remove_staged, directory)
        except Exception:  # the reaper finds what is left by its labels
            log.exception("warm slot %s: not fully destroyed", slot_id)
        finally:
            if hold is not None:
                os.close(hold)

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._making_tasks.discard)
        return task

    def _gauge(self) -> None:
        counts: dict[str, int] = {}
        for slot in self._idle:
            counts[slot.recipe.pack_name] = counts.get(slot.recipe.pack_name, 0) + 1
        for pack in self.settings.warm_pools:
            metrics.warm_idle(pack, counts.get(pack, 0))


async def _made(make: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``make`` on a thread (it makes something under a slot's directory: a mounted
    disk, files), whose cancel waits for the thread to end before it propagates: what
    the thread made is then there for the slot's dismantling to undo, never made after
    it (a disk mounted once the directory was removed stayed mounted)."""
    work = asyncio.ensure_future(asyncio.to_thread(make, *args, **kwargs))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await work
        raise


def _make_dir(directory: Path, labels: Mapping[str, str]) -> None:
    """The slot's directory, labelled for the reaper."""
    directory.parent.mkdir(parents=True, exist_ok=True, mode=0o711)
    directory.mkdir(mode=0o711)
    write_labels(directory, {**labels, "pid": str(os.getpid())})


def _make_workspace(workspace: Path, owner: tuple[int, int]) -> None:
    """The slot's empty workspace, owned by the sandbox's host uid when the worker is
    root."""
    workspace.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(workspace, *owner)
