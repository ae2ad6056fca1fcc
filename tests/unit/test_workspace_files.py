"""The ``WorkspaceFiles`` seam's containment rules: every refusal reason, the pure part
(``files.relative``, which every backend applies before it asks its own file access)
and the host-path implementation the local and docker backends share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.admission import mask_plan
from worker.events.artifacts import Verdict
from worker.sandbox import files
from worker.sandbox.base import WORKSPACE
from worker.sandbox.files import REASONS, PathRefused, relative
from worker.sandbox.hostfiles import HostWorkspaceFiles


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("alpha\n")
    (root / "link.md").symlink_to(root / "docs" / "a.md")
    (root / "linkdir").symlink_to(root / "docs")
    return root


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/workspace", "."),
        ("/workspace/docs/a.md", "docs/a.md"),
        ("docs//./a.md", "docs/a.md"),
        (".cursor/rules/style.md", ".cursor/rules/style.md"),  # an anchor's other content
        ("sub/.cursor/hooks.json", "sub/.cursor/hooks.json"),  # not a level config is read at
    ],
)
def test_admitted_paths_become_workspace_relative(ws: Path, path: str, expected: str) -> None:
    assert relative(path, agent_root=WORKSPACE, masks=mask_plan(ws)) == expected


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("", "invalid_path"),
        ("a\x00b", "invalid_path"),
        ("docs/../docs/a.md", "traversal"),  # refused even though it lands inside
        ("/workspace/../etc/passwd", "traversal"),
        ("/etc/passwd", "outside_workspace"),
        ("/workspacex/a.md", "outside_workspace"),
        ("//workspace/a.md", "outside_workspace"),
        ("/workspace/.cursor/hooks.json", "masked"),
        ("./.cursor//mcp.json", "masked"),
        (".cursor/plugins/p/index.js", "masked"),  # below a masked directory
        (".codex/config.toml", "masked"),  # a directory masked whole
        (".claude/settings.json", "masked"),
    ],
)
def test_the_pure_rules_refuse_with_a_stable_reason(ws: Path, path: str, reason: str) -> None:
    with pytest.raises(PathRefused) as refused:
        relative(path, agent_root=WORKSPACE, masks=mask_plan(ws))
    assert refused.value.reason == reason
    assert reason in REASONS


def test_without_masks_config_paths_are_ordinary(ws: Path) -> None:
    assert relative(".cursor/hooks.json", agent_root=WORKSPACE) == ".cursor/hooks.json"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("link.md", "symlink"),
        ("linkdir/a.md", "symlink"),
        ("missing.md", "missing"),
        ("docs", "not_regular_file"),
        ("/workspace", "not_regular_file"),
        ("/workspace/.cursor/mcp.json", "masked"),
        ("../outside", "traversal"),
    ],
)
def test_host_files_refuse_artifacts_reads_and_writes_alike(
    ws: Path, path: str, reason: str
) -> None:
    host = HostWorkspaceFiles(ws, masks=mask_plan(ws))
    assert host.artifact(path) == Verdict(reason=reason)
    with pytest.raises(PathRefused) as read:
        host.read_text_now(path, limit=1024)
    assert read.value.reason == reason
    if reason != "missing":  # a missing file is what a write creates
        with pytest.raises(PathRefused) as write:
            host.write_text_now(path, "x")
        assert write.value.reason == reason


async def test_host_files_read_write_and_bound_reads(ws: Path) -> None:
    host = HostWorkspaceFiles(ws)
    assert host.artifact("/workspace/docs/a.md") == Verdict("docs/a.md", 6)
    await host.write_text("/workspace/new/deep/b.txt", "beta\n")
    assert await host.read_text("new/deep/b.txt", limit=5) == "beta\n"
    with pytest.raises(PathRefused) as refused:
        await host.read_text("new/deep/b.txt", limit=4)
    assert refused.value.reason == "too_large"
    made = [ws / "new", ws / "new" / "deep", ws / "new" / "deep" / "b.txt"]
    root = os.stat(ws)
    assert [(os.stat(p).st_uid, os.stat(p).st_gid) for p in made] == [
        (root.st_uid, root.st_gid)
    ] * 3


def test_a_write_through_a_linked_folder_creates_nothing(ws: Path) -> None:
    with pytest.raises(PathRefused) as refused:
        HostWorkspaceFiles(ws).write_text_now("linkdir/new.txt", "x")
    assert refused.value.reason == "symlink"
    assert not (ws / "docs" / "new.txt").exists()


async def test_an_unreachable_workspace_refuses_everything(ws: Path) -> None:
    asked: list[bool] = []

    def reachable() -> bool:
        asked.append(True)
        return False

    host = HostWorkspaceFiles(ws, reachable=reachable)
    assert host.artifact("docs/a.md") == Verdict(reason="workspace_not_reachable")
    with pytest.raises(PathRefused) as read:
        await host.read_text("docs/a.md", limit=64)
    with pytest.raises(PathRefused) as write:
        await host.write_text("docs/b.md", "x")
    assert {read.value.reason, write.value.reason} == {"workspace_not_reachable"}
    assert not (ws / "docs" / "b.md").exists()
    assert len(asked) == 3
    # The pure rules come first: a traversal is refused as such, reachable or not.
    assert host.artifact("../x") == Verdict(reason="traversal")


def test_every_reason_is_documented() -> None:
    doc = files.__doc__ or ""
    undocumented = [r for r in REASONS if f"``{r}``" not in doc]
    assert undocumented == []
