"""The embedded default backend: bubblewrap + cgroupfs + a runtime-built seccomp program.

Each sandbox is a cgroup set (memory/pids/cpu limits, see ``cgroups``) and a JSON record
in a state directory, which also holds the small ``/etc`` all sandboxes share (generated
users, a few copied host files). Each ``spawn`` runs one ``bwrap`` that unshares every
namespace (so no network: the new net namespace has only loopback), maps the agent to
uid/gid 1000 without capabilities, mounts ``/usr`` and that ``/etc`` read-only, the
workspace read-write and the pack closure read-only, the spec's ``state_mounts``
read-write over the private HOME tmpfs (bubblewrap makes their missing parents there,
owned by the sandbox user), and installs the seccomp program before exec.

The record makes ``list`` and ``destroy`` work from another process (a reaper after the
worker died): destroy needs only the record's cgroup paths, never the worker's memory.

The sandbox uid 1000 maps to the host uid bubblewrap runs as. A root worker never lets
that be root: each spawn enters the sandbox's staging mount namespace (see ``staging``)
and drops to ``sandbox_host_uid``/``sandbox_host_gid`` with ``nsenter`` (no groups, no
capabilities; see ``drop_privileges_argv``) before exec'ing bubblewrap, which then builds
an unprivileged user namespace. The worker moves each spawn into the cgroups itself while
bubblewrap starts: bubblewrap waits for its options on a pipe the worker fills only then,
so it clones the sandbox inside them (whose cgroup namespace is rooted at its own cgroup),
and the sandboxed child also waits on a gate (``--block-fd``) until it is in, so the
program never runs a single instruction outside them (see ``_admit``). Files the
agent writes are owned by that uid on the host, and a host file it cannot read as that
uid stays unreadable. The workspace must therefore be owned by that uid (``create``
refuses otherwise; ``sandbox_owner`` tells a runner whom to stage it for). A non-root
worker runs bubblewrap as itself. The seccomp program still refuses set-id mode bits.

Agent config paths (``worker.admission.mask_plan``) are masked for the whole run: the
``.cursor``/``.claude`` directories bound onto themselves (so they cannot be renamed;
``.codex`` is masked whole, as an empty read-only directory),
``/dev/null`` bound read-only over each config file (a character device on a ``nodev``
mount: it is not a regular file, and every open fails), an empty read-only directory over
each plugin directory. Missing mount points are made before the run (``mountpoints``),
recorded, and removed by ``destroy``.

Network ``allowlist`` (see ``netpolicy``): bubblewrap still unshares the network
namespace; the job's proxy socket and the forwarder script are bound read-only at
``/run/acpw``, each spawn runs behind the forwarder (``127.0.0.1:3128`` on the sandbox's
own loopback) with the proxy variables added to its environment, and ``destroy`` closes
the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from worker.admission import AdmissionResult, MaskEntry, MaskKind, check_workspace, mask_plan
from worker.errors import SandboxError
from worker.network import (
    FORWARDER_SOURCE,
    SANDBOX_FORWARDER,
    SANDBOX_SOCKET,
    AllowlistProxy,
    forwarder_argv,
    proxy_env,
)
from worker.sandbox import cgroups, mountpoints, netpolicy, seccomp, staging
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
    PipedProcess,
    SandboxInfo,
    SandboxSpec,
    home_relative,
)
from worker.sandbox.owner import sandbox_owner
from worker.settings import Settings

DEFAULT_STATE_DIR = Path("/run/acp-worker/sandboxes")
# Staged bind sources (root worker only). Not under the state dir: every uid must be able
# to traverse down to it, so it is a fixed, world-traversable place.
DEFAULT_STAGE_DIR = Path("/run/acp-worker/stage")
DEV_NULL = "/dev/null"
# Looked up here only, never through the worker's own PATH.
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
HOSTNAME = "acpw"
# Host /etc entries a program may need and that hold no secrets, copied into each
# sandbox's private /etc (one bind instead of one per entry: every bind costs bwrap a
# mountinfo scan). passwd, group and hosts are generated; shadow, sudoers, ssl/private
# and resolv.conf (no network) never enter.
ETC_FROM_HOST = (
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "alternatives",
    "os-release",
    "protocols",
    "services",
    "mime.types",
)
SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's private tmpfs, not a host path
ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_ID_VALID = re.compile(r"^acpw-[A-Za-z0-9_-]{1,120}$")
_KILL_ROUNDS = 200  # x 10 ms: bound on destroy's kill loop
# Bound on bwrap reporting its sandboxed child (it does so right after clone()).
_ADMIT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class HostLayout:
    """What the host's root looks like, so the sandbox's root can mirror it.

    ``root_links``: top-level symlinks into /usr (merged-usr); ``root_dirs``: real
    top-level directories to bind read-only instead.
    """

    root_links: tuple[tuple[str, str], ...]
    root_dirs: tuple[str, ...]

    @classmethod
    def detect(cls, root: Path = Path("/")) -> HostLayout:
        links, dirs = [], []
        for name in ROOT_ENTRIES:
            path = root / name
            if path.is_symlink():
                links.append((name, os.readlink(path)))
            elif path.is_dir():
                dirs.append(name)
        return cls(tuple(links), tuple(dirs))


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """What ``<state_dir>/<sandbox_id>.json`` holds."""

    sandbox_id: str
    labels: Mapping[str, str]
    cgroups: cgroups.CgroupSet
    etc_dir: Path
    workspace: Path
    pack_closure: Path
    pids: tuple[int, ...] = ()
    created_at: float = field(default_factory=time.time)
    #: Mount points ``create`` made in the workspace (relative paths, in creation order).
    mask_points: tuple[str, ...] = ()
    #: The staging directory (root worker only) and the names staged in it.
    stage: Path | None = None
    staged: tuple[str, ...] = ()
    #: The directory of the network proxy's socket (``allowlist`` only).
    proxy_dir: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox_id": self.sandbox_id,
            "backend": "local",
            "labels": dict(self.labels),
            "cgroups": self.cgroups.to_json(),
            "etc_dir": str(self.etc_dir),
            "workspace": str(self.workspace),
            "pack_closure": str(self.pack_closure),
            "pids": list(self.pids),
            "created_at": self.created_at,
            "mask_points": list(self.mask_points),
            "stage": None if self.stage is None else str(self.stage),
            "staged": list(self.staged),
            "proxy_dir": None if self.proxy_dir is None else str(self.proxy_dir),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SandboxRecord:
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            labels={str(k): str(v) for k, v in data["labels"].items()},
            cgroups=cgroups.CgroupSet.from_json(data["cgroups"]),
            etc_dir=Path(data["etc_dir"]),
            workspace=Path(data["workspace"]),
            pack_closure=Path(data["pack_closure"]),
            pids=tuple(int(p) for p in data["pids"]),
            created_at=float(data["created_at"]),
            mask_points=tuple(str(p) for p in data.get("mask_points", ())),
            stage=None if data.get("stage") is None else Path(data["stage"]),
            staged=tuple(str(n) for n in data.get("staged", ())),
            proxy_dir=None if data.get("proxy_dir") is None else Path(data["proxy_dir"]),
        )


@dataclass(frozen=True, slots=True)
class LocalSandboxStatus:
    """A sandbox as the local backend sees it now (``pids`` are host pids)."""

    sandbox_id: str
    labels: Mapping[str, str]
    pids: frozenset[int]
    oom_kills: int

    @property
    def running(self) -> bool:
        return bool(self.pids)

    @property
    def oom_killed(self) -> bool:
        return self.oom_kills > 0


class StateStore:
    """Sandbox records as one JSON file each, written atomically (tmp + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}.json"

    def write(self, record: SandboxRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.root / f".{record.sandbox_id}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record.to_json(), sort_keys=True))
        tmp.replace(self.path(record.sandbox_id))

    def read(self, sandbox_id: str) -> SandboxRecord | None:
        try:
            return SandboxRecord.from_json(json.loads(self.path(sandbox_id).read_text()))
        except FileNotFoundError:
            return None

    def all(self) -> list[SandboxRecord]:
        found = []
        for path in sorted(self.root.glob("acpw-*.json")):
            record = self.read(path.stem)
            if record is not None:
                found.append(record)
        return found

    def delete(self, sandbox_id: str) -> None:
        self.path(sandbox_id).unlink(missing_ok=True)


def make_sandbox_id(job_id: str, attempt: int) -> str:
    """``acpw-<job>-<attempt>-<random>``, safe as a file and cgroup name."""
    job = _ID_UNSAFE.sub("-", job_id).strip("-")[:64] or "job"
    return f"acpw-{job}-{attempt}-{secrets.token_hex(4)}"


def _check_id(sandbox_id: str) -> None:
    # Ids become paths under the state dir and cgroupfs: refuse anything else.
    if not _ID_VALID.match(sandbox_id):
        raise SandboxError("not a local sandbox id", sandbox_id=sandbox_id)


@contextlib.contextmanager
def _translate(action: str, sandbox_id: str) -> Iterator[None]:
    """OSError at the seam becomes SandboxError with context."""
    try:
        yield
    except OSError as exc:
        raise SandboxError(
            f"local sandbox: {action} failed: {exc.strerror or exc}",
            sandbox_id=sandbox_id,
            action=action,
            errno=exc.errno,
        ) from exc


def sandbox_labels(spec: SandboxSpec, worker_id: str) -> dict[str, str]:
    """The spec's labels plus job, attempt and worker (job and attempt always truthful)."""
    labels = {LABEL_WORKER: worker_id, **spec.labels}
    labels[LABEL_JOB] = spec.job_id
    labels[LABEL_ATTEMPT] = str(spec.attempt)
    return labels


def write_etc(directory: Path, host_etc: Path = Path("/etc")) -> None:
    """Build the sandbox's /etc: generated users and hosts, plus ``ETC_FROM_HOST``.

    Symlinks are copied as symlinks: they point into /usr, which the sandbox sees too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agent:x:{SANDBOX_UID}:{SANDBOX_GID}:agent:{HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (directory / "group").write_text(f"root:x:0:\nagent:x:{SANDBOX_GID}:\nnogroup:x:65534:\n")
    (directory / "hosts").write_text(f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n")
    for name in ETC_FROM_HOST:
        _copy_entry(host_etc / name, directory / name)


def _copy_entry(source: Path, target: Path) -> None:
    if not source.is_symlink() and not source.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
        target.symlink_to(os.readlink(source))
    elif source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)


def _root_args(layout: HostLayout) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name, target in layout.root_links:
        args += ["--symlink", target, f"/{name}"]
    for name in layout.root_dirs:
        args += ["--ro-bind", f"/{name}", f"/{name}"]
    return args


@dataclass(frozen=True, slots=True)
class BindSources:
    """Where bwrap finds each bind source: the host paths, or their staged twins.

    ``extras`` are the sources of ``spec.extra_mounts``, in order, ``states`` those of
    ``spec.state_mounts``; ``empty_dir`` is the empty directory bound read-only over
    masked directories.
    """

    workspace: Path
    pack: Path
    etc: Path
    empty_dir: Path
    extras: tuple[Path, ...] = ()
    states: tuple[Path, ...] = ()
    #: The network proxy's socket and the forwarder script (``allowlist`` only).
    proxy: Path | None = None
    forwarder: Path | None = None


def _mount_args(spec: SandboxSpec, sources: BindSources, masks: Sequence[MaskEntry]) -> list[str]:
    size = str(spec.tmpfs_bytes)
    args = ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", size, "--tmpfs", SANDBOX_TMP, "--size", size, "--tmpfs", HOME]
    # Over the HOME tmpfs; bwrap makes missing parents there, owned by the sandbox user.
    for source, state in zip(sources.states, spec.state_mounts, strict=True):
        args += ["--bind", str(source), state.target]
    args += ["--bind", str(sources.workspace), WORKSPACE, *_mask_args(masks, sources)]
    args += ["--ro-bind", str(sources.pack), PACK_ROOT]
    for source, mount in zip(sources.extras, spec.extra_mounts, strict=True):
        args += ["--ro-bind", str(source), mount.target]
    if sources.proxy is not None and sources.forwarder is not None:
        # Read-only binds: connect() on a socket is not a write to its filesystem.
        args += ["--ro-bind", str(sources.proxy), SANDBOX_SOCKET]
        args += ["--ro-bind", str(sources.forwarder), SANDBOX_FORWARDER]
    return args


def _mask_args(masks: Sequence[MaskEntry], sources: BindSources) -> list[str]:
    # In plan order: an anchor is bound before the masks inside it.
    args: list[str] = []
    for entry in masks:
        dest = f"{WORKSPACE}/{entry.path}"
        if entry.kind is MaskKind.ANCHOR:
            args += ["--bind", str(sources.workspace / entry.path), dest]
        elif entry.kind is MaskKind.FILE:
            args += ["--ro-bind", DEV_NULL, dest]
        else:
            args += ["--ro-bind", str(sources.empty_dir), dest]
    return args


def build_bwrap_options(
    *,
    layout: HostLayout,
    spec: SandboxSpec,
    sources: BindSources,
    masks: Sequence[MaskEntry] = (),
    env: Mapping[str, str],
    cwd: str,
    seccomp_fd: int,
) -> list[str]:
    """bwrap's options for one process (pure: no I/O); the command follows ``--``."""
    args = ["--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", HOSTNAME]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += [*_root_args(layout), "--ro-bind", str(sources.etc), "/etc"]
    args += _mount_args(spec, sources, masks)
    # The root itself is bwrap's tmpfs: freeze it so only the mounts above are writable.
    args += ["--remount-ro", "/", "--chdir", cwd, "--seccomp", str(seccomp_fd)]
    return args


def bwrap_command(
    bwrap: str, args_fd: int, argv: Sequence[str], *, info_fd: int, block_fd: int
) -> list[str]:
    """bwrap reading its options from ``args_fd``, held at ``block_fd`` until admitted.

    Options never go on the command line: ``--setenv`` values are credentials, and a
    command line is readable by every host user (ps) and, for the sandbox's init, by
    the agent (/proc/1/cmdline would also reveal host paths). bwrap reports its
    sandboxed child on ``info_fd`` and that child, its mounts made, waits on
    ``block_fd`` before it forks or execs anything (see :func:`_admit`).
    """
    return [
        bwrap, "--info-fd", str(info_fd), "--block-fd", str(block_fd),
        "--args", str(args_fd), "--", *argv,
    ]  # fmt: skip


def drop_privileges_argv(
    *, nsenter: str, setpriv: str, mount_ns: Path, owner: tuple[int, int], thorough: bool
) -> list[str]:
    """Enter the staging mount namespace, then become ``owner`` with no capabilities.

    Goes before bwrap, which then runs unprivileged and maps the sandbox uid to ``owner``.
    ``nsenter`` alone does it (``setgroups(0)``, ``setgid``, ``setuid``: leaving root
    empties the permitted, effective and ambient sets) in one exec instead of two. Only
    the inheritable and bounding sets survive that, and they matter only to an exec that
    can gain capabilities, which bwrap can do only when it is set-uid or has file
    capabilities, or the worker holds inheritable ones: ``thorough`` (see
    :func:`needs_thorough_drop`) adds ``setpriv`` to empty both sets for those hosts.
    """
    uid, gid = owner
    if not thorough:
        return [nsenter, f"--mount={mount_ns}", f"--setuid={uid}", f"--setgid={gid}", "--"]
    return [
        nsenter, f"--mount={mount_ns}", "--",
        setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip


def needs_thorough_drop(bwrap: str, status: Path = Path("/proc/self/status")) -> bool:
    """True when exec'ing ``bwrap`` after leaving root could gain a capability.

    That is when bwrap is set-uid/set-gid or carries file capabilities, or this process
    holds inheritable capabilities (some container runtimes hand them out).
    """
    info = os.stat(bwrap)
    if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return True
    try:
        os.getxattr(bwrap, "security.capability")
        return True
    except OSError:
        pass
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "CapInh":
            return int(value.strip(), 16) != 0
    return True  # cannot tell: be thorough


def _staged_names(spec: SandboxSpec) -> tuple[str, ...]:
    extras = (f"x{i}" for i in range(len(spec.extra_mounts)))
    states = (f"s{i}" for i in range(len(spec.state_mounts)))
    network = ("proxy", "forward") if spec.network == "allowlist" else ()
    return ("workspace", "pack", "etc", "empty", *extras, *states, *network)


def _proxy_socket(record: SandboxRecord) -> Path:
    if record.proxy_dir is None:
        raise SandboxError("sandbox has no network proxy", sandbox_id=record.sandbox_id)
    return record.proxy_dir / netpolicy.SOCKET_NAME


def _data_fd(name: str, data: bytes) -> int:
    """A memfd holding ``data`` at offset 0 (bwrap reads fds to the end); caller closes."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _check_command(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
    if not argv or not cwd.startswith("/"):
        raise SandboxError("spawn needs an argv and an absolute cwd", cwd=cwd)
    if any("\0" in a for a in argv) or any(not k or "=" in k for k in env):
        raise SandboxError("spawn refused a NUL byte in argv or a malformed env name")


def _nul_joined(args: Sequence[str]) -> bytes:
    if any("\0" in a for a in args):
        raise SandboxError("NUL byte in a bwrap argument")
    return b"".join(a.encode() + b"\0" for a in args)


def _child_pid(info_fd: int, deadline: float) -> int | None:
    """The host pid of bwrap's sandboxed child, from its ``--info-fd`` JSON.

    None when bwrap exited before it cloned (its stderr says why).

    Raises:
        SandboxError: bwrap said nothing in time, or something unreadable.
    """
    data = b""
    while not data.endswith(b"}\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([info_fd], [], [], left)[0]:
            raise SandboxError("bwrap did not report its sandbox in time")
        chunk = os.read(info_fd, 4096)
        if not chunk:
            return None
        data += chunk
    try:
        pid = json.loads(data)["child-pid"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError("bwrap reported an unreadable child", info=data[:200]) from exc
    if not isinstance(pid, int) or pid <= 1:
        raise SandboxError("bwrap reported an unreadable child", info=data[:200])
    return pid


def _admit(cgs: cgroups.CgroupSet, pid: int, options: bytes, fds: tuple[int, int, int]) -> None:
    """Put one spawn into the sandbox's cgroups, then let it run (blocking; a thread).

    ``fds``: the write end of bwrap's ``--args`` pipe, the read end of its ``--info-fd``,
    the write end of its ``--block-fd`` gate. ``pid`` (nsenter, then bwrap: one pid
    across the execs) is moved while it starts; bwrap waits for its options on the args
    pipe, which are written only then, so it clones the sandbox inside the cgroups (and
    the sandbox's cgroup namespace is rooted at its own cgroup: the agent sees ``/``).
    The child bwrap reports on the info fd is moved too, and only then is the gate
    written: that child waits on it before it forks the sandbox's init or execs the
    command, so not one instruction of the program runs outside the cgroups. On any
    failure the spawn's process group is killed before the gate closes (bwrap reads EOF
    on the gate as "go"). Owns and closes the three descriptors.

    Raises:
        SandboxError: a cgroup could not be joined, or bwrap did not report in time.
    """
    args_fd, info_fd, gate_fd = fds
    opened = False
    try:
        try:
            cgroups.join(cgs, pid)
            _write_all(args_fd, options)
        except (ProcessLookupError, BrokenPipeError):
            return  # exited already (nsenter or bwrap refused): its stderr says why
        os.close(args_fd)  # bwrap parses its options and clones, inside the cgroups
        args_fd = -1
        child = _child_pid(info_fd, time.monotonic() + _ADMIT_TIMEOUT_S)
        if child is None:
            return
        try:
            cgroups.join(cgs, child)
        except ProcessLookupError:
            # The child died in its own set-up (a mount bwrap could not make): nothing
            # can run, and bwrap's exit and stderr say why, so it is not killed.
            opened = True
            return
        os.write(gate_fd, b"1")
        opened = True
    except OSError as exc:
        raise SandboxError("cannot join the sandbox's cgroups", error=str(exc)) from exc
    finally:
        if not opened:  # killed before its args or its gate read EOF: nothing runs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for fd in (args_fd, info_fd, gate_fd):
            if fd >= 0:
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Host pids below ``pid``, parents before children (a snapshot; races are benign)."""
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += _children(child)
    return out


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class LocalProcess(PipedProcess):
    """A bwrap process; its pid is bwrap's (host pid), the program runs under it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, what="bwrap")

    def terminate(self) -> None:
        """SIGTERM to every process of this spawn's tree inside the sandbox.

        Not to bwrap itself: bwrap dies on SIGTERM without forwarding it, and
        --die-with-parent then SIGKILLs the tree, which would give the agent no grace.
        """
        if self._proc.returncode is None:
            _signal(descendants(self.pid), signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to bwrap's process group and the tree under it.

        Killing bwrap alone suffices (the pid namespace's init dies with it and takes
        every process inside along); the tree is signalled too so nothing waits on that.
        """
        if self._proc.returncode is not None:
            return
        tree = descendants(self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        _signal(tree, signal.SIGKILL)


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

    def oom_killed(self) -> bool:
        """True once the kernel OOM-killed any process of this sandbox."""
        return cgroups.oom_kills(self._record.cgroups) > 0

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
        return replace(result, git_root=git_root, findings=kept)

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
        _check_command(argv, env, cwd)
        if self._spec.network == "allowlist":
            argv, env = forwarder_argv(tuple(argv)), {**env, **proxy_env()}
        if before_launch is not None:
            await before_launch()
        with _translate("spawn", self.sandbox_id):
            proc = await self._start(argv, env, cwd, stdout_limit)
        self._record = replace(self._record, pids=(*self._record.pids, proc.pid))
        with _translate("record", self.sandbox_id):
            self._backend.store.write(self._record)
        return LocalProcess(proc)

    async def _start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str, limit: int
    ) -> asyncio.subprocess.Process:
        filter_fd = _data_fd("acpw-seccomp", seccomp.program())
        child_fds = [filter_fd]
        ours: list[int] = []
        try:
            info_r, info_w = os.pipe()
            ours.append(info_r)
            child_fds.append(info_w)
            gate_r, gate_w = os.pipe()
            ours.append(gate_w)
            child_fds.append(gate_r)
            args_r, args_w = os.pipe()  # filled once bwrap is in the cgroups: see _admit
            ours.append(args_w)
            child_fds.append(args_r)
            options = build_bwrap_options(
                layout=self._backend.layout,
                spec=self._spec,
                sources=self._backend.bind_sources(self._record, self._spec),
                masks=self._masks,
                env=env,
                cwd=cwd,
                seccomp_fd=filter_fd,
            )
            data = _nul_joined(options)
            command = bwrap_command(
                self._backend.bwrap_path(), args_r, argv, info_fd=info_w, block_fd=gate_r
            )
            proc = await asyncio.create_subprocess_exec(
                *self._backend.privilege_drop(self._record),
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=limit,
                env={},
                pass_fds=tuple(child_fds),
                start_new_session=True,
            )
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        # Submitted now, so the thread owns both descriptors whatever happens to us.
        admitted = asyncio.get_running_loop().run_in_executor(
            None, _admit, self._record.cgroups, proc.pid, data, (args_w, info_r, gate_w)
        )
        try:
            await admitted
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        return proc


class LocalBackend:
    """``SandboxBackend`` on bubblewrap; ``list``/``destroy`` work from any process."""

    name = "local"

    def __init__(
        self,
        settings: Settings,
        *,
        state_dir: Path = DEFAULT_STATE_DIR,
        etc_dir: Path | None = None,
        stage_dir: Path = DEFAULT_STAGE_DIR,
    ) -> None:
        """``etc_dir``: where the shared sandbox /etc is built (default ``state_dir/etc``).

        ``stage_dir``: where a root worker stages bind sources (see ``staging``).
        """
        self._settings = settings
        self.store = StateStore(state_dir)
        self._etc_dir = etc_dir or state_dir / "etc"
        self._stage_dir = stage_dir
        self._layout: HostLayout | None = None
        self._bwrap: str | None = None
        self._tools: dict[str, str] = {}
        self._thorough: bool | None = None
        self._proxies: dict[str, AllowlistProxy] = {}
        self.privileged = os.geteuid() == 0
        self.owner = sandbox_owner(settings)

    capabilities = Capabilities(shares_host_workspace=True)

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

    def bwrap_path(self) -> str:
        """The bwrap executable, resolved once.

        Raises:
            SandboxError: bubblewrap is not installed.
        """
        if self._bwrap is None:
            found = shutil.which(self._settings.bwrap)
            if found is None:
                raise SandboxError("bubblewrap not found", bwrap=self._settings.bwrap)
            self._bwrap = found
        return self._bwrap

    def tool(self, name: str) -> str:
        """A system tool (nsenter, setpriv, unshare, sh) from ``TOOL_PATH``, resolved once.

        Raises:
            SandboxError: the tool is not installed.
        """
        if name not in self._tools:
            found = shutil.which(name, path=TOOL_PATH)
            if found is None:
                raise SandboxError(f"{name} not found (util-linux)", tool=name, path=TOOL_PATH)
            self._tools[name] = found
        return self._tools[name]

    def privilege_drop(self, record: SandboxRecord) -> list[str]:
        """What runs before bwrap: nothing unless we are root."""
        if record.stage is None:
            return []
        if self._thorough is None:
            self._thorough = needs_thorough_drop(self.bwrap_path())
        return drop_privileges_argv(
            nsenter=self.tool("nsenter"),
            setpriv=self.tool("setpriv"),
            mount_ns=staging.ns_file(record.stage),
            owner=self.owner,
            thorough=self._thorough,
        )

    def bind_sources(self, record: SandboxRecord, spec: SandboxSpec) -> BindSources:
        """Host paths of the bind sources, or (root worker) their staged twins."""
        network = record.proxy_dir is not None
        if record.stage is None:
            return BindSources(
                workspace=record.workspace,
                pack=spec.pack_closure,
                etc=record.etc_dir,
                empty_dir=self.empty_dir,
                extras=tuple(m.source for m in spec.extra_mounts),
                states=tuple(m.source for m in spec.state_mounts),
                proxy=_proxy_socket(record) if network else None,
                forwarder=FORWARDER_SOURCE if network else None,
            )
        stage = record.stage
        return BindSources(
            workspace=stage / "workspace",
            pack=stage / "pack",
            etc=stage / "etc",
            empty_dir=stage / "empty",
            extras=tuple(stage / f"x{i}" for i in range(len(spec.extra_mounts))),
            states=tuple(stage / f"s{i}" for i in range(len(spec.state_mounts))),
            proxy=stage / "proxy" if network else None,
            forwarder=stage / "forward" if network else None,
        )

    def _stage_sources(self, record: SandboxRecord, spec: SandboxSpec) -> dict[str, Path]:
        sources = {
            "workspace": record.workspace,
            "pack": spec.pack_closure,
            "etc": record.etc_dir,
            "empty": self.empty_dir,
        }
        sources.update({f"x{i}": m.source for i, m in enumerate(spec.extra_mounts)})
        sources.update({f"s{i}": m.source for i, m in enumerate(spec.state_mounts)})
        if record.proxy_dir is not None:
            sources.update({"proxy": _proxy_socket(record), "forward": FORWARDER_SOURCE})
        return sources

    def cgroup_driver(self) -> cgroups.CgroupDriver:
        return cgroups.detect(self._settings.cgroup_root, self._settings.cgroup_parent)

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
        self._check_spec(spec)
        self._check_owner(spec.workspace)
        for state in spec.state_mounts:
            self._check_owner(state.source, what="writable mount")
        self.bwrap_path()
        if self.privileged:
            for name in ("nsenter", "setpriv", "unshare", "sh"):
                self.tool(name)
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        driver = self.cgroup_driver()
        stage = self._stage_dir / sandbox_id if self.privileged else None
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            labels=sandbox_labels(spec, self._settings.worker_id),
            cgroups=driver.plan(sandbox_id),
            etc_dir=self._etc_dir,
            workspace=spec.workspace.resolve(),
            pack_closure=spec.pack_closure,
            stage=stage,
            staged=_staged_names(spec) if stage else (),
        )
        # Record first: whatever create leaves behind, destroy can find and remove.
        with _translate("create", sandbox_id):
            self.store.write(record)
        masks = mask_plan(record.workspace) if spec.mask_config else []
        record = await self._prepare(driver, record, spec, masks)
        return LocalSandbox(self, record, spec, masks)

    async def _prepare(
        self,
        driver: cgroups.CgroupDriver,
        record: SandboxRecord,
        spec: SandboxSpec,
        masks: Sequence[MaskEntry],
    ) -> SandboxRecord:
        try:
            with _translate("create", record.sandbox_id):
                if not record.etc_dir.is_dir():
                    await asyncio.to_thread(self._build_etc, record.etc_dir)
                self._shared_dirs()
                driver.create(record.sandbox_id, spec.limits)
                owner = self.owner if self.privileged else None
                made = mountpoints.ensure(record.workspace, masks, owner)
                record = replace(record, mask_points=tuple(made))
                self.store.write(record)
                record = await self._start_network(record, spec)
                if record.stage is not None:
                    staging.prepare_root(self._stage_dir)
                    tools = {"unshare": self.tool("unshare"), "sh": self.tool("sh")}
                    sources = self._stage_sources(record, spec)
                    await staging.create(record.stage, sources, tools)
        except SandboxError:
            await self.destroy(record.sandbox_id)
            raise
        return record

    def network_proxy(self, sandbox_id: str) -> AllowlistProxy | None:
        """This process's proxy of a sandbox with network ``allowlist`` (else None)."""
        return self._proxies.get(sandbox_id)

    async def _start_network(self, record: SandboxRecord, spec: SandboxSpec) -> SandboxRecord:
        if spec.network != "allowlist":
            return record
        proxy = await netpolicy.start_proxy(spec, self.owner)
        self._proxies[record.sandbox_id] = proxy
        record = replace(record, proxy_dir=proxy.socket_path.parent)
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

    def _check_owner(self, workspace: Path, *, what: str = "workspace") -> None:
        if not self.privileged:
            return
        uid, gid = self.owner
        found = workspace.stat().st_uid
        if found != uid:
            raise SandboxError(
                f"{what} {workspace} is owned by uid {found}, not by the sandbox host uid "
                f"{uid}: the worker runs as root, so the sandbox runs as uid {uid} and could "
                f"not write it; stage the {what} owned by {uid}:{gid} (sandbox_owner)",
                workspace=str(workspace),
                owner_uid=found,
                sandbox_uid=uid,
            )

    @staticmethod
    def _build_etc(target: Path) -> None:
        # One /etc shared by every sandbox of this state dir (it is identical for all and
        # mounted read-only); built aside and renamed so a concurrent builder is harmless.
        # Delete it to pick up host changes such as a CA bundle update.
        tmp = target.with_name(f".etc.{os.getpid()}.{secrets.token_hex(4)}")
        write_etc(tmp)
        try:
            tmp.rename(target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not target.is_dir():
                raise

    @staticmethod
    def _check_spec(spec: SandboxSpec) -> None:
        netpolicy.check(spec)
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

    async def destroy(self, sandbox_id: str) -> None:
        """Kill everything inside and remove what ``create`` made; idempotent.

        Raises:
            SandboxError: processes survived the bounded kill loop or a cgroup stayed
                busy; the record is kept so a later destroy can finish.
        """
        _check_id(sandbox_id)
        record = self.store.read(sandbox_id)
        if record is None:
            return
        with _translate("destroy", sandbox_id):
            await self._kill_and_remove(record.cgroups, sandbox_id)
            proxy = self._proxies.pop(sandbox_id, None)
            if proxy is not None:
                await proxy.close()
            if record.stage is not None:
                staging.remove(record.stage, record.staged)
            mountpoints.remove(record.workspace, record.mask_points)
            if record.proxy_dir is not None:
                netpolicy.remove_dir(record.proxy_dir)
            self.store.delete(sandbox_id)

    @staticmethod
    async def _kill_and_remove(cgs: cgroups.CgroupSet, sandbox_id: str) -> None:
        # Loop because a process may fork between reading cgroup.procs and the kill;
        # pids.max bounds how long that can go on. rmdir is EBUSY until members are reaped.
        for _ in range(_KILL_ROUNDS):
            if cgroups.signal_all(cgs, signal.SIGKILL) == 0 and cgroups.remove(cgs):
                return
            await asyncio.sleep(0.01)
        raise SandboxError(
            "sandbox processes survived destroy",
            sandbox_id=sandbox_id,
            pids=sorted(cgroups.members(cgs)),
            errno=errno.EBUSY,
        )

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
        _check_id(sandbox_id)
        record = self.store.read(sandbox_id)
        if record is None:
            return None
        return LocalSandboxStatus(
            sandbox_id=sandbox_id,
            labels=record.labels,
            pids=frozenset(cgroups.members(record.cgroups)),
            oom_kills=cgroups.oom_kills(record.cgroups),
        )
