"""``expect``: what a successful turn must have done, checked from facts alone.

An agent that cannot do the work (no entitlement, an expired key, a policy refusal) may
still end its turn ``end_turn`` with the reason as ordinary assistant text. A job that
declares ``expect`` settles ``failed`` (``expectation_unmet``) when the turn ended without
what it names: tool calls started (the normalizer's count, history replayed by
``session/load`` excluded) and changes captured in the workspace after the sandbox was
destroyed. Nothing reads the agent's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.errors import ExpectationUnmet
from worker.jobs.spec import Expect
from worker.workspace.capture import Change

#: The change statuses that count as "the turn wrote this file".
WRITTEN = frozenset({"added", "modified"})


def unmet(
    expect: Expect | None, *, tool_calls: int, changes: Sequence[Change] | None
) -> ExpectationUnmet | None:
    """The error for what ``expect`` names and the turn did not do, or None.

    ``changes``: what the capture found, or None when there was no capture (it failed,
    or the lease went first): then an expectation about changes is unmet, never assumed.
    """
    if expect is None:
        return None
    unmet_: list[str] = []
    said: list[str] = []
    details: dict[str, object] = {}
    if tool_calls < expect.tool_calls:
        unmet_.append("tool_calls")
        said.append(f"{tool_calls} tool call(s) of at least {expect.tool_calls}")
        details |= {"tool_calls": tool_calls, "expected_tool_calls": expect.tool_calls}
    if (expect.changes or expect.files) and changes is None:
        unmet_.append("changes" if expect.changes else "files")
        said.append("the workspace's changes were not captured")
        details["captured"] = False
    elif changes is not None:
        if expect.changes and not changes:
            unmet_.append("changes")
            said.append("no change in the workspace")
        written = {change.path for change in changes if change.status in WRITTEN}
        missing = [path for path in expect.files if path not in written]
        if missing:
            unmet_.append("files")
            said.append("not added or modified: " + ", ".join(missing))
            details["missing_files"] = missing
    if not unmet_:
        return None
    return ExpectationUnmet(
        "the turn ended without what the job expects: " + "; ".join(said),
        unmet=unmet_,
        **details,
    )
