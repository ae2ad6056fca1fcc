"""Admission in a sandbox pod's view: what the worker reads of the mount table, which
masks it requires, and which paths the copy in and out leave alone (no pod here: the
whole path runs against the API double in tests/integration/test_kubernetes_masks.py)."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError
from worker.sandbox.kubernetes import transfer, view

MASKS = (
    MaskEntry(PurePosixPath(".claude"), MaskKind.ANCHOR),
    MaskEntry(PurePosixPath(".claude/settings.json"), MaskKind.FILE),
    MaskEntry(PurePosixPath(".codex"), MaskKind.DIR),
)
TABLE = """\
22 1 0:50 / / ro,relatime - overlay overlay rw
30 22 0:51 / /workspace rw,nosuid - ext4 /dev/sda rw
31 30 0:52 / /workspace/.claude rw,nosuid - ext4 /dev/sda rw
32 31 0:53 / /workspace/.claude/settings.json ro,nosuid - tmpfs tmpfs ro
33 30 0:53 / /workspace/.codex ro,nosuid - tmpfs tmpfs ro
34 30 0:54 / /workspace/with\\040space rw - tmpfs tmpfs rw
"""


def test_the_mount_table_says_where_and_how() -> None:
    points = view.mounted(TABLE)
    assert points["/workspace/.claude"] is False
    assert points["/workspace/.claude/settings.json"] is True
    assert points["/workspace/with space"] is False
    assert points["/"] is True


def test_masks_in_place_pass() -> None:
    view.check_masks(view.mounted(TABLE), MASKS)


@pytest.mark.parametrize(
    ("line", "missing"),
    [
        ("32 31 0:53 / /workspace/.claude/settings.json ro", ".claude/settings.json"),
        ("33 30 0:53 / /workspace/.codex ro", ".codex"),
        ("31 30 0:52 / /workspace/.claude rw", ".claude"),
    ],
)
def test_a_mask_not_in_place_is_refused(line: str, missing: str) -> None:
    table = "".join(row + "\n" for row in TABLE.splitlines() if not row.startswith(line))
    with pytest.raises(SandboxError) as caught:
        view.check_masks(view.mounted(table), MASKS)
    assert caught.value.details["missing"] == [missing]


def test_a_writable_file_mask_is_not_a_mask() -> None:
    table = TABLE.replace(
        "/workspace/.claude/settings.json ro,", "/workspace/.claude/settings.json rw,"
    )
    with pytest.raises(SandboxError, match="not in place"):
        view.check_masks(view.mounted(table), MASKS)


def test_the_view_reads_config_locations_and_git_markers_alone() -> None:
    markers, config = view.view_paths("cursor")
    assert markers == ["workspace/.git", ".git"]
    assert {"workspace/.cursor", "workspace/.mcp.json", ".claude", "etc/cursor/hooks.json"} <= set(
        config
    )
    # Nothing twice (tar would store the second as a link to the first).
    assert not any(PurePosixPath(b) in PurePosixPath(a).parents for a in config for b in config)


@pytest.mark.parametrize(
    ("rel", "hidden"),
    [
        (".claude/settings.json", True),
        (".codex", True),
        (".codex/config.toml", True),
        (".claude", False),
        (".claude/rules.md", False),
        ("src/.codex.txt", False),
    ],
)
def test_the_copy_leaves_out_what_a_mask_covers(rel: str, hidden: bool) -> None:
    assert transfer.masked(MASKS, rel) is hidden
