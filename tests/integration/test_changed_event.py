"""``workspace.changed`` stays under the event cap whatever the agent names its files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from worker.settings import Settings
from worker.workspace.changes import capture, event_data, write_patch
from worker.workspace.patch import PatchLimits
from worker.workspace.stage import stage_local

OWNER = (os.getuid(), os.getgid())


def test_long_names_keep_the_event_under_its_cap(tmp_path: Path) -> None:
    """600 new files with 254-character names, most left out of a small patch: the
    lists are shortened to fit (this event was 206 524 bytes, over the 196 KiB cap, and
    was replaced by an event_too_large notice); counts, total and the patch reference
    stay whole."""
    source = tmp_path / "source"
    source.mkdir()
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    names = [f"{i:03}" + "n" * 251 for i in range(600)]
    for name in names:
        (staged.path / name).write_text("x\n")
    captured = capture(staged, limits=PatchLimits(file_bytes=1024, patch_bytes=4096))
    ref = write_patch(captured.patch, tmp_path / "out" / "changes.patch")
    data = event_data(captured, ref, max_paths=500)
    data["base"] = {"kind": "local"}
    event = {"v": 1, "job_id": "j" * 128, "attempt": 1, "seq": 10**6, "ts": "x" * 32,
             "type": "workspace.changed", "data": data}  # fmt: skip
    assert len(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()) <= (
        Settings().event_max_bytes
    )
    assert (data["total"], data["counts"]["added"], data["truncated"]) == (600, 600, True)
    assert 0 < len(data["paths"]) < 500
    assert [p["path"] for p in data["paths"]] == names[: len(data["paths"])]
    patch = data["patch"]
    assert {k: patch[k] for k in ("path", "bytes", "sha256")} == {
        k: ref[k] for k in ("path", "bytes", "sha256")
    }
    assert patch["omitted_total"] == len(captured.patch.omitted) > 500
    assert patch["omitted_reasons"] == {"patch_full": patch["omitted_total"]}
    assert 0 < len(patch["omitted"]) < 500
    omitted = [o.path for o in captured.patch.omitted]
    assert patch["omitted"] == omitted[: len(patch["omitted"])]
    # Under the bound, the count bound alone applies, as before.
    short = event_data(captured, ref, max_paths=10)
    assert (len(short["paths"]), len(short["patch"]["omitted"])) == (10, 10)
