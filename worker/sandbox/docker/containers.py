"""What one container of a docker sandbox is: its create request, labels and launcher
(pure apart from the SDK's helpers), and the mask mount points made for it on the host."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError
from worker.images.identity import PinnedImage
from worker.network import (
    FORWARDER_SOURCE,
    SANDBOX_FORWARDER,
    SANDBOX_SOCKET,
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
    SandboxSpec,
    home_relative,
)
from worker.sandbox.launcher import launcher_argv

BACKEND_NAME = "docker"
LABEL_SANDBOX = "acpw.sandbox"
LABEL_BACKEND = "acpw.backend"
#: JSON list of the mask mount points ``create`` made (workspace-relative) and the host
#: workspace they are in: what ``destroy`` removes, from any process.
LABEL_MASK_POINTS = "acpw.mask_points"
LABEL_WORKSPACE = "acpw.workspace"
#: The host directory of the network proxy's socket (``allowlist`` only).
LABEL_PROXY_DIR = "acpw.proxy_dir"
INTERNAL_LABELS = frozenset({LABEL_MASK_POINTS, LABEL_WORKSPACE, LABEL_PROXY_DIR})
DEV_NULL = "/dev/null"
HOSTNAME = "acpw"
SANDBOX_TMP = "/tmp"  # noqa: S108 - the container's private tmpfs
TMPFS_BYTES = 256 * 1024 * 1024
# Labels a container inherits from its image; not part of what the sandbox was given.
_IMAGE_LABEL_PREFIXES = ("acpw.image.", "acpw.base.", "acpw.pack.", "io.buildah.", "org.")


def sandbox_labels(spec: SandboxSpec, worker_id: str, sandbox_id: str) -> dict[str, str]:
    """The spec's labels plus job, attempt, worker, sandbox id and backend."""
    labels = {LABEL_WORKER: worker_id, **spec.labels}
    labels[LABEL_JOB] = spec.job_id
    labels[LABEL_ATTEMPT] = str(spec.attempt)
    labels[LABEL_SANDBOX] = sandbox_id
    labels[LABEL_BACKEND] = BACKEND_NAME
    return labels


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


def container_config(
    api: Any,
    spec: SandboxSpec,
    plan: ImagePlan,
    labels: Mapping[str, str],
    *,
    podman: bool,
    masks: Sequence[MaskEntry] = (),
) -> dict[str, object]:
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
    config: dict[str, object] = api.create_container_config(
        plan.image_id,
        command=launcher_argv(),
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
    targets = {mount.target for mount in spec.state_mounts}
    for mount in spec.state_mounts:
        parts = home_relative(mount.target).split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = f"{HOME}/{'/'.join(parts[:depth])}"
            if parent not in targets:  # a mount of its own (the pack's HOME files)
                parents[parent] = home
    return parents


def own_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in labels.items()
        if not k.startswith(_IMAGE_LABEL_PREFIXES) and k not in INTERNAL_LABELS
    }


def ensure_mask_points(workspace: Path, masks: Sequence[MaskEntry]) -> list[str]:
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


def remove_mask_points(labels: Mapping[str, str]) -> None:
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


def own_workspace(workspace: Path) -> None:
    """Give the (private, staged) workspace to the sandbox user, as it runs as 1000.

    A no-op when the runner already staged it with that owner.
    """
    if workspace.stat().st_uid == SANDBOX_UID:
        return
    os.chown(workspace, SANDBOX_UID, SANDBOX_GID)
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), SANDBOX_UID, SANDBOX_GID)
