"""From two snapshots to the ``workspace.changed`` event and the patch file."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.workspace.capture import Change, Entry, compare, snapshot
from worker.workspace.patch import Patch, build_patch
from worker.workspace.stage import StagedWorkspace

STATUSES = ("added", "modified", "deleted", "mode_changed", "type_changed")


@dataclass(frozen=True, slots=True)
class Captured:
    changes: tuple[Change, ...]
    patch: Patch


def capture(staged: StagedWorkspace, *, inline_limit: int) -> Captured:
    """Compare the workspace now with what it held at the start (call after the agent
    and everything in its sandbox are gone, so nothing changes underneath)."""
    changes = tuple(compare(staged.before, snapshot(staged.path, staged.before)))
    patch = build_patch(
        changes, source=staged.source, workspace=staged.path, inline_limit=inline_limit
    )
    return Captured(changes, patch)


def write_patch(patch: Patch, path: Path) -> dict[str, Any]:
    """Store the patch; returns its reference for the event."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(patch.text)
    return {
        "kind": "file",
        "path": str(path),
        "bytes": len(patch.text),
        "sha256": hashlib.sha256(patch.text).hexdigest(),
        "omitted": list(patch.omitted),
    }


def event_data(
    captured: Captured, patch_ref: dict[str, Any] | None, *, max_paths: int
) -> dict[str, Any]:
    """``workspace.changed`` data: counts, a bounded path list, the patch reference."""
    counts: Counter[str] = Counter(change.status for change in captured.changes)
    omitted = set(captured.patch.omitted)
    listed = [_path(c, omitted) for c in captured.changes[:max_paths]]
    return {
        "counts": {status: counts.get(status, 0) for status in STATUSES},
        "total": len(captured.changes),
        "truncated": len(captured.changes) > max_paths,
        "paths": listed,
        "patch": patch_ref,
    }


def _path(change: Change, omitted: set[str]) -> dict[str, Any]:
    now = change.after or change.before
    assert now is not None
    item: dict[str, Any] = {"path": change.path, "status": change.status, "kind": now.kind}
    item.update(_facts("", change.after))
    if change.before is not None and change.status in ("modified", "mode_changed", "type_changed"):
        item.update(_facts("old_", change.before))
    if now.kind in ("file", "link"):
        item["in_patch"] = change.path not in omitted
    return item


def _facts(prefix: str, entry: Entry | None) -> dict[str, Any]:
    if entry is None:
        return {}
    facts: dict[str, Any] = {f"{prefix}mode": f"{entry.mode:04o}"}
    if entry.kind == "file":
        facts[f"{prefix}size"] = entry.size
        facts[f"{prefix}sha256"] = entry.sha256
    elif entry.kind == "link":
        facts[f"{prefix}target"] = entry.target
    return facts
