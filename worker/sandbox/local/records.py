"""The local backend's sandbox records: one JSON file per sandbox in a state directory.

The record makes ``list`` and ``destroy`` work from another process (a reaper after the
worker died): destroy needs only the record's cgroup paths, never the worker's memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.errors import SandboxError
from worker.sandbox import cgroups, netpolicy
from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_WORKER, SandboxSpec
from worker.sandbox.shared import check_id

DEFAULT_STATE_DIR = Path("/run/acp-worker/sandboxes")


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


def check_local_id(sandbox_id: str) -> None:
    # Ids become paths under the state dir and cgroupfs: refuse anything else.
    check_id(sandbox_id, backend="local")


@contextlib.contextmanager
def translate_oserror(action: str, sandbox_id: str) -> Iterator[None]:
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


def staged_names(spec: SandboxSpec) -> tuple[str, ...]:
    """The names a root worker stages for ``spec`` (see ``staging``), in bind order: no
    proxy socket nor forwarder (it makes the proxy's listeners in the sandbox itself)."""
    extras = (f"x{i}" for i in range(len(spec.extra_mounts)))
    states = (f"s{i}" for i in range(len(spec.state_mounts)))
    return ("workspace", "pack", "etc", "empty", *extras, *states)


def proxy_socket(record: SandboxRecord) -> Path:
    """The host path of the sandbox's proxy socket (``allowlist`` only).

    Raises:
        SandboxError: the sandbox has no proxy.
    """
    if record.proxy_dir is None:
        raise SandboxError("sandbox has no network proxy", sandbox_id=record.sandbox_id)
    return record.proxy_dir / netpolicy.SOCKET_NAME
