"""Every ``notice`` the worker emits, one function per ``code``.

A notice tells the control plane something it should know that is not an event of its
own: input refused, a bound hit, a step skipped. Their codes and ``details`` are part of
the contract, so each is built in exactly one place, here. Text that came from the agent
is bounded before it goes into a notice.
"""

from __future__ import annotations

from typing import Any

from worker.events.bounded import bounded
from worker.events.models import Notice


def event_too_large(type_: str, size: int, limit: int) -> Notice:
    """Sent instead of an event over the size cap (never silently truncated)."""
    return Notice(
        level="warning",
        code="event_too_large",
        message=f"a {type_} event of {size} bytes exceeded the {limit}-byte cap and was not sent",
        details={"type": type_, "bytes": size, "limit": limit},
    )


def subagent_update_refused(session_id: Any, kind: str, reason: str) -> Notice:
    """An update from a session that is not a live subagent of this turn."""
    return Notice(
        level="warning",
        code="subagent_update_refused",
        message=f"a {kind} update was refused ({reason}): it does not come from a "
        "live subagent of this turn",
        details={
            "session_id": bounded(str(session_id), 256)["text"],
            "kind": kind,
            "reason": reason,
        },
    )


def path_outside_workspace(path: str) -> Notice:
    """A location the agent reported outside the workspace, dropped from its event."""
    return Notice(
        level="warning",
        code="path_outside_workspace",
        message="the agent reported a path outside the workspace; it was dropped",
        details={"path": bounded(path, 512)["text"]},
    )


def artifact_refused(path: str, kind: str, reason: str) -> Notice:
    """A file the agent pointed at that is not a regular file inside the workspace."""
    return Notice(
        level="warning",
        code="artifact_refused",
        message=f"the agent referenced a file that is not a regular file inside the "
        f"workspace ({reason}); it was not passed on",
        details={"path": bounded(path, 512)["text"], "kind": kind, "reason": reason},
    )


def interaction_refused(method: str, reason: str, code: str) -> Notice:
    """A ``cursor/*`` question or plan that cannot be presented faithfully: declined."""
    return Notice(
        level="warning",
        code="interaction_refused",
        message=f"{method} was declined: {reason}",
        details={"method": method, "reason": code},
    )


def permission_refused(session_id: Any, tool_call_id: str | None, reason: str) -> Notice:
    """A permission request from outside the session and its live subagents."""
    return Notice(
        level="warning",
        code="permission_refused",
        message=f"a permission request was rejected unasked ({reason}): it does "
        "not come from the session or a live subagent of this turn",
        details={
            "session_id": bounded(str(session_id), 256)["text"],
            "tool_call_id": tool_call_id,
            "reason": reason,
        },
    )


def interaction_unavailable(kind: str, *, cause: str | None = None) -> Notice:
    """An interaction nobody can answer: no channel (no Redis), or ``cause`` (the store
    failed, or the lease was lost while persisting it)."""
    message = cause or (
        f"a {kind} needs an answer from the control plane, but this run has no "
        "interaction channel (no Redis); it was declined"
    )
    return _interaction("interaction_unavailable", message, kind)


def interaction_outside_turn(kind: str) -> Notice:
    """An interaction the agent opened while no turn was running."""
    return _interaction(
        "interaction_outside_turn", f"a {kind} arrived outside a turn; declined", kind
    )


def interaction_too_large(kind: str, size: int, limit: int) -> Notice:
    """An interaction whose event would not fit the event cap: declined, not cut."""
    return _interaction(
        "interaction_too_large",
        f"a {kind} of about {size} bytes cannot be presented within the {limit}-byte event "
        "cap; it was declined, not truncated",
        kind,
    )


def _interaction(code: str, message: str, kind: str) -> Notice:
    return Notice(level="warning", code=code, message=message, details={"kind": kind})
