"""Agent sessions kept between jobs (see ``worker.sessions.store``)."""

from worker.sessions.copy import Bounds, CopyReport, OverBound, Skipped, copy_tree
from worker.sessions.store import SESSION_ID, JobSessions, SessionStore, check_session_id

__all__ = [
    "SESSION_ID",
    "Bounds",
    "CopyReport",
    "JobSessions",
    "OverBound",
    "SessionStore",
    "Skipped",
    "check_session_id",
    "copy_tree",
]
