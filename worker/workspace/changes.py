"""From two snapshots to the ``workspace.changed`` event and the patch file.

Capture runs under a time budget (``PatchLimits.time_s``, from its start: the walk, then
the patch). The walk always finishes (it reads only what changed since staging, which
``limits.disk_mb`` bounds), so the list of changes is exact; the patch stops at the
deadline, and what it left out is listed, with the reason, in the event and in a
``patch_incomplete`` notice.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TypedDict

from worker.events import notices
from worker.events.models import Notice
from worker.settings import Settings
from worker.workspace.capture import Change, Entry, compare, snapshot
from worker.workspace.patch import Patch, PatchLimits, build_patch
from worker.workspace.stage import StagedWorkspace

EVENT_DATA_BYTES = 160 * 1024
"""Bound on ``workspace.changed`` data, serialized: under the emitter's 196 KiB event cap
(``Settings.event_max_bytes``), with room for the envelope, ``base`` and redaction."""

STATUSES = ("added", "modified", "deleted", "mode_changed", "type_changed")


@dataclass(frozen=True, slots=True)
class Captured:
    changes: tuple[Change, ...]
    patch: Patch
    limits: PatchLimits


def capture_limits(settings: Settings) -> PatchLimits:
    """The patch bounds a worker's settings give."""
    return PatchLimits(
        file_bytes=settings.patch_inline_bytes,
        patch_bytes=settings.patch_max_bytes,
        time_s=settings.capture_timeout_s,
    )


def capture(staged: StagedWorkspace, *, limits: PatchLimits) -> Captured:
    """Compare the workspace now with what it held at the start (call after the agent
    and everything in its sandbox are gone, so nothing changes underneath)."""
    deadline = time.monotonic() + limits.time_s
    changes = tuple(compare(staged.before, snapshot(staged.path, staged.before)))
    patch = build_patch(
        changes, source=staged.source, workspace=staged.path, limits=limits, deadline=deadline
    )
    return Captured(changes, patch, limits)


def write_patch(patch: Patch, path: Path) -> dict[str, object]:
    """Store the patch; returns its reference for the event (:func:`event_data` adds
    what the patch left out)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(patch.text)
    return {
        "kind": "file",
        "path": str(path),
        "bytes": len(patch.text),
        "sha256": hashlib.sha256(patch.text).hexdigest(),
    }


class ChangesData(TypedDict):
    """``workspace.changed`` data, as :func:`event_data` builds it."""

    counts: dict[str, int]
    total: int
    truncated: bool
    paths: list[dict[str, object]]
    patch: dict[str, object] | None


def event_data(
    captured: Captured,
    patch_ref: dict[str, object] | None,
    *,
    max_paths: int,
    max_bytes: int = EVENT_DATA_BYTES,
) -> ChangesData:
    """``workspace.changed`` data: counts, a bounded path list, the patch reference with
    what the patch left out (a path list bounded alike, exact counts by reason).

    Both lists are bounded by count (``max_paths``) and together by size: the data,
    serialized, stays within ``max_bytes`` however long the names are (counts, ``total``
    and the patch reference are always kept; ``truncated`` says the path list is short).
    """
    counts: Counter[str] = Counter(change.status for change in captured.changes)
    omitted = {o.path: o.reason for o in captured.patch.omitted}
    listed = [_path(c, omitted) for c in captured.changes[:max_paths]]
    patch: dict[str, object] | None = None
    left_out: list[str] = []
    if patch_ref is not None:
        patch = {**patch_ref, **_omissions(captured.patch)}
        left_out = [shown(o.path) for o in captured.patch.omitted[:max_paths]]
    data: ChangesData = {
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "total": len(captured.changes),
        "truncated": False,
        "paths": listed,
        "patch": patch,
    }
    return _fit(data, listed, left_out, max_bytes)


def _omissions(patch: Patch) -> dict[str, object]:
    reasons = Counter(o.reason for o in patch.omitted)
    return {
        "complete": patch.complete,
        "omitted": [],  # filled in by _fit, to size
        "omitted_total": len(patch.omitted),
        "omitted_reasons": dict(sorted(reasons.items())),
    }


def _fit(
    data: ChangesData, paths: list[dict[str, object]], omitted: list[str], max_bytes: int
) -> ChangesData:
    """``data`` with the longest prefixes of ``paths`` and of the patch's ``omitted``
    that fit in ``max_bytes``: each list gets half the room, and what one leaves
    unused goes to the other."""
    path_sizes = [_size(item) + 1 for item in paths]  # + 1: the comma
    omitted_sizes = [_size(item) + 1 for item in omitted]
    room = max_bytes - _size({**data, "truncated": True, "paths": [], "patch": _with(data, [])})
    n_paths = _fitting(path_sizes, room // 2)
    n_omitted = _fitting(omitted_sizes, room - sum(path_sizes[:n_paths]))
    n_paths = _fitting(path_sizes, room - sum(omitted_sizes[:n_omitted]))
    return {
        **data,
        "truncated": n_paths < data["total"],
        "paths": paths[:n_paths],
        "patch": _with(data, omitted[:n_omitted]),
    }


def _with(data: ChangesData, omitted: list[str]) -> dict[str, object] | None:
    patch = data["patch"]
    return None if patch is None else {**patch, "omitted": omitted}


def _fitting(sizes: list[int], room: int) -> int:
    """How many of the first ``sizes`` add up to no more than ``room``."""
    return sum(1 for total in accumulate(sizes) if total <= room)


def _size(value: object) -> int:
    """Bytes of ``value`` serialized as the event emitter does (UTF-8, compact)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def incomplete_notice(captured: Captured) -> Notice | None:
    """The ``patch_incomplete`` notice: what the patch left out and why (None when it
    has all)."""
    patch, limits = captured.patch, captured.limits
    if patch.complete:
        return None
    return notices.patch_incomplete(
        reasons=dict(sorted(Counter(o.reason for o in patch.omitted).items())),
        file_bytes=limits.file_bytes,
        patch_bytes=limits.patch_bytes,
        time_s=limits.time_s,
    )


def _path(change: Change, omitted: Mapping[str, str]) -> dict[str, object]:
    now = change.after or change.before
    assert now is not None
    item: dict[str, object] = {"status": change.status, "kind": now.kind}
    item.update(named("path", change.path))
    item.update(_facts("", change.after))
    if change.before is not None and change.status != "added":
        item.update(_facts("old_", change.before))  # a deleted path too: what it was
    if now.kind in ("file", "link") or change.path in omitted:  # a FIFO left out: too
        item["in_patch"] = change.path not in omitted
        if change.path in omitted:
            item["omitted_reason"] = omitted[change.path]
    return item


def _facts(prefix: str, entry: Entry | None) -> dict[str, object]:
    if entry is None:
        return {}
    facts: dict[str, object] = {f"{prefix}mode": f"{entry.mode:04o}"}
    if entry.kind == "file":
        facts[f"{prefix}size"] = entry.size
        facts[f"{prefix}sha256"] = entry.sha256
    elif entry.kind == "link":
        facts.update(named(f"{prefix}target", entry.target or ""))
    return facts


def named(key: str, name: str) -> dict[str, object]:
    """``{key: name}``; a name that is not UTF-8 (its bytes arrive as surrogates) with
    those bytes as ``\\xNN`` and ``<key>_escaped``: an event is UTF-8 JSON."""
    text = shown(name)
    return {key: text} if text == name else {key: text, f"{key}_escaped": True}


def shown(name: str) -> str:
    """``name`` as UTF-8 text: the bytes of a name that is not UTF-8 as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
