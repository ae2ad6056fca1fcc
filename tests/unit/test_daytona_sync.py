"""What comes back from a Daytona sandbox replaces the staged workspace without anything
being listed, entered or moved through a link the agent made (``sync.bring_back``): the
host's files outside the workspace stay where they are, whatever the tar says."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from worker.admission import mask_plan
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.daytona.sync import bring_back


def _spec(workspace: Path) -> SandboxSpec:
    return SandboxSpec(
        job_id="j",
        attempt=1,
        workspace=workspace,
        pack_closure=workspace,
        limits=ResourceLimits(memory_bytes=256 << 20, cpus=1.0, pids=64),
        labels={},
    )


def _tar(path: Path, *members: tuple[str, bytes, str | None]) -> None:
    """(name, data, link target or None) entries; a name ending in / is a directory."""
    with tarfile.open(path, "w") as tar:
        for name, data, target in members:
            info = tarfile.TarInfo(name.rstrip("/"))
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target
            elif name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def test_links_come_back_as_links_and_nothing_is_taken_through_one(tmp_path: Path) -> None:
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    ws = tmp_path / "ws"
    (ws / ".cursor").mkdir(parents=True)
    (ws / ".cursor" / "rules.md").write_text("be nice")
    (ws / "repo-link").symlink_to("README")
    (ws / "README").write_text("old")
    came = tmp_path / "out.tar"
    _tar(
        came,
        ("workspace/", b"", None),
        ("workspace/README", b"new", None),
        ("workspace/repo-link", b"", "README"),  # the repository's own link, unchanged
        ("workspace/etc", b"", str(outside)),  # a link the agent made to the host's /etc
        ("workspace/.cursor", b"", str(outside)),  # a config directory swapped for one
    )
    masked = tuple(mask_plan(ws))
    discarded = bring_back(_spec(ws), came, max_bytes=1 << 20, max_entries=100, masked=masked)
    assert (ws / "README").read_text() == "new"
    assert os.readlink(ws / "repo-link") == "README"
    assert os.readlink(ws / "etc") == str(outside)  # kept as the agent left it, a link
    assert ".cursor" in discarded  # not taken: the host keeps its config directory
    assert (ws / ".cursor").is_dir()
    assert not (ws / ".cursor").is_symlink()
    assert sorted(os.listdir(outside)) == ["passwd"]  # nothing moved out of the host's dir
    assert (outside / "passwd").read_text() == "root:x:0:0"
    assert not [p for p in os.listdir(ws) if p.startswith(".acpw-daytona-")]


def test_a_workspace_that_came_back_as_a_link_is_not_listed_through(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret").write_text("s")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    came = tmp_path / "out.tar"
    _tar(came, ("workspace", b"", str(outside)))
    bring_back(_spec(ws), came, max_bytes=1 << 20, max_entries=100)
    assert os.listdir(outside) == ["secret"]
    assert not (ws / "secret").exists()
