"""How a job settled: its outcome, the timings of its phases, and the rules between them.

Kept apart from the phases so the pipeline, the turn and the teardown agree on one
``JobOutcome`` and one reading of the agent's stop reasons.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from worker.errors import (
    EXIT_CANCELLED,
    EXIT_SUCCEEDED,
    EXIT_TIMED_OUT,
    AgentError,
    AgentExited,
    OomKilled,
    SandboxError,
    WorkerError,
)
from worker.events.completed import Status
from worker.sandbox.base import ExitDiagnosis

#: How a stop from outside the agent settles the job.
StopStatus = Literal["cancelled", "timed_out"]

#: The agent's stop reasons that mean its turn succeeded.
SUCCESS_STOPS = frozenset({"end_turn", "max_tokens", "max_turn_requests"})


@dataclass(frozen=True, slots=True)
class JobOutcome:
    status: Status
    stop_reason: str | None
    error: WorkerError | None
    exit_code: int


@dataclass(slots=True)
class Timings:
    """Milliseconds per phase (``timings_ms`` of ``job.completed``): each mark measures
    from the previous one, so the phases add up to the job's duration.

    A phase is marked when it ends; one that :meth:`begin` said was under way and that a
    cancel, the deadline or an error cut short is marked by :meth:`cut` (the teardown's
    first step), so it gets its time rather than the teardown after it.
    """

    start: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter)
    _current: str | None = None

    def begin(self, name: str) -> None:
        """Phase ``name`` is under way (it was reached)."""
        self._current = name

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.marks[name] = round((now - self._last) * 1000, 2)
        self._last = now
        self._current = None

    def cut(self) -> None:
        """Mark the phase under way, if one is: it ends here, cut short."""
        if self._current is not None:
            self.mark(self._current)

    def total_ms(self) -> float:
        return round((time.perf_counter() - self.start) * 1000, 2)


class Stopped(Exception):
    """The job was stopped by a cancel (or a lost lease) or its deadline; carries the
    status it settles with and the agent's own stop reason, if it gave one."""

    def __init__(self, status: StopStatus, stop_reason: str | None) -> None:
        super().__init__(status)
        self.status = status
        self.stop_reason = stop_reason


def settled(stop_reason: str) -> JobOutcome:
    """The outcome of a turn the agent ended itself with ``stop_reason``."""
    if stop_reason in SUCCESS_STOPS:
        return JobOutcome("succeeded", stop_reason, None, EXIT_SUCCEEDED)
    if stop_reason == "cancelled":
        error = AgentError("the agent cancelled the turn on its own", stop_reason=stop_reason)
        return JobOutcome("failed", stop_reason, error, error.exit_code)
    error = AgentError(f"the agent stopped with {stop_reason!r}", stop_reason=stop_reason)
    return JobOutcome("failed", stop_reason, error, error.exit_code)


def interrupted(stop: Stopped) -> JobOutcome:
    """The outcome of a job stopped from outside (cancel, lost lease, deadline)."""
    code = EXIT_CANCELLED if stop.status == "cancelled" else EXIT_TIMED_OUT
    return JobOutcome(stop.status, stop.stop_reason, None, code)


def after_agent_exit(
    outcome: JobOutcome, exit_: ExitDiagnosis | None, *, memory_mb: int
) -> JobOutcome:
    """A job that failed because its agent ended (``agent_exited``) says why: the error
    carries the agent's ``exit_code`` or ``signal``; a sandbox that the platform ended
    under the agent (``exit_.sandbox_error``: a pod evicted, past its deadline) makes
    that the job's error, since the agent did not end on its own; and an end by the
    kernel's OOM killer is the job's error ``oom_killed``, naming the bound it hit."""
    error = outcome.error
    if exit_ is None or not isinstance(error, AgentExited):
        return outcome
    details = {**error.details, **exit_.details()}
    if exit_.sandbox_error is not None:
        return _sandbox_ended(outcome, exit_.sandbox_error, details)
    if not exit_.oom_killed:
        error.details = details
        return outcome
    oom = OomKilled(
        f"the kernel killed the agent: its sandbox ran out of memory "
        f"(limits.memory_mb = {memory_mb})",
        **details,
        memory_mb=memory_mb,
    )
    return JobOutcome("failed", outcome.stop_reason, oom, oom.exit_code)


def _sandbox_ended(
    outcome: JobOutcome, cause: SandboxError, agent: dict[str, object]
) -> JobOutcome:
    """``cause`` as the job's error, the agent's end (its ``exit_code`` or ``signal``,
    what it last wrote on stderr) kept in its details beside the platform's own."""
    cause.details = {**agent, **cause.details}
    return JobOutcome("failed", outcome.stop_reason, cause, cause.exit_code)


def after_upload(outcome: JobOutcome, error: WorkerError | None) -> JobOutcome:
    """A turn that succeeded but whose result could not be delivered is not a success:
    the upload error becomes the job's error."""
    return _success_failed_by(outcome, error)


def after_teardown(outcome: JobOutcome, error: WorkerError | None) -> JobOutcome:
    """The outcome once teardown is over. A job whose turn succeeded but that could not be
    torn down failed (its sandbox may live on, its changes may not have been captured): the
    teardown error is its error. One that had failed, been cancelled or timed out already
    keeps its status and error, which say more about the job; ``job.completed`` carries the
    teardown error apart (``teardown_error``) either way, and it is logged."""
    return _success_failed_by(outcome, error)


def after_expectations(outcome: JobOutcome, error: WorkerError | None) -> JobOutcome:
    """A turn the agent ended as a success without what the job's ``expect`` names
    (``worker.job.expect``) failed: ``expectation_unmet`` is the job's error."""
    return _success_failed_by(outcome, error)


def _success_failed_by(outcome: JobOutcome, error: WorkerError | None) -> JobOutcome:
    if error is None or outcome.status != "succeeded":
        return outcome
    return JobOutcome("failed", outcome.stop_reason, error, error.exit_code)


def teardown_error(step: str, exc: Exception) -> WorkerError:
    """The error a failed teardown step leaves in ``job.completed``."""
    if isinstance(exc, WorkerError):
        return exc
    # No message: an exception's text may quote what the agent wrote.
    return SandboxError(
        f"the job's teardown failed at {step}: internal error ({type(exc).__name__})", step=step
    )
