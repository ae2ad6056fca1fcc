"""The sandbox mask plan."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from worker.admission import MASKED_PATHS, MaskEntry, MaskKind, mask_plan
from worker.errors import InvalidInput, WorkspaceUnavailable

LEVEL = [
    (".cursor", MaskKind.ANCHOR),
    (".claude", MaskKind.ANCHOR),
    (".cursor/mcp.json", MaskKind.FILE),
    (".cursor/hooks.json", MaskKind.FILE),
    (".cursor/plugins", MaskKind.DIR),
    (".cursor/extensions", MaskKind.DIR),
    (".mcp.json", MaskKind.FILE),
    (".claude/settings.json", MaskKind.FILE),
    (".claude/settings.local.json", MaskKind.FILE),
    (".codex", MaskKind.DIR),  # masked whole: its config.toml must read as absent
]


def entries(prefix: str) -> list[MaskEntry]:
    return [MaskEntry(PurePosixPath(prefix) / path, kind) for path, kind in LEVEL]


def test_masked_paths_are_the_project_config_paths() -> None:
    assert [str(p) for p in MASKED_PATHS] == [
        ".cursor/mcp.json",
        ".cursor/hooks.json",
        ".cursor/plugins",
        ".cursor/extensions",
        ".mcp.json",
        ".claude/settings.json",
        ".claude/settings.local.json",
        ".codex",
    ]


def test_plan_for_the_workspace_level(tmp_path: Path) -> None:
    assert mask_plan(tmp_path) == entries(".")


def test_every_level_from_cwd_up_to_the_workspace(tmp_path: Path) -> None:
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    (tmp_path / "a" / ".git").mkdir()  # a Git root inside: masked past it anyway
    assert mask_plan(tmp_path, cwd=cwd) == entries(".") + entries("a") + entries("a/b")


def test_anchors_precede_what_they_contain(tmp_path: Path) -> None:
    plan = mask_plan(tmp_path)
    for i, entry in enumerate(plan):
        for parent in entry.path.parents:
            anchor = MaskEntry(parent, MaskKind.ANCHOR)
            assert anchor not in plan[i:]


def test_cwd_outside_the_workspace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "other").mkdir()
    with pytest.raises(InvalidInput, match="outside"):
        mask_plan(tmp_path / "ws", cwd=tmp_path / "other")


def test_missing_workspace(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceUnavailable):
        mask_plan(tmp_path / "missing")
