"""Agent sessions kept between jobs (see ``worker.sessions.store``)."""

from worker.sessions.store import (
    SESSION_ID,
    JobSessions,
    SessionStore,
    check_session_id,
    reap_sessions,
)

__all__ = [
    "SESSION_ID",
    "JobSessions",
    "SessionStore",
    "check_session_id",
    "reap_sessions",
]
