"""A pack's declared runtime (``launch.runtime``), checked on this host before a launch.

An npm pack's closure holds its ``node_modules`` only: the launch runs ``/usr/bin/node``,
which a local sandbox sees through the host's ``/usr``, bound read-only. On a worker whose
Node.js is missing or too old the agent would start and die with whatever the old runtime
prints; instead the job is refused before anything is prepared:

    RuntimeUnavailable (worker.errors)  runtime_unavailable        exit 3
        details: runtime, required, path, found (the version, or null),
                 reason (missing | too_old | unreadable)

The version comes from running ``<node> --version`` here, outside any sandbox: the host's
own binary (never one from a closure: the manifest refuses that), with an empty
environment (no ``NODE_OPTIONS`` can make it load a script) and stdin from /dev/null, so
no code of the pack runs. A version read is cached per binary (path, device, inode, size,
mtime): a worker asks once, and again only after node was replaced. Failures are not
cached.

Checked only where the sandbox's ``/usr`` is the host's (a backend whose capabilities
say ``runs_host_usr``). A container image carries its own Node.js (the base image
copies the host's when it is built, see ``worker.images.base``): not looked into here.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final

from worker.errors import RuntimeUnavailable
from worker.launch import BASE_ENV
from worker.packs.manifest import NODE_NAMES, Pack

_VERSION: Final = re.compile(r"^v(\d+)\.(\d+)\.(\d+)\s*$")
_TIMEOUT_S: Final = 10.0

Version = tuple[int, int, int]


class _Unreadable(Exception):
    """``<node> --version`` did not say a version (not cached)."""


@dataclass(frozen=True, slots=True)
class NodeFound:
    """What the host's ``node`` is: its version, or why it has none."""

    path: str
    version: Version | None
    reason: str | None = None  # missing | unreadable
    detail: str = ""


def check_runtime(pack: Pack, *, host_usr: bool) -> None:
    """Refuse *pack* when this host cannot provide its ``launch.runtime``.

    ``host_usr``: the sandbox sees the host's ``/usr`` (the backend's
    ``capabilities.runs_host_usr``). A no-op without a declared runtime or without it.
    Blocking (may run ``node --version`` once): call it in a thread.

    Raises:
        RuntimeUnavailable: node is missing, unreadable, or older than required.
    """
    launch = pack.manifest.launch
    if launch.runtime is None or not host_usr:
        return
    found = host_node(node_binary(launch.argv[0]))
    minimum = launch.runtime.node_minimum
    if found.version is not None and found.version >= minimum:
        return
    reason = found.reason or "too_old"
    required = launch.runtime.node
    raise RuntimeUnavailable(
        f"pack {pack.name} needs Node.js {required} at {found.path}: {_said(found)}",
        pack=pack.name,
        runtime="node",
        required=required,
        path=found.path,
        found=_dotted(found.version),
        reason=reason,
    )


def node_binary(argv0: str) -> str:
    """The host path of the ``node`` a launch runs: ``argv[0]`` when it is one, else
    the first ``node`` on the sandbox's PATH (the same directories on the host)."""
    if argv0.startswith("/") and PurePosixPath(argv0).name in NODE_NAMES:
        return argv0
    return shutil.which("node", path=BASE_ENV["PATH"]) or "/usr/bin/node"


def host_node(path: str) -> NodeFound:
    """The version of the host's node at *path* (cached while the file is the same)."""
    try:
        st = os.stat(path)
    except OSError:
        return NodeFound(path, None, "missing")
    try:
        version = _version(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except _Unreadable as exc:
        return NodeFound(path, None, "unreadable", str(exc))
    return NodeFound(path, version)


@functools.lru_cache(maxsize=16)
def _version(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> Version:
    # dev/ino/size/mtime_ns are the cache key only: a replaced binary is asked again.
    try:
        done = subprocess.run(
            [path, "--version"],
            env={},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unreadable(f"cannot run {path} --version: {exc}") from exc
    out = done.stdout.decode("utf-8", "replace")
    match = _VERSION.match(out)
    if done.returncode != 0 or match is None:
        raise _Unreadable(f"{path} --version exited {done.returncode} saying {out[:80]!r}")
    major, minor, patch = (int(group) for group in match.groups())
    return major, minor, patch


def _said(found: NodeFound) -> str:
    if found.reason == "missing":
        return "there is none on this worker"
    if found.reason == "unreadable":
        return f"its version could not be read ({found.detail})"
    return f"it is {_dotted(found.version)}"


def _dotted(version: Version | None) -> str | None:
    return None if version is None else ".".join(str(part) for part in version)
