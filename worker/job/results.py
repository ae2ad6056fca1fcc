"""What the agent changed: captured once its sandbox is destroyed, written as a patch,
reported in ``workspace.changed``, and uploaded as a result bundle when the job or the
worker names a bucket."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from worker.errors import ResultUploadFailed
from worker.events import notices
from worker.events.models import WorkspaceChanged
from worker.job.state import JobContext, JobTools, Made, lease_gone, tell_results_skipped
from worker.workspace.bundle import BundleTarget, upload_bundle
from worker.workspace.capture import Change
from worker.workspace.changes import (
    Captured,
    capture,
    capture_limits,
    incomplete_notice,
    write_patch,
)
from worker.workspace.changes import event_data as changes_event
from worker.workspace.stage import StagedWorkspace

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Results:
    """What the capture found (None: it did not finish), the uploaded bundle's reference
    (None: none uploaded) and the upload's failure, if any."""

    changes: tuple[Change, ...] | None = None
    result: dict[str, object] | None = None
    upload_error: ResultUploadFailed | None = None


class Capture:
    """The capture of one job's results; ``results`` says what it got as far as
    recording, even when a later step of it failed (a sink refusing its event, say)."""

    def __init__(self, ctx: JobContext, tools: JobTools, made: Made) -> None:
        self._ctx = ctx
        self._tools = tools
        self._made = made
        self.results = Results()

    async def run(self, workspace: StagedWorkspace) -> None:
        """What the agent changed, measured after nothing in its sandbox can run; a
        capture that fails is a notice, never an exception (the job must still settle)."""
        ctx, settings = self._ctx, self._ctx.settings
        patch_path = settings.results_dir / ctx.spec.job_id / str(ctx.attempt) / "changes.patch"
        try:
            captured = await asyncio.to_thread(capture, workspace, limits=capture_limits(settings))
            ref = None
            if captured.changes:
                ref = await asyncio.to_thread(write_patch, captured.patch, patch_path)
        except Exception as exc:  # any failure (a bug, a pathological tree) still settles
            if await lease_gone(ctx):  # lost meanwhile: a reaper may have removed the tree
                log.warning("the lease of job %s is gone: capture abandoned", ctx.spec.job_id)
                await tell_results_skipped(ctx, ["capture", "bundle_upload"])
                return
            log.exception("change capture failed for job %s", ctx.spec.job_id)
            await ctx.emitter.emit(notices.capture_failed(exc))
            return
        self._tools.timings.mark("capture")
        self.results = Results(changes=captured.changes)
        data = changes_event(captured, ref, max_paths=settings.changed_paths_max)
        base = {"kind": ctx.spec.workspace.kind, **self._made.workspace.source_info}
        await ctx.emitter.emit(WorkspaceChanged(**data, base=base))
        notice = incomplete_notice(captured)
        if notice is not None:
            await ctx.emitter.emit(notice)
        target = bundle_target(ctx)
        if target is None or not captured.changes:
            return
        if await lease_gone(ctx):  # lost while capturing: the bundle is not ours to write
            log.warning("the lease of job %s is gone: bundle_upload skipped", ctx.spec.job_id)
            await tell_results_skipped(ctx, ["bundle_upload"])
            return
        await self._upload(target, captured, workspace)

    async def _upload(
        self, target: BundleTarget, captured: Captured, workspace: StagedWorkspace
    ) -> None:
        from worker.workspace.s3 import s3_client  # boto3 is an optional extra

        ctx = self._ctx
        try:
            ref = await asyncio.to_thread(
                upload_bundle, s3_client(ctx.settings), target, job_id=ctx.spec.job_id,
                attempt=ctx.attempt, captured=captured, workspace=workspace.path,
            )  # fmt: skip
        except ResultUploadFailed as exc:
            # Whatever the job's status: said now, and again in job.completed.
            self.results = replace(self.results, upload_error=exc)
            await ctx.emitter.emit(notices.result_upload_failed(exc))
            return
        self._tools.timings.mark("bundle_upload")
        self.results = replace(self.results, result=ref)


def bundle_target(ctx: JobContext) -> BundleTarget | None:
    """Where the result bundle goes: the job's ``results``, else the worker's bucket."""
    settings = ctx.settings
    if ctx.spec.results is not None:
        bucket, prefix = ctx.spec.results.bucket, ctx.spec.results.prefix
    elif settings.results_bucket is not None:
        bucket, prefix = settings.results_bucket, settings.results_prefix
    else:
        return None
    return BundleTarget(bucket=bucket, prefix=prefix, max_bytes=settings.bundle_max_bytes)
