"""Every Redis key name acp-worker uses, in one place.

Per-job keys carry the job id inside a literal ``{...}`` Redis Cluster hash tag so that a
cluster keeps all of one job's keys on one slot.
"""

from __future__ import annotations

PREFIX = "acpw"

LEASES = f"{PREFIX}:leases"
"""Sorted set of job ids scored by lease expiry (for the reaper)."""

QUEUED = f"{PREFIX}:queued"
"""Sorted set of job ids whose current attempt's message was published and whose lease
was not taken yet, scored by when it was published (the reaper's stranded-job sweep)."""

STRANDED = f"{PREFIX}:stranded"
"""Sorted set of queued job ids the reaper found without a broker message, scored by when
it first did (a second pass that finds the same requeues the job)."""


def _job(job_id: str, suffix: str) -> str:
    return f"{PREFIX}:{{{job_id}}}:{suffix}"


def events(job_id: str) -> str:
    """Stream of canonical events for the job."""
    return _job(job_id, "events")


def state(job_id: str) -> str:
    """Hash with the job's status, attempt and bookkeeping."""
    return _job(job_id, "state")


def lease(job_id: str) -> str:
    """String holding the current owner's fencing token."""
    return _job(job_id, "lease")


def control(job_id: str) -> str:
    """Stream the control plane writes to: cancel, answers."""
    return _job(job_id, "control")


def interactions(job_id: str) -> str:
    """Hash of durable interactions (questions, plans) by interaction id."""
    return _job(job_id, "interactions")


def settled(job_id: str) -> str:
    """Hash recording the job's last settled attempt (``attempt``, ``status``,
    ``settled_at``); it outlives the other keys and every broker redelivery window, so a
    message of a settled attempt delivered after they expired is refused, never run."""
    return _job(job_id, "settled")


def job_keys(job_id: str) -> list[str]:
    """The per-job keys the Lua programs take, in the order they expect."""
    return [lease(job_id), state(job_id), events(job_id), control(job_id), settled(job_id)]


def budget(tenant: str) -> str:
    """Hash of one tenant's spend budget (``worker.store.budgets``): ``limit``,
    ``per_job``, ``currency``, ``spent``, ``unattributed``."""
    return f"{PREFIX}:budget:{tenant}"


def warm_slot(slot_id: str) -> str:
    """String recording one warm slot (``worker.store.warm``): ``idle <owner>`` while it
    waits, ``claimed <job> <attempt> <token>`` once a job took it; its TTL is the slot's
    lease, renewed by the pool process that holds the slot."""
    return f"{PREFIX}:warm:{{{slot_id}}}"
