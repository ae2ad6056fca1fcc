"""Every ``notice`` the worker emits, one function per ``code``.

A notice tells the control plane something it should know that is not an event of its
own: input refused, a bound hit, a step skipped. Their codes and ``details`` are part of
the contract, so each is built in exactly one place, here. Text that came from the agent
is bounded before it goes into a notice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from worker.errors import ResultUploadFailed
from worker.events.bounded import bounded, bounded_json
from worker.events.models import Notice
from worker.rpc.oversize import OversizeLine

#: How many paths a notice lists at most (its ``details`` must stay well under the cap).
LISTED_PATHS = 50


def event_too_large(type_: str, size: int, limit: int) -> Notice:
    """Sent instead of an event over the size cap (never silently truncated)."""
    return Notice(
        level="warning",
        code="event_too_large",
        message=f"a {type_} event of {size} bytes exceeded the {limit}-byte cap and was not sent",
        details={"type": type_, "bytes": size, "limit": limit},
    )


def subagent_update_refused(session_id: object, kind: str, reason: str) -> Notice:
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


def delegation_evicted(
    tool_call_id: str | None, child_id: str | None, state: str, limit: int
) -> Notice:
    """A finished subagent task forgotten to keep the job's task map bounded: a later
    update about it is refused as unknown."""
    return Notice(
        level="info",
        code="delegation_evicted",
        message=f"a finished subagent task was forgotten: a job tracks at most {limit} tasks",
        details={
            "tool_call_id": None if tool_call_id is None else bounded(tool_call_id, 256)["text"],
            "child_id": None if child_id is None else bounded(child_id, 256)["text"],
            "state": state,
            "limit": limit,
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


def permission_refused(session_id: object, tool_call_id: str | None, reason: str) -> Notice:
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


# -- the job's phases -------------------------------------------------------------------


def not_launched(status: Literal["cancelled", "timed_out"], next_phase: str) -> Notice:
    """A cancel (or a lost lease) or the deadline came before the agent was started."""
    what = "cancelled" if status == "cancelled" else "out of time (limits.timeout_s)"
    return Notice(
        level="info",
        code=f"{status}_before_launch",
        message=f"the job was {what} before {next_phase}; its agent was never started",
        details={"next_phase": next_phase},
    )


def handed_back(attempt: int, worker_id: str, grace_s: float) -> Notice:
    """The worker is draining (SIGTERM) and the attempt outlived the drain grace: it is
    stopped and the job queued again as attempt ``attempt + 1`` for another worker."""
    return Notice(
        level="warning",
        code="handed_back",
        message=f"worker {worker_id} is shutting down and attempt {attempt} did not finish "
        f"within its {grace_s:g} s drain grace: it stops here and the job runs again as "
        f"attempt {attempt + 1}",
        details={"next_attempt": attempt + 1, "worker_id": worker_id, "drain_grace_s": grace_s},
    )


def admission_notes(notes: Sequence[Mapping[str, str]]) -> Notice:
    """What the workspace admission could not judge (it admitted the workspace): each
    ``{path, code, reason}``, e.g. a ``.git`` gitfile pointing nowhere."""
    listed = list(notes[:LISTED_PATHS])
    return Notice(
        level="warning",
        code="admission_notes",
        message=f"admission could not judge {len(notes)} thing(s) in the workspace: "
        + "; ".join(f"{n['code']} {n['path']}" for n in listed[:3]),
        details={"notes": listed, "total": len(notes)},
    )


def workspace_special_files_skipped(paths: Sequence[str]) -> Notice:
    """Staging copies no socket, FIFO or device; the first ``LISTED_PATHS`` are named."""
    return Notice(
        level="warning",
        code="workspace_special_files_skipped",
        message=f"{len(paths)} socket/FIFO/device entries of the workspace were not copied",
        details={"paths": list(paths[:LISTED_PATHS])},
    )


def workspace_disk_unbounded(disk_mb: int) -> Notice:
    """``limits.disk_mb`` asked for a bound this worker is configured not to enforce."""
    return Notice(
        level="warning",
        code="workspace_disk_unbounded",
        message=f"limits.disk_mb ({disk_mb} MiB) is not enforced: this worker runs with "
        "ACPW_WORKSPACE_DISK=off, so the workspace shares the host's disk",
        details={"disk_mb": disk_mb},
    )


def model_endpoint(name: str, url: str, *, source: Literal["job", "default"]) -> Notice:
    """The agent was given an operator-declared model endpoint."""
    return Notice(
        level="info",
        code="model_endpoint",
        message=f"the agent's model API is the operator's endpoint {name!r} ({url})",
        details={"name": name, "url": url, "source": source},
    )


def network_denied(*, message: str, reason: str, target: str, seq: int) -> Notice:
    """One request the job's egress proxy refused (its fields, so that this module
    needs nothing of the proxy: ``message`` never contains relayed data)."""
    return Notice(
        level="warning",
        code="network_denied",
        message=message,
        details={"reason": reason, "target": target, "seq": seq},
    )


def acp_malformed_line(preview: str, reason: str) -> Notice:
    """A line from the agent that is not JSON-RPC; ``preview`` is already bounded."""
    return Notice(
        level="warning",
        code="acp_malformed_line",
        message=f"the agent wrote a non-JSON-RPC line ({reason}); it was skipped",
        details={"preview": preview},
    )


def acp_stray_reply(request_id: object, *, duplicate: bool, method: str | None) -> Notice:
    """A valid JSON-RPC reply to no request waiting for one (and not a late reply to one
    the worker gave up on): a second reply to a request answered already, or a reply to
    an id the worker never sent. ``id`` is kept when it is an integer (the worker's ids
    are), else as text (JSON for a non-string) cut to 64 bytes."""
    shown = request_id if type(request_id) is int else bounded_json(request_id, 64)["text"]
    details: dict[str, object] = {"id": shown, "reason": "duplicate" if duplicate else "unknown_id"}
    if duplicate:
        what = f"request {shown}" + (f" ({method})" if method is not None else "")
        message = f"the agent answered {what} again; the repeated reply was skipped"
        if method is not None:
            details["method"] = method
    else:
        message = f"the agent answered id {shown}, which the worker never sent; skipped"
    return Notice(level="warning", code="acp_stray_reply", message=message, details=details)


def oom_killed(memory_mb: int) -> Notice:
    """The kernel killed the agent for want of memory: the job's bound names the fix."""
    return Notice(
        level="error",
        code="oom_killed",
        message=f"the kernel killed the agent: its sandbox ran out of memory "
        f"(limits.memory_mb = {memory_mb})",
        details={"limit": "limits.memory_mb", "memory_mb": memory_mb},
    )


def stdin_eof_unavailable(term_grace_s: float) -> Notice:
    """The agent's stdin cannot be closed (its sandbox's stream has no half-close: a
    Kubernetes API server that negotiated only ``v4.channel.k8s.io``): the agent, which
    would have exited on EOF, is stopped by SIGTERM and, after the grace, SIGKILL."""
    return Notice(
        level="warning",
        code="stdin_eof_unavailable",
        message="the agent's stdin could not be closed (the sandbox's stream has no "
        "half-close): it is stopped by SIGTERM, then SIGKILL",
        details={"term_grace_s": term_grace_s},
    )


def acp_line_skipped(line: OversizeLine, *, tool_event: bool) -> Notice:
    """A line from the agent over ``ACPW_ACP_LINE_LIMIT``, skipped without being read
    whole: its size, what its first bytes told, and what was lost (``tool_event``: a tool
    update's event went out with its output cut to the text its first bytes held).
    ``details`` names only what those bytes showed (absent keys: not readable)."""
    method = None if line.method is None else bounded(line.method, 256)["text"]
    told: dict[str, object] = {
        "method": method,
        "id": line.id if isinstance(line.id, int) else _opt_text(line.id),
        "update": _opt_text(line.update.get("sessionUpdate")),
        "tool_call_id": _opt_text(line.update.get("toolCallId")),
    }
    if line.kind == "unknown":
        what = "its first bytes do not show a JSON-RPC message"
    else:
        what = f"a {method} {line.kind}" if method else f"a {line.kind}"
        what += "" if told["id"] is None else f" (id {told['id']})"
        what += "" if told["update"] is None else f" ({told['update']})"
        what += "" if told["tool_call_id"] is None else f" of tool {told['tool_call_id']}"
    if line.kind == "response":
        lost = "the reply is lost (the request it answers, if pending, failed)"
    elif line.kind == "request" and line.id is not None:
        lost = "the request was answered -32600 unread"
    elif tool_event:
        lost = "its tool event was sent with the output cut to what the line's first bytes held"
    else:
        lost = "its content is lost"
    ended = "" if line.complete else " (the stream ended before its newline)"
    details: dict[str, object] = {
        "bytes": line.size,
        "limit": line.limit,
        "complete": line.complete,
        "kind": line.kind,
        **{key: value for key, value in told.items() if value is not None},
        "tool_event": tool_event,
    }
    return Notice(
        level="warning",
        code="acp_line_skipped",
        message=f"the agent wrote a line of {line.size} bytes{ended}, over the "
        f"{line.limit}-byte bound (ACPW_ACP_LINE_LIMIT); it was skipped: {what}; {lost}",
        details=details,
    )


def _opt_text(value: object) -> str | None:
    return None if value is None else bounded(str(value), 256)["text"]


def results_skipped_lease_lost(skipped: Sequence[str]) -> Notice:
    """The job's lease is gone (another attempt or a reaper owns the job now): the
    teardown steps that write its results (``skipped``) did not run."""
    return Notice(
        level="warning",
        code="results_skipped_lease_lost",
        message="the job's lease is gone, so its results are not this attempt's to "
        f"write: {', '.join(skipped)} skipped",
        details={"skipped": list(skipped)},
    )


def sandbox_not_destroyed(sandbox_id: str | None) -> Notice:
    """The sandbox survived its destroy: what the teardown left undone, and who finishes."""
    return Notice(
        level="error",
        code="sandbox_not_destroyed",
        message="the sandbox could not be destroyed: the workspace changes were not "
        "captured, the session was not saved, and the reaper removes the sandbox and the "
        "job's directory later",
        details={"sandbox_id": sandbox_id},
    )


def workspace_kept(path: str, until: str) -> Notice:
    """The job asked to keep its workspace: where, and until when (``until``: RFC 3339
    UTC, as the emitter stamps events)."""
    return Notice(
        level="info",
        code="workspace_kept",
        message=f"the job's workspace is kept at {path} until the reaper removes it",
        details={"path": path, "until": until},
    )


def capture_failed(exc: Exception) -> Notice:
    """The workspace changes could not be captured; the job settles all the same."""
    if isinstance(exc, OSError):
        reason, path = exc.strerror, str(exc.filename or "")
    else:  # no message: an exception's text may quote what the agent wrote
        reason, path = f"internal error ({type(exc).__name__})", ""
    return Notice(
        level="error",
        code="capture_failed",
        message=f"the workspace changes could not be captured: {reason}",
        details={"path": path},
    )


def result_upload_failed(exc: ResultUploadFailed) -> Notice:
    """The result bundle was not uploaded (said again in ``job.completed``)."""
    return Notice(
        level="error",
        code=exc.code,
        message=f"the result bundle was not uploaded: {exc.message}",
        details=dict(exc.details),
    )


def patch_incomplete(
    *,
    reasons: Mapping[str, int],
    file_bytes: int,
    patch_bytes: int,
    time_s: float,
) -> Notice:
    """The patch leaves changed files out; ``reasons`` counts them by reason (every
    file is still listed in ``workspace.changed``)."""
    total = sum(reasons.values())
    why = ", ".join(f"{count} {reason}" for reason, count in reasons.items())
    message = (
        f"the patch leaves out {total} changed file(s) ({why}); "
        "workspace.changed lists them (files with their size and sha256)"
    )
    if "time_budget" in reasons:
        message = f"change capture ran out of its {time_s:g} s budget: {message}"
    return Notice(
        level="warning",
        code="patch_incomplete",
        message=message,
        details={
            "omitted_total": total,
            "reasons": dict(reasons),
            "file_bytes": file_bytes,
            "patch_bytes": patch_bytes,
            "time_s": time_s,
        },
    )


def session_not_saved(session_id: str, *, reason: str, why: str) -> Notice:
    """The agent's session could not be kept for a resume; the previous one stays."""
    return Notice(
        level="warning",
        code="session_not_saved",
        message=f"session {session_id!r} was not kept for resume: {why}",
        details={"session_id": session_id, "reason": reason},
    )


def session_entries_skipped(
    session_id: str, *, count: int, entries: Sequence[Mapping[str, str]]
) -> Notice:
    """Entries of a kept session that a session copy does not keep (``entries``: the
    first of them, ``{path, kind}``)."""
    return Notice(
        level="warning",
        code="session_entries_skipped",
        message=f"{count} entries of session {session_id!r} were not kept "
        "(only directories and single-link regular files are)",
        details={"session_id": session_id, "count": count, "entries": [dict(e) for e in entries]},
    )


def budget_unenforced(tenant: str, reason: str, why: str) -> Notice:
    """The job ran under a tenant budget that could not bound it: the agent reported no
    cost (``no_cost``), or in another currency than the budget's (``currency``), or the
    budget could not be charged (``unavailable``). Its spend is unknown, not zero."""
    return Notice(
        level="warning",
        code="budget_unenforced",
        message=f"the budget of tenant {tenant!r} did not bound this attempt: {why}",
        details={"tenant": tenant, "reason": reason},
    )


def cost_raising_default(model: str | None, params: Mapping[str, str]) -> Notice:
    """The job left parameters that raise cost (e.g. ``fast=true``) to the agent's
    defaults: never on without saying so (``ACPW_MODEL_PARAMS_REQUIRED`` refuses it)."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    return Notice(
        level="warning",
        code="cost_raising_default",
        message=f"model {model!r} runs with {shown} by the agent's default: name the "
        "parameter in the job to choose",
        details={"model": model, "params": dict(params)},
    )
