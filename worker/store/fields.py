"""The field names of a job's state hash ``acpw:{J}:state``, and the statuses it records.

These names are part of the public contract (``acp-worker status --json`` prints the
hash, a control plane may read it): every Python reader and writer takes them from here,
and the Lua programs under ``lua/`` spell the same names (a unit test checks that every
name those programs use is one of these).

    attempt     current attempt number          status      queued|running|<terminal>
    fence       last fencing token issued       token       token of the current owner
    worker      current owner's worker id       ev_attempt  attempt of the last event
    ev_seq      seq of the last event written   started_at / settled_at (ms)
    job         the job spec (JSON) of the current attempt
    submitted_at    when ``submit`` recorded the attempt (ms)
    enqueued    ``1`` once ``submit`` queued the attempt's message
    enqueue_claim   ``<claim id> <lapses at ms>``: a ``submit`` or ``requeue`` is publishing it
    spec_digest     digest of the current attempt's canonical job spec
    attempt_after   stream id after which the current attempt's events begin
    events_trimmed_until    id of the last event trimmed off the stream (absent: none)
    duplicates  deliveries refused since the job began; last_refusal: the last one's reason
    ev_gap      seqs of the current attempt a Redis failover lost for good (``from-to``, …)
"""

from __future__ import annotations

from typing import Final

ATTEMPT: Final = "attempt"
STATUS: Final = "status"
FENCE: Final = "fence"
HOLDER: Final = "token"  # the fencing token of the current owner
WORKER: Final = "worker"
EV_ATTEMPT: Final = "ev_attempt"
EV_SEQ: Final = "ev_seq"
STARTED_AT: Final = "started_at"
SETTLED_AT: Final = "settled_at"
JOB: Final = "job"
SUBMITTED_AT: Final = "submitted_at"
ENQUEUED: Final = "enqueued"
ENQUEUE_CLAIM: Final = "enqueue_claim"
SPEC_DIGEST: Final = "spec_digest"
ATTEMPT_AFTER: Final = "attempt_after"
TRIMMED_UNTIL: Final = "events_trimmed_until"
DUPLICATES: Final = "duplicates"
LAST_REFUSAL: Final = "last_refusal"
EV_GAP: Final = "ev_gap"

ALL: Final = frozenset(
    {
        ATTEMPT,
        STATUS,
        FENCE,
        HOLDER,
        WORKER,
        EV_ATTEMPT,
        EV_SEQ,
        STARTED_AT,
        SETTLED_AT,
        JOB,
        SUBMITTED_AT,
        ENQUEUED,
        ENQUEUE_CLAIM,
        SPEC_DIGEST,
        ATTEMPT_AFTER,
        TRIMMED_UNTIL,
        DUPLICATES,
        LAST_REFUSAL,
        EV_GAP,
    }
)
"""Every field the worker and the client write."""

INTERNAL: Final = frozenset({JOB, HOLDER, FENCE, EV_ATTEMPT, ATTEMPT_AFTER, ENQUEUE_CLAIM})
"""Bookkeeping that ``JobState.to_dict`` (``acp-worker status``) leaves out."""

QUEUED: Final = "queued"
RUNNING: Final = "running"
LOST: Final = "lost"
TERMINAL_STATUSES: Final = frozenset({"succeeded", "failed", "cancelled", "timed_out", LOST})
"""Statuses of a settled attempt (the Lua programs' ``TERMINAL`` table)."""
