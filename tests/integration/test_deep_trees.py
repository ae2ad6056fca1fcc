"""Directory trees deeper than Python's stack: staged, captured, removed and reaped
without recursion (real bubblewrap, the real emulator pack, real Redis)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.integration.test_run_job import _check_stream, _events, _job, run_cli
from worker.errors import WorkspaceUnavailable
from worker.safetree import remove_tree
from worker.service.reaper import reap_workspaces
from worker.workspace.capture import snapshot
from worker.workspace.prepare import write_labels
from worker.workspace.stage import remove_staged, stage_local

OWNER = (os.getuid(), os.getgid())


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path) -> Iterator[None]:
    yield
    remove_tree(tmp_path)  # pytest's own clean-up of --basetemp recurses once per level


def _nest(root: Path, depth: int) -> Path:
    """``depth`` directories ``d`` inside each other below ``root``; the deepest."""
    deepest = root.joinpath(*["d"] * depth)
    subprocess.run(["mkdir", "-p", str(deepest)], check=True)  # Path.mkdir recurses
    return deepest


def _nest_past_path_max(root: Path, depth: int) -> None:
    # Relative steps: the whole path is longer than PATH_MAX (4096), no single call's is.
    # (a shell's cd gives up there: it changes directory by the whole path)
    root.mkdir(parents=True, exist_ok=True)
    script = (
        "import os, sys\nfor _ in range(int(sys.argv[1])):\n    os.mkdir('d')\n    os.chdir('d')"
    )
    subprocess.run([sys.executable, "-c", script, str(depth)], cwd=root, check=True)


def test_a_job_making_a_tree_deeper_than_pythons_stack_settles(tmp_path: Path) -> None:
    script = "#!scenario\nexec mkdir -p $(printf 'd/%.0s' $(seq 1200)) && echo made\n"
    result = run_cli(tmp_path, "run", str(_job(tmp_path, script)), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    notices = {e["data"]["code"]: e["data"] for e in events if e["type"] == "notice"}
    assert "capture_failed" not in notices
    changed = [e["data"] for e in events if e["type"] == "workspace.changed"]
    if changed:
        assert changed[0]["counts"]["added"] == 1200
        assert changed[0]["paths"][0]["path"] == "d"
    else:  # 500 paths of up to 2400 characters may outgrow the event cap, which says so
        assert notices["event_too_large"]["details"]["type"] == "workspace.changed"
    assert "Traceback" not in result.stderr
    assert list((tmp_path / "work").iterdir()) == []


def test_a_tree_past_path_max_is_a_capture_failed_notice_and_is_removed(tmp_path: Path) -> None:
    script = (
        "#!scenario\nexec for i in $(seq 2100); do mkdir d && cd d || exit 1; done; echo made\n"
    )
    result = run_cli(tmp_path, "run", str(_job(tmp_path, script)), "--json", "--quiet")
    events = _events(result.stdout)
    _check_stream(events)
    notices = [e["data"]["code"] for e in events if e["type"] == "notice"]
    assert "capture_failed" in notices
    assert "workspace.changed" not in [e["type"] for e in events]
    assert list((tmp_path / "work").iterdir()) == []


def test_a_source_deeper_than_the_bound_is_refused_before_launch(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello")
    _nest(tmp_path / "ws", 600)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode != 0
    events = _events(result.stdout)
    error = _check_stream(events)["error"]
    assert error["code"] == "workspace_unavailable"
    assert "more than 256 levels deep" in error["message"]
    assert "sandbox.ready" not in [e["type"] for e in events]
    assert list((tmp_path / "work").iterdir()) == []


def test_the_depth_bound_is_inclusive(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (_nest(src, 256) / "leaf.txt").write_text("deep\n")
    staged = stage_local(src, tmp_path / "ok", owner=OWNER)
    rel = "/".join(["d"] * 256)
    assert staged.before[f"{rel}/leaf.txt"].kind == "file"
    assert (staged.path / rel / "leaf.txt").read_text() == "deep\n"
    assert staged.before == snapshot(staged.path)  # the copy's walk and capture's agree
    (src.joinpath(*["d"] * 256) / "d").mkdir()
    with pytest.raises(WorkspaceUnavailable, match="more than 256 levels") as refused:
        stage_local(src, tmp_path / "deep", owner=OWNER)
    assert refused.value.details["max_depth"] == 256
    assert not (tmp_path / "deep").joinpath(*["d"] * 257).exists()  # stopped before it
    with pytest.raises(WorkspaceUnavailable):
        stage_local(src, tmp_path / "wider", owner=OWNER, max_depth=10)


def test_capture_walks_any_depth_in_order(tmp_path: Path) -> None:
    deepest = _nest(tmp_path / "ws", 1500)
    (deepest / "b").write_text("x")
    os.symlink("/etc", deepest / "a")
    found = snapshot(tmp_path / "ws")
    assert len(found) == 1502
    names = list(found)
    assert names[:2] == ["d", "d/d"]
    assert names[-2:] == ["/".join(["d"] * 1500 + ["a"]), "/".join(["d"] * 1500 + ["b"])]
    assert found[names[-2]].target == "/etc"


def test_remove_tree_follows_no_link_and_enters_locked_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    root = tmp_path / "tree"
    _nest_past_path_max(root, 2100)
    deep = _nest(root / "e", 30)
    os.symlink(outside, deep / "link")
    os.symlink(outside / "keep.txt", root / "file-link")
    (deep / "locked").mkdir()
    (deep / "locked" / "f").write_text("x")
    (deep / "locked").chmod(0)
    deep.chmod(0o500)
    remove_staged(root)
    assert not root.exists()
    assert (outside / "keep.txt").read_text() == "mine"
    remove_tree(root)  # missing is fine


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_remove_tree_refuses_to_empty_another_filesystem(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    point = _nest(root, 3) / "mnt"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=True)
    try:
        (point / "theirs.txt").write_text("not ours to delete")
        with pytest.raises(OSError, match="still mounted"):
            remove_tree(root)
        assert (point / "theirs.txt").exists()
    finally:
        subprocess.run(["umount", str(point)], check=True)
    remove_tree(root)
    assert not root.exists()


def test_the_reaper_removes_a_deep_work_dir_and_goes_on_past_a_bad_one(
    tmp_path: Path, redis_url: str
) -> None:
    work = tmp_path / "work"
    dead = {"acpw.job": "j", "acpw.token": "0", "pid": "0"}
    for name in ("a-deep", "b-bad", "c-plain"):
        (work / name).mkdir(parents=True)
        write_labels(work / name, {**dead, "acpw.job": name})
    _nest(work / "a-deep" / "workspace", 1200).chmod(0o500)
    write_labels(work / "b-bad", {**dead, "keep_until": "not a number"})

    async def reap() -> list[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await reap_workspaces(client, work)
        finally:
            await client.aclose()

    assert asyncio.run(reap()) == ["a-deep", "c-plain"]
    assert [p.name for p in work.iterdir()] == ["b-bad"]
