"""The ``notice`` events a job's phases emit, as their ``data`` objects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker.errors import ResultUploadFailed
from worker.events.emitter import utc_timestamp
from worker.network import NetworkDenial


def not_launched(status: str, next_phase: str) -> dict[str, Any]:
    what = "cancelled" if status == "cancelled" else "out of time (limits.timeout_s)"
    return {
        "level": "info",
        "code": f"{status}_before_launch",
        "message": f"the job was {what} before {next_phase}; its agent was never started",
        "details": {"next_phase": next_phase},
    }


def unbounded(disk_mb: int) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "workspace_disk_unbounded",
        "message": f"limits.disk_mb ({disk_mb} MiB) is not enforced: this worker runs with "
        "ACPW_WORKSPACE_DISK=off, so the workspace shares the host's disk",
        "details": {"disk_mb": disk_mb},
    }


def skipped(paths: Sequence[str]) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "workspace_special_files_skipped",
        "message": f"{len(paths)} socket/FIFO/device entries of the workspace were not copied",
        "details": {"paths": list(paths[:50])},
    }


def not_destroyed(sandbox_id: str | None) -> dict[str, Any]:
    return {
        "level": "error",
        "code": "sandbox_not_destroyed",
        "message": "the sandbox could not be destroyed: the workspace changes were not "
        "captured, the session was not saved, and the reaper removes the sandbox and the "
        "job's directory later",
        "details": {"sandbox_id": sandbox_id},
    }


def upload_failed(exc: ResultUploadFailed) -> dict[str, Any]:
    return {
        "level": "error",
        "code": exc.code,
        "message": f"the result bundle was not uploaded: {exc.message}",
        "details": dict(exc.details),
    }


def capture_failed(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, OSError):
        reason, path = exc.strerror, str(exc.filename or "")
    else:  # no message: an exception's text may quote what the agent wrote
        reason, path = f"internal error ({type(exc).__name__})", ""
    return {
        "level": "error",
        "code": "capture_failed",
        "message": f"the workspace changes could not be captured: {reason}",
        "details": {"path": path},
    }


def network_denied(denial: NetworkDenial) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "network_denied",
        "message": denial.message,
        "details": {"reason": denial.reason, "target": denial.target, "seq": denial.seq},
    }


def malformed_line(preview: str, reason: str) -> dict[str, Any]:
    return {
        "level": "warning",
        "code": "acp_malformed_line",
        "message": f"the agent wrote a non-JSON-RPC line ({reason}); it was skipped",
        "details": {"preview": preview},
    }


def workspace_kept(path: Path, until: float) -> dict[str, Any]:
    return {
        "level": "info",
        "code": "workspace_kept",
        "message": f"the job's workspace is kept at {path} until the reaper removes it",
        "details": {"path": str(path), "until": utc_timestamp(until)},
    }
