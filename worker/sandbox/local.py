"""The embedded default backend: bubblewrap + cgroupfs + a runtime-built seccomp program.

Each sandbox is a cgroup set (memory/pids/cpu limits, see ``cgroups``) and a JSON record
in a state directory, which also holds the small ``/etc`` all sandboxes share (generated
users, a few copied host files). Each ``spawn`` runs one ``bwrap`` that unshares every
namespace (so no network: the new net namespace has only loopback), maps the agent to
uid/gid 1000 without capabilities, mounts ``/usr`` and that ``/etc`` read-only, the
workspace read-write and the pack closure read-only, and installs the seccomp program
before exec.

The record makes ``list`` and ``destroy`` work from another process (a reaper after the
worker died): destroy needs only the record's cgroup paths, never the worker's memory.

The sandbox uid 1000 maps to the *worker's* host uid (root here): bubblewrap run by root
writes ``1000 0 1`` into ``uid_map``. Files the agent creates in the workspace are
therefore root-owned on the host; the seccomp program refuses set-id mode bits for that
reason, and the pid/net/ipc namespaces keep the agent away from host processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from worker.errors import SandboxError
from worker.sandbox import cgroups, seccomp
from worker.sandbox.base import (
    HOME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_WORKER,
    PACK_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    SandboxInfo,
    SandboxSpec,
)
from worker.settings import Settings

DEFAULT_STATE_DIR = Path("/run/acp-worker/sandboxes")
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
# Joins each cgroup (argv: N, N cgroup.procs files, then the command) and execs the
# command, so bwrap and everything it starts is accounted before it runs a single
# instruction — without preexec_fn, which is unsafe with threads.
_JOIN_AND_EXEC = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" || { echo "acpw: cannot join cgroup $1" >&2; exit 125; }; '
    'shift; n=$((n - 1)); done; exec "$@"'
)


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


def _mount_args(spec: SandboxSpec) -> list[str]:
    args = ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP, "--tmpfs", HOME]
    args += ["--bind", str(spec.workspace), WORKSPACE]
    args += ["--ro-bind", str(spec.pack_closure), PACK_ROOT]
    for mount in spec.extra_mounts:
        args += ["--ro-bind", str(mount.source), mount.target]
    return args


def build_bwrap_options(
    *,
    layout: HostLayout,
    spec: SandboxSpec,
    etc_dir: Path,
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
    args += [*_root_args(layout), "--ro-bind", str(etc_dir), "/etc", *_mount_args(spec)]
    # The root itself is bwrap's tmpfs: freeze it so only the mounts above are writable.
    args += ["--remount-ro", "/", "--chdir", cwd, "--seccomp", str(seccomp_fd)]
    return args


def bwrap_command(bwrap: str, args_fd: int, argv: Sequence[str]) -> list[str]:
    """bwrap reading its options from ``args_fd``.

    Options never go on the command line: ``--setenv`` values are credentials, and a
    command line is readable by every host user (ps) and, for the sandbox's init, by
    the agent (/proc/1/cmdline would also reveal host paths).
    """
    return [bwrap, "--args", str(args_fd), "--", *argv]


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


def wrapper_argv(procs_files: Sequence[Path], command: Sequence[str]) -> list[str]:
    """``/bin/sh`` that joins every cgroup, then execs ``command`` (same pid)."""
    files = [str(p) for p in procs_files]
    return ["/bin/sh", "-c", _JOIN_AND_EXEC, "acpw-join", str(len(files)), *files, *command]


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


class LocalProcess:
    """A bwrap process; its pid is bwrap's (host pid), the program runs under it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        if proc.stdin is None or proc.stdout is None or proc.stderr is None:
            raise SandboxError("bwrap started without pipes", pid=proc.pid)
        self._stdin, self._stdout, self._stderr = proc.stdin, proc.stdout, proc.stderr

    @property
    def pid(self) -> int:
        return self._proc.pid

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
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

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

    def __init__(self, backend: LocalBackend, record: SandboxRecord, spec: SandboxSpec) -> None:
        self._backend = backend
        self._record = record
        self._spec = spec

    @property
    def sandbox_id(self) -> str:
        return self._record.sandbox_id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    @property
    def cgroups(self) -> cgroups.CgroupSet:
        return self._record.cgroups

    def oom_killed(self) -> bool:
        """True once the kernel OOM-killed any process of this sandbox."""
        return cgroups.oom_kills(self._record.cgroups) > 0

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> LocalProcess:
        """Start ``argv`` inside the sandbox with exactly ``env`` (nothing inherited).

        Raises:
            SandboxError: the sandbox could not start the process.
        """
        _check_command(argv, env, cwd)
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
        args_fd = -1
        try:
            options = build_bwrap_options(
                layout=self._backend.layout,
                spec=self._spec,
                etc_dir=self._record.etc_dir,
                env=env,
                cwd=cwd,
                seccomp_fd=filter_fd,
            )
            args_fd = _data_fd("acpw-bwrap-args", _nul_joined(options))
            command = bwrap_command(self._backend.bwrap_path(), args_fd, argv)
            return await asyncio.create_subprocess_exec(
                *wrapper_argv(self._record.cgroups.procs_files, command),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=limit,
                env={},
                pass_fds=(filter_fd, args_fd),
                start_new_session=True,
            )
        finally:
            os.close(filter_fd)
            if args_fd >= 0:
                os.close(args_fd)


class LocalBackend:
    """``SandboxBackend`` on bubblewrap; ``list``/``destroy`` work from any process."""

    name = "local"

    def __init__(
        self,
        settings: Settings,
        *,
        state_dir: Path = DEFAULT_STATE_DIR,
        etc_dir: Path | None = None,
    ) -> None:
        """``etc_dir``: where the shared sandbox /etc is built (default ``state_dir/etc``)."""
        self._settings = settings
        self.store = StateStore(state_dir)
        self._etc_dir = etc_dir or state_dir / "etc"
        self._layout: HostLayout | None = None
        self._bwrap: str | None = None

    @property
    def layout(self) -> HostLayout:
        if self._layout is None:
            self._layout = HostLayout.detect()
        return self._layout

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

    def cgroup_driver(self) -> cgroups.CgroupDriver:
        return cgroups.detect(self._settings.cgroup_root, self._settings.cgroup_parent)

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        """Write the record, generate /etc, make the cgroups with the spec's limits.

        Raises:
            SandboxError: bubblewrap or a cgroup controller is missing, a path in the spec
                is not a directory, or the spec asks for a network this backend lacks.
        """
        self._check_spec(spec)
        self.bwrap_path()
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        driver = self.cgroup_driver()
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            labels=sandbox_labels(spec, self._settings.worker_id),
            cgroups=driver.plan(sandbox_id),
            etc_dir=self._etc_dir,
            workspace=spec.workspace,
            pack_closure=spec.pack_closure,
        )
        # Record first: whatever create leaves behind, destroy can find and remove.
        with _translate("create", sandbox_id):
            self.store.write(record)
        await self._prepare(driver, record, spec)
        return LocalSandbox(self, record, spec)

    async def _prepare(
        self, driver: cgroups.CgroupDriver, record: SandboxRecord, spec: SandboxSpec
    ) -> None:
        try:
            with _translate("create", record.sandbox_id):
                if not record.etc_dir.is_dir():
                    await asyncio.to_thread(self._build_etc, record.etc_dir)
                driver.create(record.sandbox_id, spec.limits)
        except SandboxError:
            await self.destroy(record.sandbox_id)
            raise

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
        if spec.network != "none":
            raise SandboxError("local backend supports only network 'none'", network=spec.network)
        for what, path in (("workspace", spec.workspace), ("pack_closure", spec.pack_closure)):
            if not path.is_dir():
                raise SandboxError(f"{what} is not a directory", **{what: str(path)})
        for mount in spec.extra_mounts:
            if not mount.source.exists() or not mount.target.startswith("/"):
                raise SandboxError("bad extra mount", source=str(mount.source))

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
