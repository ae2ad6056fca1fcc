"""bubblewrap's argv for one spawn, and the shared ``/etc`` its binds mount (pure, mostly).

Options never go on the command line (see :func:`bwrap_command`): they are written to a
pipe bwrap reads with ``--args``, NUL-separated (:func:`nul_joined`).
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError
from worker.network import FORWARDER_SOURCE, SANDBOX_FORWARDER, SANDBOX_SOCKET
from worker.sandbox.base import (
    HOME,
    PACK_ROOT,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    SandboxSpec,
)
from worker.sandbox.local.records import SandboxRecord, proxy_socket

DEV_NULL = "/dev/null"
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
    #: The network proxy's socket and the forwarder script (``allowlist``, not root).
    proxy: Path | None = None
    forwarder: Path | None = None


def bind_sources(record: SandboxRecord, spec: SandboxSpec, *, empty_dir: Path) -> BindSources:
    """Host paths of the bind sources, or (root worker) their staged twins. Only a worker
    that is not root binds the proxy's socket and the forwarder (``allowlist``): a root
    worker makes the proxy's listeners in the sandbox itself (``netns``)."""
    if record.stage is None:
        network = record.proxy_dir is not None
        return BindSources(
            workspace=record.workspace,
            pack=spec.pack_closure,
            etc=record.etc_dir,
            empty_dir=empty_dir,
            extras=tuple(m.source for m in spec.extra_mounts),
            states=tuple(m.source for m in spec.state_mounts),
            proxy=proxy_socket(record) if network else None,
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
    )


def stage_sources(record: SandboxRecord, spec: SandboxSpec, *, empty_dir: Path) -> dict[str, Path]:
    """What a root worker stages, by staged name (see ``records.staged_names``)."""
    sources = {
        "workspace": record.workspace,
        "pack": spec.pack_closure,
        "etc": record.etc_dir,
        "empty": empty_dir,
    }
    sources.update({f"x{i}": m.source for i, m in enumerate(spec.extra_mounts)})
    sources.update({f"s{i}": m.source for i, m in enumerate(spec.state_mounts)})
    return sources


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


def nul_joined(args: Sequence[str]) -> bytes:
    """``args`` as bwrap's ``--args`` reads them.

    Raises:
        SandboxError: an argument holds a NUL byte.
    """
    if any("\0" in a for a in args):
        raise SandboxError("NUL byte in a bwrap argument")
    return b"".join(a.encode() + b"\0" for a in args)


def build_shared_etc(target: Path) -> None:
    """One /etc shared by every sandbox of a state dir (identical for all, mounted
    read-only), built aside and renamed so a concurrent builder is harmless. Delete it
    to pick up host changes such as a CA bundle update."""
    tmp = target.with_name(f".etc.{os.getpid()}.{secrets.token_hex(4)}")
    write_etc(tmp)
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise
