"""The sandbox seam: one small async Protocol every backend implements.

A backend *creates* an isolated place for one job (``SandboxSpec``), *spawns* processes
in it with piped stdio, *destroys* it (killing everything inside), and *lists* what it
created by label so a reaper can find orphans without the worker that made them.

Paths inside every sandbox are fixed: the workspace is ``WORKSPACE``, the pack closure
``PACK_ROOT`` (read-only), the private home ``HOME``.
"""

from __future__ import annotations

import asyncio
import math
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from worker.errors import SandboxError

if TYPE_CHECKING:
    from worker.admission.result import AdmissionResult
    from worker.network import DenialHandler
    from worker.sandbox.files import WorkspaceFiles

WORKSPACE = "/workspace"
PACK_ROOT = "/opt/acp-pack"
HOME = "/home/agent"
SANDBOX_UID = 1000
SANDBOX_GID = 1000

LABEL_JOB = "acpw.job"
LABEL_ATTEMPT = "acpw.attempt"
LABEL_TOKEN = "acpw.token"  # noqa: S105 - a label name (the lease token), not a secret
LABEL_WORKER = "acpw.worker"
#: The warm slot a sandbox was made as (``worker.job.warm``), until a job claims it.
LABEL_SLOT = "acpw.slot"


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    memory_bytes: int
    cpus: float
    pids: int


@dataclass(frozen=True, slots=True)
class ReadOnlyMount:
    """An extra host path bound read-only at ``target`` inside the sandbox."""

    source: Path
    target: str


@dataclass(frozen=True, slots=True)
class WritableMount:
    """A host directory bound read-write at ``target``, a path strictly below ``HOME``.

    For agent state that must outlive the job (e.g. recorded sessions): it is mounted over
    the private HOME tmpfs, with any missing parents made writable for the sandbox user.
    The backend makes ``source`` owned by the sandbox user; what the agent writes there is
    untrusted.
    """

    source: Path
    target: str


def home_relative(target: str) -> str:
    """``target`` relative to ``HOME`` (``.cursor/acp-sessions``), checked.

    Raises:
        SandboxError: ``target`` is not a plain path strictly below ``HOME`` (no ``..``,
            ``.`` or empty component; no ``:``, ``,`` or control character, which a
            bind string cannot carry).
    """
    prefix = HOME + "/"
    rel = target.removeprefix(prefix) if target.startswith(prefix) else ""
    bad_part = any(p in ("", ".", "..") for p in rel.split("/"))
    bad_char = any(c in ":," or ord(c) < 32 for c in rel)
    if not rel or bad_part or bad_char:
        raise SandboxError(f"a writable mount must be below {HOME}", target=target)
    return rel


class LeaseDeadline:
    """When the job's lease expires unless renewed, as its owner knows it: a
    ``time.monotonic()`` instant (that clock is the host's, so another process can
    compare it), moved on by every renewal.

    A backend that can bound a sandbox by it independently of the worker process (the
    local backend's watchdog) follows it; one that cannot ignores it. A job run
    without a lease has none (``SandboxSpec.lease_deadline`` is ``None``).
    """

    __slots__ = ("_at", "_followers")

    def __init__(self, at: float) -> None:
        self._at = at
        self._followers: list[Callable[[float], None]] = []

    @property
    def at(self) -> float:
        return self._at

    def extend(self, at: float) -> None:
        """The lease was renewed until ``at``: tell every follower (never raises)."""
        self._at = at
        for follower in tuple(self._followers):
            follower(at)

    def follow(self, follower: Callable[[float], None]) -> Callable[[], None]:
        """Call ``follower`` with each new deadline; returns what stops that."""
        self._followers.append(follower)

        def stop() -> None:
            if follower in self._followers:
                self._followers.remove(follower)

        return stop


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What one job's sandbox needs. Backends must honour every field."""

    job_id: str
    attempt: int
    workspace: Path
    pack_closure: Path
    limits: ResourceLimits
    labels: Mapping[str, str]
    #: ``none`` (no route out) or ``allowlist``: the sandbox still has no route out, but a
    #: per-job proxy (``worker.network``) reachable through a Unix socket bound into it
    #: relays HTTP CONNECT to ``network_allow``; every spawn then runs behind the
    #: in-sandbox forwarder and its ``env`` gains ``worker.network.proxy_env()``.
    network: str = "none"
    #: ``host:port`` entries (``worker.network.parse_endpoint``) for ``allowlist``.
    network_allow: Sequence[str] = field(default_factory=tuple)
    #: Entries of ``network_allow`` that may resolve to non-public addresses (an
    #: operator-declared model endpoint, ``worker.network.endpoints``).
    network_private: Sequence[str] = field(default_factory=tuple)
    #: (in-sandbox port, ``host:port``) plain tunnels through the proxy for ``allowlist``
    #: (a plain-HTTP model endpoint); each target is also in ``network_allow``.
    network_tunnels: Sequence[tuple[int, str]] = field(default_factory=tuple)
    #: Awaited for each request the proxy refuses (the runner emits a ``notice``).
    on_network_denial: DenialHandler | None = None
    extra_mounts: Sequence[ReadOnlyMount] = field(default_factory=tuple)
    #: Host directories bound read-write below ``HOME``, over its tmpfs (``home_relative``).
    state_mounts: Sequence[WritableMount] = field(default_factory=tuple)
    #: Mount the agent config paths of :func:`worker.admission.mask_plan` empty and
    #: read-only for the whole run, so config cannot appear or change mid-run.
    mask_config: bool = True
    #: Size bound of each private tmpfs (``/tmp`` and ``HOME``); their pages also count
    #: against ``limits.memory_bytes``.
    tmpfs_bytes: int = 256 * 1024 * 1024
    #: The job's lease deadline (``None``: no lease). A backend that can kills the
    #: sandbox once it passes unrenewed, even while the worker process is frozen.
    lease_deadline: LeaseDeadline | None = None
    #: Seconds after which the sandbox may be stopped whatever happens (the job's
    #: ``limits.timeout_s`` plus ``SANDBOX_DEADLINE_MARGIN_S`` for setup and teardown);
    #: ``None``: no bound. A backend that can have it enforced without the worker (the
    #: kubelet's ``activeDeadlineSeconds``) does.
    deadline_s: int | None = None


#: What a sandbox may live beyond its job's ``timeout_s``: setup before the clock is
#: checked and the teardown after it (change capture, the copy out, uploads).
SANDBOX_DEADLINE_MARGIN_S = 300


def sandbox_deadline(timeout_s: float) -> int:
    """``SandboxSpec.deadline_s`` for a job of ``timeout_s`` seconds."""
    return math.ceil(timeout_s) + SANDBOX_DEADLINE_MARGIN_S


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A sandbox as a backend lists it."""

    sandbox_id: str
    backend: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ExitDiagnosis:
    """Why a sandboxed process ended, as far as its sandbox can tell (``exit_diagnosis``).

    Exactly one of ``exit_code`` and ``signal`` is set once the process has ended; both
    are ``None`` while it runs.
    """

    #: Its exit status, when it exited by itself.
    exit_code: int | None
    #: The name of the signal that ended it (``SIGKILL``), when one did.
    signal: str | None
    #: The kernel's OOM killer ended it: its sandbox ran out of memory.
    oom_killed: bool = False
    #: The sandbox itself ended under it, as its platform says why (a pod evicted, past
    #: its deadline, OOM-killed): that, not the process's end, is what failed the job.
    #: ``None`` when the sandbox was intact or could not tell (every backend whose
    #: sandbox cannot end on its own).
    sandbox_error: SandboxError | None = None

    def details(self) -> dict[str, object]:
        """``{"exit_code": N}`` or ``{"signal": "SIGKILL"}`` (empty while it runs)."""
        if self.signal is not None:
            return {"signal": self.signal}
        return {} if self.exit_code is None else {"exit_code": self.exit_code}


def ended(returncode: int | None, *, oom_killed: bool = False) -> ExitDiagnosis:
    """The diagnosis of a process whose status is ``returncode``, as asyncio reports it
    (``-N``: signal N) or as a sandbox's init reports a child that a signal ended
    (``128 + N``: bubblewrap and a container's init exit so)."""
    if returncode is None:
        return ExitDiagnosis(None, None)
    number = -returncode if returncode < 0 else returncode - 128
    if 0 < number < signal.NSIG:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"SIG{number}"
        return ExitDiagnosis(None, name, oom_killed=oom_killed)
    return ExitDiagnosis(returncode, None, oom_killed=oom_killed)


class SandboxProcess(Protocol):
    """A process running inside a sandbox, with piped stdio."""

    @property
    def pid(self) -> int: ...

    @property
    def stdin(self) -> asyncio.StreamWriter: ...

    @property
    def stdout(self) -> asyncio.StreamReader: ...

    @property
    def stderr(self) -> asyncio.StreamReader: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin_eof(self) -> bool:
        """Closing ``stdin`` reaches the process as EOF. False where the sandbox's stream
        has no half-close (a Kubernetes API server speaking only ``v4.channel.k8s.io``):
        the shutdown then escalates to signals at once."""
        ...

    async def wait(self) -> int: ...

    def terminate(self) -> None:
        """SIGTERM to the whole process group (idempotent)."""

    def kill(self) -> None:
        """SIGKILL to the whole process group (idempotent)."""

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """Why it ended: its exit status or signal, and whether the kernel OOM-killed it.

        Ask once it has ended and before its sandbox is destroyed (the evidence goes
        with the sandbox). Never raises: what cannot be read is not claimed.
        """
        ...


class StdioProcess:
    """The three pipes of a sandboxed process, as every backend's ``SandboxProcess``
    exposes them; subclasses add ``pid``, ``returncode``, ``wait`` and the signals."""

    def __init__(
        self,
        *,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr

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
    def stdin_eof(self) -> bool:
        return True


class SignalledByCall(StdioProcess):
    """A process signalled through a call to its sandbox's service (docker: the engine,
    kubernetes: an exec in the pod): ``terminate``/``kill`` schedule that call, never once
    the process has ended, and remember that we signalled it (``signalled``: its end is
    then ours, not the kernel's or the platform's). Subclasses set ``_returncode`` when it
    ends and say how a signal is delivered (``_deliver``)."""

    def __init__(
        self,
        *,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ) -> None:
        super().__init__(stdin=stdin, stdout=stdout, stderr=stderr)
        self._returncode: int | None = None
        self.signalled = False
        self._signals: set[asyncio.Future[None]] = set()  # held until delivered

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def terminate(self) -> None:
        self._send(signal.SIGTERM)

    def kill(self) -> None:
        self._send(signal.SIGKILL)

    def _send(self, sig: signal.Signals) -> None:
        if self._returncode is not None:
            return
        self.signalled = True
        future = asyncio.ensure_future(self._deliver(sig))
        self._signals.add(future)
        future.add_done_callback(self._signals.discard)

    async def _deliver(self, sig: signal.Signals) -> None:
        raise NotImplementedError


class PipedProcess(StdioProcess):
    """The stdio and exit status of a host subprocess, shared by backends whose
    ``SandboxProcess`` is one (local, fake); each adds its own ``terminate``/``kill``."""

    def __init__(self, proc: asyncio.subprocess.Process, *, what: str) -> None:
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise SandboxError(f"{what} started without pipes", pid=proc.pid)
        super().__init__(stdin=proc.stdin, stdout=proc.stdout, stderr=proc.stderr)
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """Its exit status or signal; no OOM evidence here (a backend with a memory
        bound overrides this)."""
        return ended(self._proc.returncode)


class Sandbox(Protocol):
    """One job's isolated place."""

    @property
    def sandbox_id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> SandboxProcess:
        """Start ``argv`` inside the sandbox with exactly ``env`` (nothing inherited).

        Raises:
            SandboxError: the sandbox could not start the process.
        """
        ...

    def admission_view(self, *, provider: str) -> AdmissionResult | None:
        """Admission again in the sandbox's own mount view, right before launch; ``None``
        when the backend cannot show its view (its masks still guard the whole run).

        Raises:
            SandboxError: the view could not be read.
        """
        ...

    def workspace_files(self) -> WorkspaceFiles | None:
        """``/workspace`` through this backend's own file access, with the containment
        rules of ``worker.sandbox.files`` (the sandbox's masks included); ``None`` when
        the worker cannot reach it (no ``fs/*``; artifacts and links are refused).
        Asked once, right after ``create``; cheap (nothing is contacted yet)."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do that the job's phases ask about, so that nothing outside
    ``worker/sandbox/`` has to name a backend."""

    runs_host_usr: bool
    """The sandbox's ``/usr`` is the host's, bound read-only: a runtime a pack declares
    (``launch.runtime``) is the host's own binary, which the worker checks before a
    launch. A backend with its own image carries its own runtime."""

    warm_slots: bool = False
    """Sandboxes can be made ahead of their job (a warm slot, ``worker.job.warm``): the
    backend is a ``SlotHost`` too. Without it every job takes the cold path."""


class SandboxBackend(Protocol):
    """Creates, destroys and lists sandboxes of one kind."""

    name: str
    capabilities: Capabilities

    def stage_owner(self) -> tuple[int, int]:
        """The host (uid, gid) that must own what is staged for the sandbox (workspace,
        session store): what the agent writes is written as that owner."""
        ...

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Prepare the sandbox (limits, mounts, labels).

        Raises:
            SandboxError: the backend is unavailable or refused the spec.
        """
        ...

    async def destroy(self, sandbox_id: str) -> None:
        """Kill everything inside and remove what ``create`` made; idempotent."""
        ...

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Sandboxes whose labels include all of ``labels``."""
        ...


@runtime_checkable
class Quiescing(Protocol):
    """A backend whose ``destroy`` waits for the kernel to reap what it killed can say
    sooner that nothing in a sandbox can run again: ``quiesce`` kills everything inside
    and undoes what ``create`` made around it, and returns once no process in it can run,
    write or fork (the local backend: every thread in the kernel's exit path). A job's
    results are taken from then on; ``destroy`` still follows, before its lease goes.
    """

    async def quiesce(self, sandbox_id: str) -> None: ...


@runtime_checkable
class Priming(Protocol):
    """A backend whose sandboxes start sooner when told ahead that one will be made:
    ``prime`` starts what gives that head start (the local backend: cheap cgroup joins,
    ``worker.sandbox.local.dynmods``) and returns its release (idempotent; what it
    started also ends by itself, bounded). A job calls it as soon as it knows it makes
    its sandbox (cold), and releases it once ``create`` returned."""

    def prime(self) -> Callable[[], None]: ...


def prime(backend: object) -> Callable[[], None]:
    """``backend.prime()`` where it is ``Priming``, else a release that does nothing."""
    return backend.prime() if isinstance(backend, Priming) else _released


def _released() -> None:
    return None


@runtime_checkable
class SlotHost(Protocol):
    """What a backend with ``Capabilities.warm_slots`` adds: a sandbox made with no job
    (``create`` of a spec whose ``workspace`` is the slot's own, still empty, directory) is
    handed to one job later.

    ``assign`` makes it the attempt's exactly as ``create`` would have (its labels, its
    lease's deadline, its job's ``deadline_s``); ``fill`` then moves the job's staged
    workspace into the sandbox's ``/workspace`` in place, never replacing what
    ``create`` made there (the mask mount points: a running sandbox keeps its mounts on
    those very inodes).
    """

    async def assign(
        self,
        sandbox: Sandbox,
        *,
        labels: Mapping[str, str],
        lease_deadline: LeaseDeadline | None,
        deadline_s: int | None = None,
    ) -> None:
        """Relabel ``sandbox`` to the attempt (``labels``) and bound it by its lease and,
        where the backend enforces ``SandboxSpec.deadline_s`` without the worker, by the
        job's ``deadline_s`` counted from now (what a cold sandbox of the job gets).

        Raises:
            SandboxError: the sandbox could not be relabelled.
        """
        ...

    async def fill(self, sandbox: Sandbox, staged: Path) -> Path:
        """Move everything in ``staged`` (a host directory on the same filesystem) into
        the sandbox's workspace; returns the host path of that workspace.

        Raises:
            SandboxError: a staged entry collides with a mount point of another kind, or
                the workspace could not be written.
        """
        ...
