"""The docker backend: one container per spawn, on any Docker-API engine (Docker, Podman).

``create`` picks the image and pre-creates the sandbox's first container (not started):

- a closure from the pack cache (``<cache_dir>/closures/<digest>``, verified by the
  runner just before) runs from its *pack image* — reused by identity, built when
  missing (``worker.images``) — which holds the closure at ``PACK_ROOT``;
- any other closure directory (tests, development) is bind-mounted read-only at
  ``PACK_ROOT`` over the base image.

``spawn`` attaches to the container's stdin/stdout/stderr *before* starting it (no
output is lost), checks the image against its pin (``image_mismatch`` otherwise),
starts it and sends the launch header — argv, cwd and the complete environment — over
stdin to a tiny launcher that ``execve``\\ s the program. The environment therefore never
enters the container's configuration (``docker inspect`` shows no credentials).
stdout/stderr arrive multiplexed in 8-byte-framed chunks and are split here.

Every container: user 1000:1000, read-only root filesystem, tmpfs HOME and /tmp, the
workspace bind-mounted read-write, ``extra_mounts`` read-only, ``state_mounts`` read-write
over the HOME tmpfs (each missing parent below HOME gets its own tmpfs owned by the
sandbox user, as the engine would make it root-owned), ``cap_drop=ALL``,
``no-new-privileges``, the engine's default seccomp profile, pids /
memory (no swap) / CPU limits, network ``none``, an init process (so SIGTERM reaches the
program with its default action), no log driver (output is not kept on disk), and the
labels job, attempt, token, worker plus ``acpw.sandbox`` (the sandbox id), so
``list``/``destroy`` work from any process. Podman's ``OOMKilled`` is unreliable: an
exit status 137 that this backend did not cause is reported as an OOM kill.

Agent config paths (``worker.admission.mask_plan``) are masked as in the local backend:
the ``.cursor``/``.claude`` directories bound onto themselves (a mount point cannot be
renamed or removed: EBUSY; ``.codex`` is masked whole, as an empty read-only directory),
``/dev/null`` bound read-only over each config file (with ``nodev`` on Podman, so every
open fails; Docker's bind options have no ``nodev``, so there the device opens, reads
empty and swallows writes — never a regular file), and a
read-only empty tmpfs over each plugin directory. Missing mount points are made in the
host workspace before the first container (``mountpoints``), and what was made is
recorded in the container labels ``acpw.mask_points``/``acpw.workspace`` so ``destroy``
from any process removes exactly those, after the containers are dead.

Right before launch the runner calls ``admission_view``: it starts the next container
ahead of its spawn (the launcher waits for the header) and runs the admission check in
that container's mount view, ``/proc/<init pid>/root`` (``worker.sandbox.view``; the
engine must run on this host). The spawn then uses that container and its attach socket.

Network ``allowlist`` works as in the local backend (``netpolicy``): the container keeps
network mode ``none`` (loopback only); the job's proxy socket and the forwarder script
are bound read-only at ``/run/acpw``, the launch header runs the program behind the
forwarder with the proxy variables added, and ``destroy`` closes the proxy (in this
process) and removes its directory (label ``acpw.proxy_dir``, from any process).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.admission import AdmissionResult, MaskEntry, MaskKind, mask_plan
from worker.errors import ImageMismatch, SandboxError
from worker.images.build import PackImages
from worker.images.engine import EngineConfig, connect, translate
from worker.images.identity import ImageIdentity, PinnedImage
from worker.network import (
    FORWARDER_SOURCE,
    SANDBOX_FORWARDER,
    SANDBOX_SOCKET,
    AllowlistProxy,
    forwarder_argv,
    proxy_env,
)
from worker.sandbox import mountpoints, netpolicy
from worker.sandbox.base import (
    HOME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_WORKER,
    PACK_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    Capabilities,
    SandboxInfo,
    SandboxSpec,
    home_relative,
)
from worker.sandbox.owner import sandbox_owner
from worker.sandbox.view import container_admission

if TYPE_CHECKING:
    import docker

    from worker.settings import Settings

LABEL_SANDBOX = "acpw.sandbox"
LABEL_BACKEND = "acpw.backend"
#: JSON list of the mask mount points ``create`` made (workspace-relative) and the host
#: workspace they are in: what ``destroy`` removes, from any process.
LABEL_MASK_POINTS = "acpw.mask_points"
LABEL_WORKSPACE = "acpw.workspace"
#: The host directory of the network proxy's socket (``allowlist`` only).
LABEL_PROXY_DIR = "acpw.proxy_dir"
_INTERNAL_LABELS = frozenset({LABEL_MASK_POINTS, LABEL_WORKSPACE, LABEL_PROXY_DIR})
DEV_NULL = "/dev/null"
HOSTNAME = "acpw"
SANDBOX_TMP = "/tmp"  # noqa: S108 - the container's private tmpfs
TMPFS_BYTES = 256 * 1024 * 1024
STDOUT, STDERR = 1, 2
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_ID_VALID = re.compile(r"^acpw-[A-Za-z0-9_-]{1,120}$")
# Labels a container inherits from its image; not part of what the sandbox was given.
_IMAGE_LABEL_PREFIXES = ("acpw.image.", "acpw.base.", "acpw.pack.", "io.buildah.", "org.")
# Reads "<10-digit length><JSON>" from fd 0 byte-exactly (the rest of stdin stays for
# the program), then execs argv with exactly the given environment.
LAUNCHER = (
    "import os,json,sys\n"
    "def rd(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: os._exit(125)\n"
    "  b+=c\n"
    " return b\n"
    "m=json.loads(rd(int(rd(10))))\n"
    "os.chdir(m['cwd'])\n"
    "try: os.execvpe(m['argv'][0],m['argv'],m['env'])\n"
    "except OSError as e:\n"
    " sys.stderr.write('acpw: cannot exec %s: %s\\n'%(m['argv'][0],e)); os._exit(127)\n"
)
LAUNCHER_ARGV = ("/usr/bin/python3", "-I", "-S", "-c", LAUNCHER)


def make_sandbox_id(job_id: str, attempt: int) -> str:
    """``acpw-<job>-<attempt>-<random>``, safe as a container name."""
    job = _ID_UNSAFE.sub("-", job_id).strip("-")[:64] or "job"
    return f"acpw-{job}-{attempt}-{secrets.token_hex(4)}"


def _check_id(sandbox_id: str) -> None:
    if not _ID_VALID.match(sandbox_id):
        raise SandboxError("not a docker sandbox id", sandbox_id=sandbox_id)


def sandbox_labels(spec: SandboxSpec, worker_id: str, sandbox_id: str) -> dict[str, str]:
    """The spec's labels plus job, attempt, worker, sandbox id and backend."""
    labels = {LABEL_WORKER: worker_id, **spec.labels}
    labels[LABEL_JOB] = spec.job_id
    labels[LABEL_ATTEMPT] = str(spec.attempt)
    labels[LABEL_SANDBOX] = sandbox_id
    labels[LABEL_BACKEND] = "docker"
    return labels


def launch_header(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> bytes:
    """What the launcher reads from stdin before exec."""
    body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
    return b"%010d" % len(body) + body


def exit_status(status: int) -> int:
    """A container exit status as asyncio reports a process's: 128+N → -N (signal N)."""
    if 128 < status < 128 + signal.NSIG:
        return -(status - 128)
    return status


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """The image a sandbox runs and whether the closure is bound from the host."""

    image_id: str
    pin: PinnedImage | None  # None: the base image with the closure bind-mounted
    bind_closure: Path | None


@dataclass(frozen=True, slots=True)
class Started:
    """A container started ahead of its spawn (``DockerBackend.prestart``)."""

    container: str
    sock: socket.socket
    pid: int  # its init's pid on this host (0 if the engine did not say)


def _container_config(
    api: Any,
    spec: SandboxSpec,
    plan: ImagePlan,
    labels: Mapping[str, str],
    *,
    podman: bool,
    masks: Sequence[MaskEntry] = (),
) -> dict[str, Any]:
    """The create request body (pure apart from the SDK's helpers)."""
    home = {**_tmpfs(podman=podman), **_state_tmpfs(spec, podman=podman)}
    host_config = api.create_host_config(
        binds=_binds(spec, plan)
        + _mask_binds(spec.workspace.resolve(), masks, podman=podman)
        + _network_binds(labels),
        tmpfs={**home, **_mask_tmpfs(masks, podman=podman)},
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=spec.limits.pids,
        mem_limit=spec.limits.memory_bytes,
        memswap_limit=spec.limits.memory_bytes,
        nano_cpus=int(spec.limits.cpus * 1e9),
        network_mode="none",
        init=True,
        log_config={"Type": "none", "Config": {}},
        ipc_mode="private",
    )
    config: dict[str, Any] = api.create_container_config(
        plan.image_id,
        command=list(LAUNCHER_ARGV),
        user=f"{SANDBOX_UID}:{SANDBOX_GID}",
        stdin_open=True,
        tty=False,
        working_dir=WORKSPACE,
        hostname=HOSTNAME,
        labels=dict(labels),
        host_config=host_config,
        network_disabled=True,
    )
    config["StdinOnce"] = True  # closing our stdin closes the program's (Docker)
    config["Env"] = []
    return config


def _binds(spec: SandboxSpec, plan: ImagePlan) -> list[str]:
    # A list, not the SDK's dict keyed by source: /dev/null is the source of several masks.
    binds = [f"{spec.workspace}:{WORKSPACE}:rw"]
    if plan.bind_closure is not None:
        binds.append(f"{plan.bind_closure}:{PACK_ROOT}:ro")
    binds += [f"{m.source}:{m.target}:ro" for m in spec.extra_mounts]
    binds += [f"{m.source}:{m.target}:rw" for m in spec.state_mounts]
    return binds


def _network_binds(labels: Mapping[str, str]) -> list[str]:
    proxy_dir = labels.get(LABEL_PROXY_DIR)
    if not proxy_dir:
        return []
    # Read-only binds: connect() on a socket is not a write to its filesystem.
    return [
        f"{Path(proxy_dir) / netpolicy.SOCKET_NAME}:{SANDBOX_SOCKET}:ro",
        f"{FORWARDER_SOURCE}:{SANDBOX_FORWARDER}:ro",
    ]


def _mask_binds(workspace: Path, masks: Sequence[MaskEntry], *, podman: bool) -> list[str]:
    # The engine orders mounts by destination depth, so an anchor precedes its masks.
    file_mode = "ro,nodev" if podman else "ro"
    binds: list[str] = []
    for entry in masks:
        dest = f"{WORKSPACE}/{entry.path}"
        if entry.kind is MaskKind.ANCHOR:
            binds.append(f"{workspace / entry.path}:{dest}:rw")
        elif entry.kind is MaskKind.FILE:
            binds.append(f"{DEV_NULL}:{dest}:{file_mode}")
    return binds


def _mask_tmpfs(masks: Sequence[MaskEntry], *, podman: bool) -> dict[str, str]:
    # An empty read-only tmpfs: no host directory to keep empty, nothing to write into.
    # Podman copies what the directory holds into a new tmpfs unless told not to.
    opts = "ro,nosuid,nodev,noexec,size=4k,mode=0555" + (",notmpcopyup" if podman else "")
    return {f"{WORKSPACE}/{e.path}": opts for e in masks if e.kind is MaskKind.DIR}


def _tmpfs(*, podman: bool) -> dict[str, str]:
    # Podman refuses uid=/gid= tmpfs options; its `U` chowns the tmpfs to the user.
    owner = "U" if podman else f"uid={SANDBOX_UID},gid={SANDBOX_GID}"
    common = f"rw,nosuid,nodev,size={TMPFS_BYTES}"
    return {SANDBOX_TMP: f"{common},mode=1777", HOME: f"{common},mode=0700,{owner}"}


def _state_tmpfs(spec: SandboxSpec, *, podman: bool) -> dict[str, str]:
    """A user-owned tmpfs on each parent between HOME and a writable mount: the engine
    would make a missing mount point's parents root-owned, and the agent could not write
    its own config dir (``~/.cursor`` above ``~/.cursor/acp-sessions``)."""
    home = _tmpfs(podman=podman)[HOME]
    parents: dict[str, str] = {}
    for mount in spec.state_mounts:
        parts = home_relative(mount.target).split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parents[f"{HOME}/{'/'.join(parts[:depth])}"] = home
    return parents


class _StdinWriter(asyncio.StreamWriter):
    """stdin over the attach connection: ``close`` half-closes it (EOF to the program).

    stdout and stderr keep arriving on the same connection after the EOF.
    """

    def close(self) -> None:
        transport = self.transport
        if not transport.is_closing() and transport.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
        self._acpw_eof = True

    def is_closing(self) -> bool:
        return getattr(self, "_acpw_eof", False) or self.transport.is_closing()

    async def wait_closed(self) -> None:
        return None


async def _demultiplex(
    raw: asyncio.StreamReader, out: asyncio.StreamReader, err: asyncio.StreamReader
) -> None:
    """Split the engine's framed stream: 8-byte header (stream, 0,0,0, big-endian size)."""
    try:
        while True:
            header = await raw.readexactly(8)
            stream, size = struct.unpack(">BxxxL", header)
            data = await raw.readexactly(size)
            (err if stream == STDERR else out).feed_data(data)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        out.feed_eof()
        err.feed_eof()


class DockerProcess:
    """A started container's program. ``pid`` is the container init's host pid (0 if
    the engine does not say); signals go to the container (the init forwards them)."""

    def __init__(
        self,
        sandbox: DockerSandbox,
        container_id: str,
        *,
        stdin: _StdinWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        pump: asyncio.Task[None],
        pid: int,
    ) -> None:
        self._sandbox = sandbox
        self.container_id = container_id
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr
        self._pump = pump
        self._pid = pid
        self._returncode: int | None = None
        self._status: int | None = None
        self._waiter: asyncio.Task[int] = asyncio.create_task(self._watch())
        self._signals: set[asyncio.Future[None]] = set()
        self.signalled = False

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdin(self) -> asyncio.StreamWriter:
        return self._stdin

    @property
    def stdout(self) -> asyncio.StreamReader:
        return self._stdout

    @property
    def stderr(self) -> asyncio.StreamReader:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def oom_killed(self) -> bool:
        """Exit 137 that no terminate/kill/destroy of ours explains (Podman's
        ``OOMKilled`` flag is unreliable)."""
        return self._status == 137 and not self.signalled

    async def wait(self) -> int:
        return await asyncio.shield(self._waiter)

    async def _watch(self) -> int:
        # The attach stream ends when the container's last process exits.
        await asyncio.shield(self._pump)
        status = await self._sandbox.backend.wait_container(self.container_id)
        self._stdin.transport.close()
        self._status = status
        self._returncode = exit_status(status)
        return self._returncode

    def terminate(self) -> None:
        """SIGTERM to the program (the container's init forwards it); idempotent."""
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the container: every process in it dies; idempotent."""
        self._send(signal.SIGKILL)

    def _send(self, sig: signal.Signals) -> None:
        if self._returncode is not None:
            return
        self.signalled = True
        future = asyncio.ensure_future(self._sandbox.backend.signal(self.container_id, sig))
        self._signals.add(future)
        future.add_done_callback(self._signals.discard)


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
        _check_command(argv, env, cwd)
        if self._spec.network == "allowlist":
            argv, env = forwarder_argv(tuple(argv)), {**env, **proxy_env()}
        started = self.backend.take_started(self._sandbox_id)
        if started is None:
            container = self._pending or await self._next_container()
            self._pending = None
        else:
            container = started.container
        process = await self.backend.start(
            self, container, launch_header(argv, env, cwd), stdout_limit,
            sock=None if started is None else started.sock,
        )  # fmt: skip
        self.processes.append(process)
        return process

    def admission_view(self, *, provider: str = "cursor") -> AdmissionResult:
        """The admission check in this sandbox's own mount view, right before launch.

        Starts the container the next ``spawn`` runs in (its launcher then waits for the
        launch header on stdin, so nothing of the agent runs yet) and checks ``/workspace``
        as that container sees it, through ``/proc/<its init pid>/root``: the binds and
        masks as mounted, the image's system locations, links resolved inside it (see
        ``worker.sandbox.view``). Blocking: call it from a thread.

        Raises:
            ImageMismatch: the container's image is not the pinned one.
            SandboxError: the container did not start, or its view is not visible from
                this host (the engine runs elsewhere).
            WorkspaceUnavailable: the view has no workspace.
        """
        started = self.backend.started(self._sandbox_id)
        if started is None:
            container = self._pending or self.backend.create_container_now(
                self._spec, self.plan, self.labels, self._next_name(), self._masks
            )
            self._pending = None
            started = self.backend.prestart(self._sandbox_id, container, self.plan)
        return container_admission(
            started.pid, host_workspace=self._spec.workspace.resolve(), masks=self._masks,
            provider=provider,
        )  # fmt: skip

    def _next_name(self) -> str:
        name = f"{self._sandbox_id}-{self._count}"
        self._count += 1
        return name

    async def _next_container(self) -> str:
        return await self.backend.create_container(
            self._spec, self.plan, self.labels, self._next_name(), self._masks
        )


def _check_command(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
    if not argv or not cwd.startswith("/"):
        raise SandboxError("spawn needs an argv and an absolute cwd", cwd=cwd)
    if any("\0" in a for a in argv) or any(not k or "=" in k or "\0" in k for k in env):
        raise SandboxError("spawn refused a NUL byte in argv or a malformed env name")


class DockerBackend:
    """``SandboxBackend`` on a Docker-API engine; ``list``/``destroy`` work from any
    process that reaches the same engine."""

    name = "docker"
    capabilities = Capabilities(shares_host_workspace=False)

    def __init__(
        self,
        settings: Settings,
        *,
        config: EngineConfig | None = None,
        client: docker.DockerClient | None = None,
        build_missing: bool = True,
    ) -> None:
        """``build_missing``: build a pack image that the engine lacks (else refuse)."""
        self._settings = settings
        self.config = config or EngineConfig.from_settings(settings)
        self._client = client
        self._images: PackImages | None = None
        self._podman: bool | None = None
        self._proxies: dict[str, AllowlistProxy] = {}
        self._started: dict[str, Started] = {}
        self.build_missing = build_missing

    def stage_owner(self) -> tuple[int, int]:
        return sandbox_owner(self._settings)

    # --- engine -------------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect(self.config)
        return self._client

    @property
    def images(self) -> PackImages:
        if self._images is None:
            self._images = PackImages(self.client, self.config)
        return self._images

    def _is_podman(self) -> bool:
        if self._podman is None:
            with translate("version"):
                components = self.client.version().get("Components") or []
            self._podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        return self._podman

    # --- create -------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        """Resolve the image (building the pack image if missing) and pre-create the
        first container.

        Raises:
            ImageMismatch: the engine's image contradicts its pin.
            SandboxError: the engine is unavailable, the base image is not built, or the
                spec asks for something this backend cannot do.
        """
        self._check_spec(spec)
        plan = await asyncio.to_thread(self._plan, spec)
        await asyncio.to_thread(_own_workspace, spec.workspace)
        for state in spec.state_mounts:
            await asyncio.to_thread(_own_workspace, state.source)
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        labels = sandbox_labels(spec, self._settings.worker_id, sandbox_id)
        workspace = spec.workspace.resolve()
        masks = mask_plan(workspace) if spec.mask_config else []
        made = await asyncio.to_thread(_ensure_mask_points, workspace, masks)
        labels[LABEL_MASK_POINTS] = json.dumps(made)
        labels[LABEL_WORKSPACE] = str(workspace)
        try:
            if spec.network == "allowlist":
                proxy = await netpolicy.start_proxy(spec, (SANDBOX_UID, SANDBOX_GID))
                self._proxies[sandbox_id] = proxy
                labels[LABEL_PROXY_DIR] = str(proxy.socket_path.parent)
            first = await self.create_container(spec, plan, labels, sandbox_id, masks)
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
        closure_digest = self._cached_closure_digest(spec.pack_closure)
        if closure_digest is None:
            base = self.images.base_id()
            return ImagePlan(base, None, spec.pack_closure)
        identity = ImageIdentity(self.images.base_id(), closure_digest)
        pin = self.images.resolve(identity)
        if pin is None:
            if not self.build_missing:
                raise SandboxError(
                    "no pack image for this closure: run `acp-worker image build PACK`",
                    identity=identity.digest,
                )
            pin = self.images.build(spec.pack_closure, identity)
        return ImagePlan(pin.image_id, pin, None)

    def _cached_closure_digest(self, closure: Path) -> str | None:
        """``sha256:<hex>`` when ``closure`` is a closure of the pack cache."""
        closures = (self._settings.cache_dir / "closures").resolve()
        resolved = closure.resolve()
        if resolved.parent != closures or not re.fullmatch(r"[0-9a-f]{64}", resolved.name):
            return None
        return f"sha256:{resolved.name}"

    @staticmethod
    def _check_spec(spec: SandboxSpec) -> None:
        netpolicy.check(spec, python=None)  # the base image has the launcher's python3
        for what, path in (("workspace", spec.workspace), ("pack_closure", spec.pack_closure)):
            if not path.is_dir():
                raise SandboxError(f"{what} is not a directory", **{what: str(path)})
        for mount in spec.extra_mounts:
            if not mount.source.exists() or not mount.target.startswith("/"):
                raise SandboxError("bad extra mount", source=str(mount.source))
        for state in spec.state_mounts:
            home_relative(state.target)
            if not state.source.is_dir() or state.source.is_symlink():
                raise SandboxError("a writable mount is not a directory", source=str(state.source))
        extras = [m.source for m in spec.extra_mounts] + [m.source for m in spec.state_mounts]
        sources = (spec.workspace, spec.pack_closure, *extras)
        for path in sources:
            if ":" in str(path) or "," in str(path):
                # A bind is "source:target:options" on the Docker API.
                raise SandboxError("a bind source path contains ':' or ','", path=str(path))

    async def create_container(
        self,
        spec: SandboxSpec,
        plan: ImagePlan,
        labels: Mapping[str, str],
        name: str,
        masks: Sequence[MaskEntry] = (),
    ) -> str:
        """Create (not start) one container of the sandbox; returns its id."""
        return await asyncio.to_thread(self.create_container_now, spec, plan, labels, name, masks)

    def create_container_now(
        self,
        spec: SandboxSpec,
        plan: ImagePlan,
        labels: Mapping[str, str],
        name: str,
        masks: Sequence[MaskEntry],
    ) -> str:
        """``create_container``, blocking."""
        api: Any = self.client.api
        podman = self._is_podman()
        config = _container_config(api, spec, plan, labels, podman=podman, masks=masks)
        with translate("create container", sandbox_id=labels.get(LABEL_SANDBOX)):
            created = api.create_container_from_config(config, name=name)
        return str(created["Id"])

    # --- start --------------------------------------------------------------------------

    async def start(
        self,
        sandbox: DockerSandbox,
        container: str,
        header: bytes,
        stdout_limit: int,
        *,
        sock: socket.socket | None = None,
    ) -> DockerProcess:
        """Check the image, attach, start, send the launch header (``sock``: the attach
        socket of a container ``prestart`` already started)."""
        if sock is None:
            sock = await asyncio.to_thread(self._attach_and_start, container, sandbox.plan)
        loop = asyncio.get_running_loop()
        raw = asyncio.StreamReader(limit=2**20)
        transport, protocol = await loop.create_connection(
            lambda: asyncio.StreamReaderProtocol(raw), sock=sock
        )
        stdin = _StdinWriter(transport, protocol, raw, loop)
        stdout = asyncio.StreamReader(limit=stdout_limit)
        stderr = asyncio.StreamReader(limit=stdout_limit)
        pump = asyncio.create_task(_demultiplex(raw, stdout, stderr))
        stdin.write(header)
        process = DockerProcess(
            sandbox, container, stdin=stdin, stdout=stdout, stderr=stderr, pump=pump, pid=0
        )
        await stdin.drain()
        return process

    def _attach_and_start(self, container: str, plan: ImagePlan) -> socket.socket:
        api = self.client.api
        with translate("start container", container=container):
            self._check_image(container, plan)
            response_sock = api.attach_socket(
                container, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            raw = getattr(response_sock, "_sock", response_sock)
            # Our own descriptor for asyncio; the SDK's response object is closed.
            sock = socket.socket(fileno=os.dup(raw.fileno()))
            response_sock.close()
            raw.close()
            try:
                api.start(container)
            except BaseException:
                sock.close()
                raise
        return sock

    def prestart(self, sandbox_id: str, container: str, plan: ImagePlan) -> Started:
        """Check the image, attach and start ``container`` (blocking); its launcher waits
        for the header that the sandbox's next ``spawn`` sends, on this attach socket.

        Raises:
            ImageMismatch: the container's image is not the pinned one.
            SandboxError: the engine could not attach, start or inspect it.
        """
        sock = self._attach_and_start(container, plan)
        try:
            with translate("inspect container", container=container):
                state = self.client.api.inspect_container(container)["State"]
        except BaseException:
            sock.close()
            raise
        started = Started(container, sock, int(state.get("Pid") or 0))
        self._started[sandbox_id] = started
        return started

    def started(self, sandbox_id: str) -> Started | None:
        """The container ``prestart`` started and no spawn has used yet."""
        return self._started.get(sandbox_id)

    def take_started(self, sandbox_id: str) -> Started | None:
        return self._started.pop(sandbox_id, None)

    def _check_image(self, container: str, plan: ImagePlan) -> None:
        image = str(self.client.api.inspect_container(container)["Image"])
        if not image.startswith("sha256:"):
            image = f"sha256:{image}"
        if image != plan.image_id:
            raise ImageMismatch(
                "the container's image is not the pinned one",
                container=container,
                expected=plan.image_id,
                actual=image,
            )
        if plan.pin is not None:
            self.images.check(plan.pin)

    # --- signals, wait ------------------------------------------------------------------

    async def signal(self, container: str, sig: signal.Signals) -> None:
        """Send ``sig`` to a container; a container that already stopped is fine."""
        import docker.errors

        def send() -> None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self.client.api.kill(container, signal=int(sig))

        await asyncio.to_thread(send)

    async def wait_container(self, container: str) -> int:
        """The container's exit status; -SIGKILL-equivalent 137 when it was removed."""
        import docker.errors

        def wait() -> int:
            try:
                return int(self.client.api.wait(container)["StatusCode"])
            except docker.errors.NotFound:
                return 128 + signal.SIGKILL  # destroyed (force-removed) while running

        with translate("wait container", container=container):
            return await asyncio.to_thread(wait)

    # --- destroy, list ------------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> None:
        """Force-remove every container of the sandbox (kills what runs); idempotent.

        Raises:
            SandboxError: the engine failed to remove a container.
        """
        _check_id(sandbox_id)
        started = self._started.pop(sandbox_id, None)
        if started is not None:
            started.sock.close()
        found = await asyncio.to_thread(self._kill_all, sandbox_id)
        # Mount points and the proxy go while the containers (and their labels) still
        # exist: a destroy that dies here is finished by the next one.
        for labels in [c.get("Labels") or {} for c in found] or [{}]:
            await asyncio.to_thread(_remove_mask_points, labels)
            await self._close_proxy(sandbox_id, labels)
        await asyncio.to_thread(self._remove_all, found)

    def network_proxy(self, sandbox_id: str) -> AllowlistProxy | None:
        """This process's proxy of a sandbox with network ``allowlist`` (else None)."""
        return self._proxies.get(sandbox_id)

    async def _close_proxy(self, sandbox_id: str, labels: Mapping[str, str]) -> None:
        proxy = self._proxies.pop(sandbox_id, None)
        if proxy is not None:
            await proxy.close()
        if labels.get(LABEL_PROXY_DIR):
            netpolicy.remove_dir(Path(labels[LABEL_PROXY_DIR]))

    def _kill_all(self, sandbox_id: str) -> builtins.list[dict[str, Any]]:
        api = self.client.api
        with translate("destroy", sandbox_id=sandbox_id):
            found: builtins.list[dict[str, Any]] = api.containers(
                all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
            )
            for container in found:
                if container.get("State") == "running":
                    self._kill(container["Id"])
        return found

    def _remove_all(self, found: builtins.list[dict[str, Any]]) -> None:
        with translate("destroy"):
            for container in found:
                self._remove(container["Id"])

    def _kill(self, container: str) -> None:
        import docker.errors

        # SIGKILL first and wait for the exit: a forced removal alone stops the
        # container with SIGTERM, which the program could answer with a clean exit 0.
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.kill(container, signal=int(signal.SIGKILL))
            self.client.api.wait(container, timeout=30)

    def _remove(self, container: str) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_container(container, force=True, v=True)

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Sandboxes whose labels include all of ``labels`` (one per sandbox id)."""
        return await asyncio.to_thread(self._list, dict(labels))

    def _list(self, labels: dict[str, str]) -> builtins.list[SandboxInfo]:
        wanted = {**labels, LABEL_BACKEND: "docker"}
        filters = {"label": [f"{k}={v}" for k, v in wanted.items()]}
        with translate("list"):
            found = self.client.api.containers(all=True, filters=filters)
        infos: dict[str, SandboxInfo] = {}
        for container in found:
            have = {str(k): str(v) for k, v in (container.get("Labels") or {}).items()}
            sandbox_id = have.get(LABEL_SANDBOX)
            # Filters are re-checked: an engine may match label filters loosely.
            if sandbox_id and wanted.items() <= have.items() and sandbox_id not in infos:
                infos[sandbox_id] = SandboxInfo(sandbox_id, self.name, _own_labels(have))
        return sorted(infos.values(), key=lambda i: i.sandbox_id)

    async def status(self, sandbox_id: str) -> dict[str, Any] | None:
        """Per-container state of a sandbox (running, exit status, OOM as inferred)."""
        _check_id(sandbox_id)
        return await asyncio.to_thread(self._status, sandbox_id)

    def _status(self, sandbox_id: str) -> dict[str, Any] | None:
        api = self.client.api
        with translate("status", sandbox_id=sandbox_id):
            found = api.containers(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})
            states = [api.inspect_container(c["Id"])["State"] for c in found]
        if not states:
            return None
        return {
            "running": any(s.get("Running") for s in states),
            "exit_codes": [s.get("ExitCode") for s in states],
            "oom_killed": any(s.get("OOMKilled") or s.get("ExitCode") == 137 for s in states),
        }


def _own_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in labels.items()
        if not k.startswith(_IMAGE_LABEL_PREFIXES) and k not in _INTERNAL_LABELS
    }


def _ensure_mask_points(workspace: Path, masks: Sequence[MaskEntry]) -> list[str]:
    """Make the missing mount points, owned by the container user when we may chown.

    Raises:
        SandboxError: a config path is a symlink or the wrong kind, or the workspace
            could not be written.
    """
    owner = (SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else None
    try:
        return mountpoints.ensure(workspace, masks, owner)
    except OSError as exc:
        raise SandboxError(
            f"docker sandbox: mask mount points failed: {exc.strerror or exc}",
            workspace=str(workspace),
            errno=exc.errno,
        ) from exc


def _remove_mask_points(labels: Mapping[str, str]) -> None:
    """Remove the mount points recorded in a container's labels (what create made)."""
    workspace, raw = labels.get(LABEL_WORKSPACE), labels.get(LABEL_MASK_POINTS)
    if not workspace or not raw:
        return
    try:
        made = [str(p) for p in json.loads(raw)]
    except (ValueError, TypeError):
        return  # not ours to interpret: leave the workspace alone
    with contextlib.suppress(OSError):
        mountpoints.remove(Path(workspace), made)


def _own_workspace(workspace: Path) -> None:
    """Give the (private, staged) workspace to the sandbox user, as it runs as 1000.

    A no-op when the runner already staged it with that owner.
    """
    if workspace.stat().st_uid == SANDBOX_UID:
        return
    os.chown(workspace, SANDBOX_UID, SANDBOX_GID)
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_GID)
