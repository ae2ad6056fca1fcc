"""The local backend itself: ``LocalBackend`` (create, destroy, list, status) and
``LocalSandbox`` (spawn, admission in its view). See the package docstring."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from worker.admission import AdmissionResult, MaskEntry, check_workspace, mask_plan
from worker.errors import SandboxError
from worker.network import PROXY_PORT, AllowlistProxy, forwarder_argv, proxy_env
from worker.sandbox import cgroups, hostfill, mountpoints, netpolicy, staging
from worker.sandbox.base import (
    LABEL_WORKER,
    WORKSPACE,
    Capabilities,
    LeaseDeadline,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
)
from worker.sandbox.config import LocalConfig
from worker.sandbox.hostfiles import HostWorkspaceFiles
from worker.sandbox.local import dynmods, netns
from worker.sandbox.local.bwrap import (
    BindSources,
    HostLayout,
    bind_sources,
    build_bwrap_options,
    build_shared_etc,
    stage_sources,
)
from worker.sandbox.local.privilege import HostTools
from worker.sandbox.local.process import (
    LocalProcess,
    kill_and_remove,
    kill_until_exiting,
    start_admitted,
)
from worker.sandbox.local.records import (
    DEFAULT_STATE_DIR,
    LocalSandboxStatus,
    SandboxRecord,
    StateStore,
    check_local_id,
    sandbox_labels,
    staged_names,
    translate_oserror,
)
from worker.sandbox.shared import ProxyRegistry, check_command, check_spec, make_sandbox_id
from worker.sandbox.watchdogs import Watchdogs

# Staged bind sources (root worker only). Not under the state dir: every uid must be able
# to traverse down to it, so it is a fixed, world-traversable place.
DEFAULT_STAGE_DIR = Path("/run/acp-worker/stage")


class LocalSandbox:
    """One job's sandbox: spawns bwrap processes into its cgroups."""

    def __init__(
        self,
        backend: LocalBackend,
        record: SandboxRecord,
        spec: SandboxSpec,
        masks: Sequence[MaskEntry] = (),
    ) -> None:
        self._backend = backend
        self._record = record
        self._spec = spec
        self._masks = tuple(masks)
        #: Each spawn's wait for its exit, which ends the proxy's fronts for it.
        self._fronting: set[asyncio.Task[None]] = set()

    @property
    def sandbox_id(self) -> str:
        return self._record.sandbox_id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    @property
    def cgroups(self) -> cgroups.CgroupSet:
        return self._record.cgroups

    @property
    def masks(self) -> tuple[MaskEntry, ...]:
        """The mask mounts every spawn gets (empty when ``spec.mask_config`` is off)."""
        return self._masks

    @property
    def host_workspace(self) -> Path:
        """The host directory bound at ``/workspace``."""
        return self._record.workspace

    def relabel(self, labels: Mapping[str, str]) -> SandboxRecord:
        """Give the sandbox's record ``labels`` (a warm slot claimed by its job)."""
        record = self._record = replace(self._record, labels=dict(labels))
        with translate_oserror("record", self.sandbox_id):
            self._backend.store.write(record)
        return record

    def oom_killed(self) -> bool:
        """True once the kernel OOM-killed any process of this sandbox."""
        return cgroups.oom_kills(self._record.cgroups) > 0

    def workspace_files(self) -> HostWorkspaceFiles:
        """The workspace at its host path, with this sandbox's masks: bubblewrap binds
        that very directory (a root worker's staged twin is a bind of it too)."""
        return HostWorkspaceFiles(self._record.workspace, masks=self._masks)

    def admission_view(self, *, provider: str = "cursor") -> AdmissionResult:
        """The admission check as the agent's mount view will show the workspace.

        Run right before launch. It checks the host-side workspace, which here *is* the
        mount view's ``/workspace``: bubblewrap binds that very directory (same inodes, no
        copy) and nothing else. Three adjustments make it exact: levels above the
        workspace are dropped (inside, its parent is the sandbox's own read-only root,
        which holds no ``.git`` and no config, so discovery stops there); the system
        locations are looked up in the sandbox's generated ``/etc``; and a finding at a
        masked path (or below a masked directory) is dropped while the host entry there is
        the kind the mask is mounted over (inside, that path shows the mask, whatever the
        file holds). A symlink or a wrong kind at a masked path is still reported.

        Raises:
            WorkspaceUnavailable: the workspace is gone.
        """
        record = self._record
        result = check_workspace(
            record.workspace, provider=provider, system_roots=(self._backend.system_view,)
        )
        kept = tuple(
            f
            for f in result.findings
            if not f.path.startswith("../")
            and not mountpoints.hidden(record.workspace, self._masks, f.path)
        )
        git_root = result.git_root if result.git_root == result.workspace else None
        notes = tuple(n for n in result.notes if not n.path.startswith("../"))
        return replace(result, git_root=git_root, findings=kept, notes=notes)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
        before_launch: Callable[[], Awaitable[None]] | None = None,
    ) -> LocalProcess:
        """Start ``argv`` inside the sandbox with exactly ``env`` (nothing inherited).

        ``before_launch`` runs after the arguments are checked and immediately before the
        process starts (e.g. ``admission_view().raise_if_refused()``); what it raises
        propagates and nothing starts.

        Raises:
            SandboxError: the sandbox could not start the process.
        """
        check_command(argv, env, cwd)
        listeners: list[socket.socket] = []
        before_gate: Callable[[int], None] | None = None
        tunnels = self._spec.network_tunnels
        if self._spec.network == "allowlist":
            env = {**env, **proxy_env()}
            if self._backend.privileged:  # the proxy listens in the sandbox itself
                ports = [PROXY_PORT, *(port for port, _ in tunnels)]

                def before_gate(child: int) -> None:
                    listeners.extend(netns.listen_in(child, ports))

            else:
                argv = forwarder_argv(tuple(argv), tunnels)
        if before_launch is not None:
            await before_launch()
        try:
            with translate_oserror("spawn", self.sandbox_id):
                proc = await self._start(argv, env, cwd, stdout_limit, before_gate)
            if listeners:
                await self._front(proc, listeners, [None, *(target for _, target in tunnels)])
        except BaseException:
            for listener in listeners:
                listener.close()
            raise
        finally:  # joined (or failed): the creation's priming has done its part
            self._backend.unprime(self.sandbox_id)
        self._record = replace(self._record, pids=(*self._record.pids, proc.pid))
        with translate_oserror("record", self.sandbox_id):
            self._backend.store.write(self._record)
        return LocalProcess(proc, self._record.cgroups)

    async def _front(
        self,
        proc: asyncio.subprocess.Process,
        listeners: Sequence[socket.socket],
        tunnels: Sequence[str | None],
    ) -> None:
        """The sandbox's proxy serves ``listeners`` (the proxy's port, then one per
        tunnel, made in the process's network namespace) until the process exits.

        Raises:
            SandboxError: the sandbox has no proxy (destroyed meanwhile).
        """
        proxy = self._backend.proxy(self.sandbox_id)
        if proxy is None:
            raise SandboxError("the sandbox's proxy is gone", sandbox_id=self.sandbox_id)
        fronted = zip(listeners, tunnels, strict=True)
        servers = [await proxy.front(sock, target) for sock, target in fronted]

        async def unfront_on_exit() -> None:
            try:
                await proc.wait()
            finally:
                for server in servers:
                    proxy.unfront(server)

        task = asyncio.ensure_future(unfront_on_exit())
        self._fronting.add(task)
        task.add_done_callback(self._fronting.discard)

    async def _start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        limit: int,
        before_gate: Callable[[int], None] | None = None,
    ) -> asyncio.subprocess.Process:
        backend = self._backend

        def options(seccomp_fd: int) -> list[str]:
            return build_bwrap_options(
                layout=backend.layout,
                spec=self._spec,
                sources=backend.bind_sources(self._record, self._spec),
                masks=self._masks,
                env=env,
                cwd=cwd,
                seccomp_fd=seccomp_fd,
            )

        return await start_admitted(
            self._record.cgroups,
            prefix=backend.tools.privilege_drop(self._record),
            bwrap=backend.tools.bwrap_path(),
            argv=argv,
            options=options,
            limit=limit,
            before_gate=before_gate,
        )


#: How long a job's head start (``LocalBackend.prime``) primes at most.
PRIME_AHEAD_S = 0.25


class LocalBackend:
    """``SandboxBackend`` on bubblewrap; ``list``/``destroy`` work from any process."""

    name = "local"
    capabilities = Capabilities(runs_host_usr=True, warm_slots=True)

    def __init__(
        self,
        config: LocalConfig,
        *,
        state_dir: Path = DEFAULT_STATE_DIR,
        etc_dir: Path | None = None,
        stage_dir: Path = DEFAULT_STAGE_DIR,
    ) -> None:
        """``etc_dir``: where the shared sandbox /etc is built (default ``state_dir/etc``).

        ``stage_dir``: where a root worker stages bind sources (see ``staging``).
        """
        self.config = config
        self.store = StateStore(state_dir)
        self._etc_dir = etc_dir or state_dir / "etc"
        self._stage_dir = stage_dir
        self._layout: HostLayout | None = None
        self._proxies = ProxyRegistry()
        #: Each sandbox's hold on the migration primer until its first spawn (``unprime``).
        self._priming: dict[str, Callable[[], None]] = {}
        self._watchdogs = Watchdogs(self.store.root / "leases")
        self.privileged = os.geteuid() == 0
        self.owner = config.host_owner()
        self.tools = HostTools(bwrap=config.bwrap, owner=self.owner)

    def stage_owner(self) -> tuple[int, int]:
        return self.owner

    @property
    def layout(self) -> HostLayout:
        if self._layout is None:
            self._layout = HostLayout.detect()
        return self._layout

    @property
    def empty_dir(self) -> Path:
        """The empty directory bound read-only over masked directories."""
        return self.store.root / "empty"

    @property
    def system_view(self) -> Path:
        """A root whose ``etc`` is the sandboxes' /etc: where admission finds system config."""
        return self.store.root / "view"

    def bind_sources(self, record: SandboxRecord, spec: SandboxSpec) -> BindSources:
        """Host paths of the bind sources, or (root worker) their staged twins."""
        return bind_sources(record, spec, empty_dir=self.empty_dir)

    def unprime(self, sandbox_id: str) -> None:
        """Release the sandbox's hold on the migration primer (its first spawn joined, or
        it is going away); idempotent."""
        release = self._priming.pop(sandbox_id, None)
        if release is not None:
            release()

    def proxy(self, sandbox_id: str) -> AllowlistProxy | None:
        """The proxy this process runs for ``sandbox_id`` (``allowlist``), if any."""
        return self._proxies.get(sandbox_id)

    def cgroup_driver(self) -> cgroups.CgroupDriver:
        return cgroups.detect(self.config.cgroup_root, self.config.cgroup_parent)

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        """Write the record, generate /etc, make the cgroups, mask mount points and stage.

        Raises:
            SandboxError: bubblewrap, a system tool or a cgroup controller is missing, a path
                in the spec is not a directory, the network policy is malformed or
                unsupported (``netpolicy.check``), a writable mount is not below HOME, the
                worker is root and the workspace or a writable mount is not owned by the
                sandbox's host uid, a config path to mask is a symlink or
                the wrong kind, or the network proxy did not start.
        """
        check_spec(spec)
        if self.privileged:
            _check_owner(spec.workspace, self.owner)
            for state in spec.state_mounts:
                _check_owner(state.source, self.owner, what="writable mount")
        self.tools.bwrap_path()
        if self.privileged:
            for name in ("nsenter", "setpriv"):
                self.tools.tool(name)
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        self._check_dynmods()
        driver = self.cgroup_driver()
        stage = self._stage_dir / sandbox_id if self.privileged else None
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            labels=sandbox_labels(spec, self.config.worker_id),
            cgroups=driver.plan(sandbox_id),
            etc_dir=self._etc_dir,
            workspace=spec.workspace.resolve(),
            pack_closure=spec.pack_closure,
            stage=stage,
            staged=staged_names(spec) if stage else (),
        )
        # Record first: whatever create leaves behind, destroy can find and remove.
        with translate_oserror("create", sandbox_id):
            self.store.write(record)
        masks = mask_plan(record.workspace) if spec.mask_config else []
        record, primed = await self._prepare(driver, record, spec, masks)
        # Released at its first spawn, or at its destroy if it never spawns.
        self._priming[record.sandbox_id] = primed
        return LocalSandbox(self, record, spec, masks)

    def prime(self) -> Callable[[], None]:
        """Cheap cgroup joins from now until the release (``Priming``; ``dynmods``): a
        job's sandbox, made a few milliseconds later, finds the kernel's lock ready. A
        preparation longer than ``PRIME_AHEAD_S`` (a closure re-hashed) lets it lapse:
        the sandbox's own hold starts it again."""
        self._check_dynmods()
        return dynmods.prime(enabled=self.config.cgroup_prime, for_at_most_s=PRIME_AHEAD_S)

    def _check_dynmods(self) -> None:
        config = self.config
        dynmods.check(
            config.cgroup_favordynmods, privileged=self.privileged, prime=config.cgroup_prime
        )

    async def _prepare(
        self,
        driver: cgroups.CgroupDriver,
        record: SandboxRecord,
        spec: SandboxSpec,
        masks: Sequence[MaskEntry],
    ) -> tuple[SandboxRecord, Callable[[], None]]:
        """The record of the prepared sandbox, and its hold on the migration primer
        (``dynmods``), taken once its cgroups are made: a primer's first rewrite holds the
        kernel's cgroup mutex for a grace period, which their writes would wait out first.
        They are made in a thread, beside the rest, in case a job's primer is at it."""
        primed = dynmods.prime(enabled=False)
        made: asyncio.Future[cgroups.CgroupSet] | None = None
        try:
            with translate_oserror("create", record.sandbox_id):
                if not record.etc_dir.is_dir():
                    await asyncio.to_thread(build_shared_etc, record.etc_dir)
                self._shared_dirs()
                made = asyncio.ensure_future(
                    asyncio.to_thread(driver.create, record.sandbox_id, spec.limits)
                )
                owner = self.owner if self.privileged else None
                points = mountpoints.ensure(record.workspace, masks, owner)
                record = replace(record, mask_points=tuple(points))
                self.store.write(record)
                record = await self._start_network(record, spec)
                if record.stage is not None:
                    staging.prepare_root(self._stage_dir)
                    sources = stage_sources(record, spec, empty_dir=self.empty_dir)
                    await staging.create(record.stage, sources)
                await made
                primed = dynmods.prime(enabled=self.config.cgroup_prime)
                if spec.lease_deadline is not None:
                    # Bounded by its lease from here (nothing runs in it yet), even if
                    # this process freezes.
                    self._watchdogs.start(
                        record.sandbox_id, spec.lease_deadline, record.cgroups.paths
                    )
        except BaseException as exc:
            primed()
            if made is not None:  # its thread ends before destroy removes the cgroups
                await asyncio.wait({made})
            if isinstance(exc, SandboxError):
                await self.destroy(record.sandbox_id)
            raise
        return record, primed

    async def _start_network(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        """The sandbox's proxy: a root worker's serves the listeners each spawn makes in
        the sandbox (no socket, nothing bound in); otherwise its socket is bound in, for
        the forwarder."""
        if spec.network != "allowlist":
            return record
        if self.privileged:
            self._proxies.start_fronted(record.sandbox_id, spec)
            return record
        directory = await self._proxies.start(record.sandbox_id, spec, self.owner)
        record = replace(record, proxy_dir=directory)
        self.store.write(record)
        return record

    def _shared_dirs(self) -> None:
        # The empty mask directory and the admission view's root, shared by all sandboxes.
        self.empty_dir.mkdir(mode=0o555, exist_ok=True)
        self.system_view.mkdir(exist_ok=True)
        link = self.system_view / "etc"
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):  # a concurrent creator won
                link.symlink_to(self._etc_dir.resolve())

    async def assign(
        self,
        sandbox: Sandbox,
        *,
        labels: Mapping[str, str],
        lease_deadline: LeaseDeadline | None,
        deadline_s: int | None = None,
    ) -> None:
        """A warm slot's sandbox made the attempt's: its record relabelled (the reaper
        judges it by the attempt's lease from now on) and its lease watchdog started.
        ``deadline_s`` is not enforced, as ``create`` does not enforce a spec's."""
        assert isinstance(sandbox, LocalSandbox)
        del deadline_s
        record = sandbox.relabel({LABEL_WORKER: self.config.worker_id, **labels})
        if lease_deadline is not None:
            self._watchdogs.start(record.sandbox_id, lease_deadline, record.cgroups.paths)

    async def fill(self, sandbox: Sandbox, staged: Path) -> Path:
        """The staged copy moved into the slot's host workspace, which bubblewrap binds
        (``hostfill``: in place, the mask mount points kept)."""
        assert isinstance(sandbox, LocalSandbox)
        workspace = sandbox.host_workspace
        await asyncio.to_thread(hostfill.move_into, staged, workspace)
        return workspace

    async def quiesce(self, sandbox_id: str) -> None:
        """Kill everything inside and undo what ``create`` made around it that a result
        could see (its proxy, the mask mount points in the workspace), returning as soon
        as nothing in it can run again (``kill_until_exiting``); ``destroy`` then removes
        the rest once the kernel has reaped the processes (the staging namespace, whose
        release waits for an RCU grace period, the cgroups, the record). Idempotent.

        Raises:
            SandboxError: a process was still not exiting after the bounded kill loop.
        """
        record = self._recorded(sandbox_id)
        if record is None:
            return
        with translate_oserror("destroy", sandbox_id):
            await kill_until_exiting(record.cgroups, sandbox_id)
            await self._release(record, stage=False)
            # Released: what is left for ``destroy`` is the stage, the cgroups, the record.
            self.store.write(replace(record, mask_points=(), proxy_dir=None))

    async def destroy(self, sandbox_id: str) -> None:
        """Kill everything inside and remove what ``create`` made; idempotent.

        Raises:
            SandboxError: processes survived the bounded kill loop or a cgroup stayed
                busy; the record is kept so a later destroy can finish.
        """
        record = self._recorded(sandbox_id)
        if record is None:
            return
        with translate_oserror("destroy", sandbox_id):
            await kill_and_remove(record.cgroups, sandbox_id)
            await self._release(record)
            self.store.delete(sandbox_id)

    def _recorded(self, sandbox_id: str) -> SandboxRecord | None:
        """The record of a sandbox to kill; None (its watchdog stopped, if any) when
        there is none: destroyed already, or never made.

        Raises:
            SandboxError: not a local sandbox id.
        """
        check_local_id(sandbox_id)
        record = self.store.read(sandbox_id)
        if record is None:
            self._watchdogs.stop(sandbox_id)
        return record

    async def _release(self, record: SandboxRecord, *, stage: bool = True) -> None:
        """What surrounds a sandbox whose processes are gone or exiting (with ``stage``,
        its staging namespace too); idempotent."""
        self.unprime(record.sandbox_id)
        self._watchdogs.stop(record.sandbox_id)
        await self._proxies.close(record.sandbox_id)
        if stage and record.stage is not None:
            staging.remove(record.stage, record.staged)
        mountpoints.remove(record.workspace, record.mask_points)
        if record.proxy_dir is not None:
            netpolicy.remove_dir(record.proxy_dir)

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Sandboxes whose labels include all of ``labels``, from the state records.

        Records outlive their processes until ``destroy``; ``status`` tells whether a
        listed sandbox still has processes.
        """
        wanted = dict(labels).items()
        return [
            SandboxInfo(r.sandbox_id, self.name, dict(r.labels))
            for r in self.store.all()
            if wanted <= dict(r.labels).items()
        ]

    async def status(self, sandbox_id: str) -> LocalSandboxStatus | None:
        """Live pids and OOM kills of a recorded sandbox; None if there is no record."""
        check_local_id(sandbox_id)
        record = self.store.read(sandbox_id)
        if record is None:
            return None
        return LocalSandboxStatus(
            sandbox_id=sandbox_id,
            labels=record.labels,
            pids=frozenset(cgroups.members(record.cgroups)),
            oom_kills=cgroups.oom_kills(record.cgroups),
        )


def _check_owner(workspace: Path, owner: tuple[int, int], *, what: str = "workspace") -> None:
    """A root worker's sandbox writes as ``owner``: what it writes to must be ``owner``'s."""
    uid, gid = owner
    found = workspace.stat().st_uid
    if found != uid:
        raise SandboxError(
            f"{what} {workspace} is owned by uid {found}, not by the sandbox host uid "
            f"{uid}: the worker runs as root, so the sandbox runs as uid {uid} and could "
            f"not write it; stage the {what} owned by {uid}:{gid} (stage_owner)",
            workspace=str(workspace),
            owner_uid=found,
            sandbox_uid=uid,
        )
