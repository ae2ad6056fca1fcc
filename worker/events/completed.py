"""The one constructor of ``job.completed``, whoever settles the job.

A job settles in four places: the job's own teardown, the emitter closing a stream a
failed sink cut short, the guarded run refusing an invalid spec, and the reaper marking a
dead owner's job ``lost``. They must agree on the shape the control plane reads, so they
all build it here. Which keys are present is part of that shape: ``timings_ms`` and
``result`` appear only when the settler has them (the reaper's ``lost`` has no
``result``), ``result_error`` and ``teardown_error`` only when that step failed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal

from worker.errors import WorkerError
from worker.events.models import JobCompleted

Status = Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]


class _Absent(enum.Enum):
    ABSENT = enum.auto()


#: ``result=ABSENT``: the key is left out (``None`` is sent as ``null``).
ABSENT = _Absent.ABSENT


def job_completed(
    *,
    status: Status,
    duration_ms: float,
    error: WorkerError | None,
    stop_reason: str | None = None,
    timings_ms: Mapping[str, float] | None = None,
    result: Mapping[str, object] | _Absent | None = ABSENT,
    result_error: WorkerError | None = None,
    teardown_error: WorkerError | None = None,
    usage: Mapping[str, object] | None = None,
) -> JobCompleted:
    """The ``job.completed`` data; ``timings_ms=None`` and ``result=ABSENT`` leave those
    keys out, a ``None`` ``result_error`` / ``teardown_error`` leaves its key out."""
    fields: dict[str, Any] = {
        "status": status,
        "stop_reason": stop_reason,
        "error": None if error is None else error.to_dict(),
        "duration_ms": duration_ms,
    }
    if timings_ms is not None:
        fields["timings_ms"] = dict(timings_ms)
    if result is not ABSENT:
        fields["result"] = result
    if result_error is not None:
        fields["result_error"] = result_error.to_dict()
    if teardown_error is not None:
        fields["teardown_error"] = teardown_error.to_dict()
    if usage is not None:
        fields["usage"] = dict(usage)
    return JobCompleted(**fields)
