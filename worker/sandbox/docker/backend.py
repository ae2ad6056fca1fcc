"""The docker backend itself: ``DockerBackend`` (create, destroy, list) and
``DockerSandbox`` (spawn, admission in its view). See the package docstring."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from worker.admission import AdmissionResult, MaskEntry, mask_plan
from worker.errors import SandboxError
from worker.images.engine import EngineConfig
from worker.images.identity import ImageIdentity
from worker.network import (
    forwarder_argv,
    proxy_env,
)
from worker.sandbox import cgroups, hostfill, mountpoints, netpolicy
from worker.sandbox.base import (
    LABEL_WORKER,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    Capabilities,
    LeaseDeadline,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
)
from worker.sandbox.docker.containers import (
    BACKEND_NAME,
    INTERNAL_LABELS,
    LABEL_BACKEND,
    LABEL_MASK_POINTS,
    LABEL_PROXY_DIR,
    LABEL_SANDBOX,
    LABEL_WORKSPACE,
    ImagePlan,
    ensure_mask_points,
    own_workspace,
    remove_mask_points,
    sandbox_labels,
)
from worker.sandbox.docker.engine import ContainerEngine, list_sandboxes, sandbox_status
from worker.sandbox.docker.process import DockerProcess
from worker.sandbox.hostfiles import HostWorkspaceFiles
from worker.sandbox.launcher import launch_header
from worker.sandbox.shared import (
    ProxyRegistry,
    check_command,
    check_id,
    check_spec,
    make_sandbox_id,
)
from worker.sandbox.view import check_same_workspace, container_admission
from worker.sandbox.watchdogs import Watchdogs

if TYPE_CHECKING:
    import docker

    from worker.sandbox.config import DockerConfig

#: The deadline files of this host's docker sandboxes' lease watchdogs.
DEFAULT_LEASE_DIR = Path("/run/acp-worker/docker-leases")


class DockerSandbox:
    """One job's sandbox: its first container is pre-created; later spawns add more."""

    def __init__(
        self,
        backend: DockerBackend,
        *,
        sandbox_id: str,
        spec: SandboxSpec,
        plan: ImagePlan,
        labels: Mapping[str, str],
        first_container: str,
        masks: Sequence[MaskEntry] = (),
    ) -> None:
        self.backend = backend
        self._sandbox_id = sandbox_id
        self._spec = spec
        self.plan = plan
        self.labels = dict(labels)
        self._masks = tuple(masks)
        self._pending: str | None = first_container
        self._count = 1
        self.processes: list[DockerProcess] = []
        #: A container of this sandbox was seen to bind the host workspace itself.
        self._bind_proven = False

    @property
    def sandbox_id(self) -> str:
        return self._sandbox_id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    @property
    def masks(self) -> tuple[MaskEntry, ...]:
        """The mask mounts every container gets (empty when ``spec.mask_config`` is off)."""
        return self._masks

    def oom_killed(self) -> bool:
        """True once a process of this sandbox was OOM-killed (inferred, see module)."""
        return any(p.oom_killed for p in self.processes)

    def workspace_files(self) -> HostWorkspaceFiles:
        """The staged host directory that every container binds at ``/workspace``, with
        this sandbox's masks. Used only once a running container is seen, through
        ``/proc/<its init pid>/root``, to bind that very directory (``admission_view``
        proves it before the launch; else the first use asks the engine for a running
        container): a remote engine's ``/workspace`` is never mistaken for it."""
        return HostWorkspaceFiles(
            self._spec.workspace.resolve(), masks=self._masks, reachable=self._bind_shared
        )

    def _bind_shared(self) -> bool:
        """True once a running container showed the host workspace at ``/workspace``
        (blocking: may inspect containers; remembered once true)."""
        if not self._bind_proven:
            host = self._spec.workspace.resolve()
            for pid in self._running_pids():
                try:
                    check_same_workspace(pid, host)
                except SandboxError:
                    continue
                self._bind_proven = True
                break
        return self._bind_proven

    def _running_pids(self) -> list[int]:
        engine = self.backend.engine
        started = engine.started(self._sandbox_id)
        pids = [] if started is None else [started.pid]
        for process in self.processes:
            if process.returncode is None:
                try:
                    pids.append(engine.init_pid(process.container_id))
                except SandboxError:
                    continue
        return pids

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> DockerProcess:
        """Start ``argv`` in a container of this sandbox with exactly ``env``.

        Raises:
            ImageMismatch: the container's image is not the pinned one any more.
            SandboxError: the engine could not attach or start the container.
        """
        check_command(argv, env, cwd)
        if self._spec.network == "allowlist":
            argv = forwarder_argv(tuple(argv), self._spec.network_tunnels)
            env = {**env, **proxy_env()}
        started = self.backend.engine.take_started(self._sandbox_id)
        if started is None:
            container = self._pending or await self._next_container()
            self._pending = None
        else:
            container = started.container
        process = await self.backend.engine.start(
            self.plan, container, launch_header(argv, env, cwd), stdout_limit,
            sock=None if started is None else started.sock, on_started=self._bound,
        )  # fmt: skip
        self.processes.append(process)
        return process

    def admission_view(self, *, provider: str = "cursor") -> AdmissionResult:
        """The admission check in this sandbox's own mount view, right before launch.

        Starts the container the next ``spawn`` runs in (its launcher then waits for the
        launch header on stdin, so nothing of the agent runs yet) and checks ``/workspace``
        as that container sees it, through ``/proc/<its init pid>/root``: the binds and
        masks as mounted, the image's system locations, links resolved inside it (see
        ``worker.sandbox.view``). When no container waits but a spawned process still
        runs (a warm slot's agent, before its job's launch), that process's container is
        the view checked. Blocking: call it from a thread.

        Raises:
            ImageMismatch: the container's image is not the pinned one.
            SandboxError: the container did not start, or its view is not visible from
                this host (the engine runs elsewhere).
            WorkspaceUnavailable: the view has no workspace.
        """
        engine = self.backend.engine
        started = engine.started(self._sandbox_id)
        running = self._running_process_pid() if started is None else 0
        if running > 0:
            # A warm slot's agent runs already: its container is the view to check.
            result = container_admission(
                running, host_workspace=self._spec.workspace.resolve(), masks=self._masks,
                provider=provider,
            )  # fmt: skip
            self._bind_proven = True
            return result
        if started is None:
            container = self._pending or self.backend.engine.create_container_now(
                self._spec, self.plan, self.labels, self._next_name(), self._masks
            )
            self._pending = None
            started = self.backend.engine.prestart(
                self._sandbox_id, container, self.plan, on_started=self._bound
            )
        result = container_admission(
            started.pid, host_workspace=self._spec.workspace.resolve(), masks=self._masks,
            provider=provider,
        )  # fmt: skip
        self._bind_proven = True  # container_admission checked the bind first
        return result

    def _running_process_pid(self) -> int:
        """The host pid of the init of a container in which a spawned process still runs
        (0: none)."""
        for process in self.processes:
            if process.returncode is None:
                try:
                    pid = self.backend.engine.init_pid(process.container_id)
                except SandboxError:
                    continue
                if pid > 0:
                    return pid
        return 0

    def assign(self, labels: Mapping[str, str], lease_deadline: LeaseDeadline | None) -> None:
        """Make the sandbox the attempt's (blocking): its next container created now with
        ``labels`` (a sandbox is listed with its newest container's labels, as a
        container's are fixed at creation), its running containers bounded by the
        attempt's lease, as ``spawn`` bounds each container it starts.

        Raises:
            SandboxError: the engine could not create the container, or a running
                container could not be bounded by the lease.
        """
        internal = {k: v for k, v in self.labels.items() if k in INTERNAL_LABELS}
        self.labels = {
            **labels,
            **internal,
            LABEL_SANDBOX: self._sandbox_id,
            LABEL_BACKEND: BACKEND_NAME,
        }
        engine, pending = self.backend.engine, self._pending
        self._pending = engine.create_container_now(
            self._spec, self.plan, self.labels, self._next_name(), self._masks
        )
        if pending is not None:  # made with the slot's labels: never to run
            engine.remove_all([{"Id": pending}])
        self._spec = replace(self._spec, lease_deadline=lease_deadline)
        if lease_deadline is None:
            return
        containers = [p.container_id for p in self.processes if p.returncode is None]
        started = self.backend.engine.started(self._sandbox_id)
        if started is not None:
            containers.append(started.container)
        for container in containers:
            self._bound(container)

    def _bound(self, container: str) -> None:
        """Bound a container that just started by the job's lease (blocking): a watchdog
        outside the worker kills its processes once the deadline passes unrenewed.

        Raises:
            SandboxError: its cgroups are not visible from this host (the engine runs
                elsewhere, or without a cgroup per container), or no watchdog started.
        """
        deadline = self._spec.lease_deadline
        if deadline is None:
            return
        pid = self.backend.engine.init_pid(container)
        try:
            found = cgroups.of_process(pid) if pid > 0 else ()
        except OSError:
            found = ()
        if not found:
            raise SandboxError(
                "cannot bound the container by the job's lease: its cgroups are not "
                "visible from this host",
                container=container,
                pid=pid,
            )
        self.backend.watchdogs.start(self._sandbox_id, deadline, found)

    def _next_name(self) -> str:
        name = f"{self._sandbox_id}-{self._count}"
        self._count += 1
        return name

    async def _next_container(self) -> str:
        return await self.backend.engine.create_container(
            self._spec, self.plan, self.labels, self._next_name(), self._masks
        )


class DockerBackend:
    """``SandboxBackend`` on a Docker-API engine; ``list``/``destroy`` work from any
    process that reaches the same engine."""

    name = BACKEND_NAME
    capabilities = Capabilities(runs_host_usr=False, warm_slots=True)

    def __init__(
        self,
        config: DockerConfig,
        *,
        engine_config: EngineConfig | None = None,
        client: docker.DockerClient | None = None,
        build_missing: bool = True,
        lease_dir: Path = DEFAULT_LEASE_DIR,
    ) -> None:
        """``engine_config``: the engine and image settings (default: ``config.engine()``).

        ``build_missing``: build a pack image that the engine lacks (else refuse).

        ``lease_dir``: where the lease watchdogs' deadline files are (shared with the
        reaper of this host, whose ``destroy`` ends them).
        """
        self.config = config
        self.engine = ContainerEngine(engine_config or config.engine(), client=client)
        self._proxies = ProxyRegistry()
        self.build_missing = build_missing
        self.watchdogs = Watchdogs(lease_dir)

    @property
    def engine_config(self) -> EngineConfig:
        return self.engine.config

    @property
    def client(self) -> docker.DockerClient:
        return self.engine.client

    def stage_owner(self) -> tuple[int, int]:
        return self.config.host_owner()

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        """Resolve the image (building the pack image if missing) and pre-create the
        first container.

        Raises:
            ImageMismatch: the engine's image contradicts its pin.
            SandboxError: the engine is unavailable, the base image is not built, or the
                spec asks for something this backend cannot do.
        """
        _check_spec(spec)
        plan = await asyncio.to_thread(self._plan, spec)
        await asyncio.to_thread(own_workspace, spec.workspace)
        for state in spec.state_mounts:
            await asyncio.to_thread(own_workspace, state.source)
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        labels = sandbox_labels(spec, self.config.worker_id, sandbox_id)
        workspace = spec.workspace.resolve()
        masks = mask_plan(workspace) if spec.mask_config else []
        made = await asyncio.to_thread(ensure_mask_points, workspace, masks)
        labels[LABEL_MASK_POINTS] = json.dumps(made)
        labels[LABEL_WORKSPACE] = str(workspace)
        try:
            if spec.network == "allowlist":
                owner = (SANDBOX_UID, SANDBOX_GID)
                labels[LABEL_PROXY_DIR] = str(await self._proxies.start(sandbox_id, spec, owner))
            first = await self.engine.create_container(spec, plan, labels, sandbox_id, masks)
        except BaseException:
            await asyncio.to_thread(mountpoints.remove, workspace, made)
            await self._close_proxy(sandbox_id, labels)
            raise
        return DockerSandbox(
            self,
            sandbox_id=sandbox_id,
            spec=spec,
            plan=plan,
            labels=labels,
            first_container=first,
            masks=masks,
        )

    def _plan(self, spec: SandboxSpec) -> ImagePlan:
        images = self.engine.images
        closure_digest = self._cached_closure_digest(spec.pack_closure)
        if closure_digest is None:
            return ImagePlan(images.base_id(), None, spec.pack_closure)
        identity = ImageIdentity(images.base_id(), closure_digest)
        pin = images.resolve(identity)
        if pin is None:
            if not self.build_missing:
                raise SandboxError(
                    "no pack image for this closure: run `acp-worker image build PACK`",
                    identity=identity.digest,
                )
            pin = images.build(spec.pack_closure, identity)
        return ImagePlan(pin.image_id, pin, None)

    def _cached_closure_digest(self, closure: Path) -> str | None:
        """``sha256:<hex>`` when ``closure`` is a closure of the pack cache."""
        closures = (self.config.cache_dir / "closures").resolve()
        resolved = closure.resolve()
        if resolved.parent != closures or not re.fullmatch(r"[0-9a-f]{64}", resolved.name):
            return None
        return f"sha256:{resolved.name}"

    async def assign(
        self,
        sandbox: Sandbox,
        *,
        labels: Mapping[str, str],
        lease_deadline: LeaseDeadline | None,
        deadline_s: int | None = None,
    ) -> None:
        """A warm slot's sandbox made the attempt's: a container of it created with the
        attempt's labels, which ``list`` reports from now on (from any process that
        reaches the engine), and its running containers bounded by the attempt's lease.
        ``deadline_s`` is not enforced, as ``create`` does not enforce a spec's.
        """
        assert isinstance(sandbox, DockerSandbox)
        del deadline_s
        full = {LABEL_WORKER: self.config.worker_id, **labels}
        await asyncio.to_thread(sandbox.assign, full, lease_deadline)

    async def fill(self, sandbox: Sandbox, staged: Path) -> Path:
        """The staged copy, given to the sandbox user as ``create`` gives a workspace,
        moved into the host directory every container binds at ``/workspace``
        (``hostfill``: in place, the mask mount points kept)."""
        assert isinstance(sandbox, DockerSandbox)
        workspace = sandbox.spec.workspace.resolve()

        def move() -> None:
            own_workspace(staged)
            hostfill.move_into(staged, workspace)

        await asyncio.to_thread(move)
        return workspace

    async def destroy(self, sandbox_id: str) -> None:
        """Force-remove every container of the sandbox (kills what runs); idempotent.

        Raises:
            SandboxError: the engine failed to remove a container.
        """
        check_id(sandbox_id, backend=BACKEND_NAME)
        started = self.engine.take_started(sandbox_id)
        if started is not None:
            started.sock.close()
        found = await asyncio.to_thread(self.engine.kill_all, sandbox_id)
        self.watchdogs.stop(sandbox_id)
        # Mount points and the proxy go while the containers (and their labels) still
        # exist: a destroy that dies here is finished by the next one.
        for labels in [c.get("Labels") or {} for c in found] or [{}]:
            await asyncio.to_thread(remove_mask_points, labels)
            await self._close_proxy(sandbox_id, labels)
        await asyncio.to_thread(self.engine.remove_all, found)

    async def _close_proxy(self, sandbox_id: str, labels: Mapping[str, str]) -> None:
        await self._proxies.close(sandbox_id)
        if labels.get(LABEL_PROXY_DIR):
            netpolicy.remove_dir(Path(labels[LABEL_PROXY_DIR]))

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Sandboxes whose labels include all of ``labels`` (one per sandbox id)."""

        return await asyncio.to_thread(lambda: list_sandboxes(self.engine.client.api, labels))

    async def status(self, sandbox_id: str) -> dict[str, object] | None:
        """Per-container state of a sandbox (running, exit status, OOM as inferred)."""
        check_id(sandbox_id, backend=BACKEND_NAME)
        return await asyncio.to_thread(lambda: sandbox_status(self.engine.client.api, sandbox_id))


def _check_spec(spec: SandboxSpec) -> None:
    check_spec(spec, python=None)  # the base image has the launcher's python3
    extras = [m.source for m in spec.extra_mounts] + [m.source for m in spec.state_mounts]
    for path in (spec.workspace, spec.pack_closure, *extras):
        if ":" in str(path) or "," in str(path):
            # A bind is "source:target:options" on the Docker API.
            raise SandboxError("a bind source path contains ':' or ','", path=str(path))
