"""Staging a local workspace: a faithful private copy that never follows links."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from worker.errors import WorkspaceUnavailable
from worker.jobs.spec import LocalWorkspace
from worker.settings import Settings
from worker.workspace.prepare import Prepared, prepare_workspace
from worker.workspace.stage import remove_staged, stage_local


def test_copy_keeps_content_links_and_drops_special_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print(1)\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o4755)
    os.symlink("/etc/passwd", src / "passwd-link")
    os.mkfifo(src / "pipe")
    staged = stage_local(src, tmp_path / "dst", owner=(os.getuid(), os.getgid()))
    dst = staged.path
    assert (dst / "pkg" / "a.py").read_text() == "print(1)\n"
    assert os.readlink(dst / "passwd-link") == "/etc/passwd"
    assert (dst / "run.sh").stat().st_mode & 0o7777 == 0o755  # set-uid not carried over
    assert not (dst / "pipe").exists()
    assert staged.skipped == ("pipe",)
    assert (staged.files, staged.bytes) == (2, len("print(1)\n") + len("#!/bin/sh\n"))
    remove_staged(dst)
    assert not dst.exists()
    assert (src / "pkg" / "a.py").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_copy_is_owned_by_the_sandbox_owner(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("x")
    dst = stage_local(src, tmp_path / "dst", owner=(61000, 61000)).path
    for path in (dst, dst / "d", dst / "d" / "f"):
        assert (path.stat().st_uid, path.stat().st_gid) == (61000, 61000)


def test_missing_source_is_typed(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceUnavailable):
        stage_local(tmp_path / "nope", tmp_path / "dst", owner=(os.getuid(), os.getgid()))


def _prepare(tmp_path: Path, path: str, roots: tuple[Path, ...] | None) -> Path:
    settings = Settings(local_workspace_roots=roots, work_dir=tmp_path / "work")
    prepared = Prepared()
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    try:
        staged = asyncio.run(
            prepare_workspace(
                LocalWorkspace(path=path),
                prepared,
                settings=settings,
                job_dir=job_dir,
                base_dir=None,
                provider="cursor",
                owner=(os.getuid(), os.getgid()),
                secrets={},
            )
        )
        return staged.path
    finally:
        asyncio.run(prepared.remove())


def test_local_workspaces_only_from_the_allowed_roots(tmp_path: Path) -> None:
    served = tmp_path / "served"
    (served / "repo").mkdir(parents=True)
    (served / "repo" / "a.txt").write_text("a")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not copy")
    (served / "escape").symlink_to(secret)  # a link out of the root counts as outside
    assert _prepare(tmp_path / "1", str(served / "repo"), (served,)).name == "workspace"
    for path in (str(secret), str(served / "escape")):
        with pytest.raises(WorkspaceUnavailable, match="ACPW_LOCAL_WORKSPACE_ROOTS"):
            _prepare(tmp_path / f"2-{len(path)}", path, (served,))
    with pytest.raises(WorkspaceUnavailable, match="ACPW_LOCAL_WORKSPACE_ROOTS"):
        _prepare(tmp_path / "3", str(served / "repo"), ())  # [] refuses every local one
    assert _prepare(tmp_path / "4", str(secret), None).name == "workspace"  # unset: anywhere
