"""From a job's workspace spec to a staged private copy (local, git or S3 source).

Every source ends the same way: a pristine tree the worker owns (or, for ``local``, the
caller's directory, read only) and a staged copy for the agent. Admission runs on the
source tree, up to its Git root, before anything is staged.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.admission import Note, check_workspace
from worker.errors import WorkspaceUnavailable
from worker.jobs.spec import GitWorkspace, LocalWorkspace, S3Workspace
from worker.settings import Settings
from worker.workspace import git
from worker.workspace.disk import TEMPLATES, BoundedDisk, mount_bounded
from worker.workspace.stage import StagedWorkspace, remove_staged, stage_local


@dataclass(slots=True)
class Prepared:
    """The staged workspace and everything to delete when the job is over."""

    staged: StagedWorkspace | None = None
    cleanup: list[Path] = field(default_factory=list)
    #: The workspace's own filesystem (inside the job dir; unmounted when that goes).
    disk: BoundedDisk | None = None
    source_info: dict[str, object] = field(default_factory=dict)
    #: What the admission of the source could not judge (it admitted the source).
    admission_notes: tuple[Note, ...] = ()

    async def remove(self) -> None:
        for path in self.cleanup:
            await asyncio.to_thread(remove_staged, path)

    async def keep(self, job_dir: Path, *, until: float) -> Path | None:
        """Keep the staged workspace (drop the rest) until ``until`` (epoch seconds);
        the reaper removes it afterwards. Returns its path."""
        if self.staged is None:
            await self.remove()
            return None
        for path in self.cleanup:
            if path not in (job_dir, self.staged.path):
                await asyncio.to_thread(remove_staged, path)
        labels = read_labels(job_dir) or {}
        await asyncio.to_thread(write_labels, job_dir, {**labels, "keep_until": str(until)})
        return self.staged.path


LABELS_FILE = "labels.json"


def write_labels(job_dir: Path, labels: Mapping[str, str]) -> None:
    """Label a job's work directory (job, attempt, token, worker, pid) for the reaper."""
    tmp = job_dir / f".{LABELS_FILE}.tmp"
    tmp.write_text(json.dumps(dict(labels), sort_keys=True))
    tmp.replace(job_dir / LABELS_FILE)


def read_labels(job_dir: Path) -> dict[str, str] | None:
    try:
        data = json.loads((job_dir / LABELS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


async def prepare_workspace(
    spec: LocalWorkspace | GitWorkspace | S3Workspace,
    prepared: Prepared,
    *,
    settings: Settings,
    job_dir: Path,
    base_dir: Path | None,
    provider: str,
    owner: tuple[int, int],
    secrets: Mapping[str, str],
    disk_mb: int | None = None,
    into: tuple[Path, BoundedDisk | None] | None = None,
) -> StagedWorkspace:
    """Fetch (if remote), admit and stage; ``prepared.cleanup`` grows as paths appear.

    With ``disk_mb`` (and ``settings.workspace_disk`` ``loop``) the copy is staged on a
    filesystem of its own of that size (:mod:`worker.workspace.disk`), which removing
    ``job_dir`` unmounts. ``into``: where the copy goes instead, and the bounded disk it
    is on (a warm slot's, already made: ``worker.job.warm``).

    Raises:
        WorkspaceUnavailable: the source cannot be read or fetched, or does not fit in
            ``disk_mb``.
        AdmissionRefused: the source holds ambient agent configuration.
        SandboxError: the bounded disk cannot be made (``disk_unavailable``/``disk_failed``).
    """
    source = await _source(spec, prepared, settings=settings, job_dir=job_dir,
                           base_dir=base_dir, secrets=secrets)  # fmt: skip
    admission = await asyncio.to_thread(check_workspace, source, provider=provider)
    admission.raise_if_refused()
    prepared.admission_notes = admission.notes
    if into is not None:
        dest, prepared.disk = into
    else:
        dest = await _destination(prepared, settings=settings, job_dir=job_dir, disk_mb=disk_mb)
    prepared.cleanup.append(dest)
    try:
        staged = await asyncio.to_thread(
            stage_local, source, dest, owner=owner, max_depth=settings.workspace_max_depth
        )
    except WorkspaceUnavailable as exc:
        if prepared.disk is not None and exc.details.get("errno") == errno.ENOSPC:
            raise WorkspaceUnavailable(
                f"the workspace does not fit in limits.disk_mb ({disk_mb} MiB)",
                path=str(source),
                disk_mb=disk_mb,
            ) from exc
        raise
    prepared.staged = staged
    return staged


async def _destination(
    prepared: Prepared, *, settings: Settings, job_dir: Path, disk_mb: int | None
) -> Path:
    """Where the copy goes: on its own disk when bounded, else in the job directory."""
    if disk_mb is None or settings.workspace_disk != "loop":
        return job_dir / "workspace"
    templates = settings.cache_dir / TEMPLATES
    prepared.disk = await asyncio.to_thread(
        mount_bounded, job_dir, size_mb=disk_mb, templates=templates
    )
    return prepared.disk.mount / "workspace"


async def _source(
    spec: LocalWorkspace | GitWorkspace | S3Workspace,
    prepared: Prepared,
    *,
    settings: Settings,
    job_dir: Path,
    base_dir: Path | None,
    secrets: Mapping[str, str],
) -> Path:
    if isinstance(spec, LocalWorkspace):
        return _local_source(spec, base_dir, roots=settings.local_workspace_roots)
    target = job_dir / "source"
    prepared.cleanup.append(target)
    if isinstance(spec, GitWorkspace):
        token = secrets.get(spec.credential) if spec.credential else None
        commit = await git.clone(
            spec, target, token=token, allowed_schemes=settings.git_allowed_schemes,
            timeout=settings.git_timeout_s, max_bytes=settings.workspace_max_bytes,
        )  # fmt: skip
        prepared.source_info = {"kind": "git", "commit": commit}
        return target
    return await _s3_source(spec, prepared, settings=settings, target=target)


async def _s3_source(
    spec: S3Workspace, prepared: Prepared, *, settings: Settings, target: Path
) -> Path:
    from worker.workspace import s3  # boto3 is an optional extra

    client = s3.s3_client(settings)
    digest = await asyncio.to_thread(
        s3.fetch_snapshot, client, bucket=spec.bucket, key=spec.key, sha256=spec.sha256,
        dest=target, max_bytes=settings.workspace_max_bytes,
    )  # fmt: skip
    prepared.source_info = {"kind": "s3", "sha256": digest}
    return target


def _local_source(
    spec: LocalWorkspace, base_dir: Path | None, *, roots: tuple[Path, ...] | None = None
) -> Path:
    """The host directory a ``local`` workspace names, resolved (links followed); with
    ``roots`` (``ACPW_LOCAL_WORKSPACE_ROOTS``), only one inside them.

    Raises:
        WorkspaceUnavailable: not a directory, or outside every allowed root.
    """
    raw = Path(spec.path)
    source = raw if raw.is_absolute() or base_dir is None else base_dir / raw
    if not source.is_dir():
        raise WorkspaceUnavailable(f"workspace {spec.path!r} is not a directory", path=spec.path)
    resolved = source.resolve()
    if roots is not None and not any(resolved.is_relative_to(r.resolve()) for r in roots):
        raise WorkspaceUnavailable(
            f"workspace {spec.path!r} is outside the directories this worker serves "
            "local workspaces from (ACPW_LOCAL_WORKSPACE_ROOTS)",
            path=spec.path,
        )
    return resolved
