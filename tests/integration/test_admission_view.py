"""Admission in another mount view (``check_view``): a root directory standing in for a
container's ``/proc/PID/root``, walked without ever resolving a path against the host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.admission import AdmissionResult, check_view
from worker.admission.probe import NotRegular, open_dir_in_root
from worker.errors import InvalidInput, WorkspaceUnavailable


def put(root: Path, rel: str, content: str = "{}") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def pairs(result: AdmissionResult) -> set[tuple[str, str]]:
    return {(f.path, f.rule) for f in result.findings}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    view = tmp_path / "root"
    (view / "workspace").mkdir(parents=True)
    (view / "etc").mkdir()
    return view


def test_a_clean_view_is_admitted(root: Path) -> None:
    put(root, "workspace/src/main.py", "print(1)")
    result = check_view(root)
    assert result.admitted, result.findings
    assert result.workspace == Path("/workspace")
    assert result.git_root is None


def test_workspace_and_system_findings_read_as_inside(root: Path) -> None:
    put(root, "workspace/.cursor/hooks.json")
    put(root, "etc/cursor/hooks.json")
    assert pairs(check_view(root)) == {
        (".cursor/hooks.json", "cursor.hooks"),
        ("/etc/cursor/hooks.json", "system.hooks"),
    }


def test_levels_above_the_workspace_up_to_a_git_root_in_the_view(root: Path) -> None:
    (root / ".git").mkdir()
    put(root, ".mcp.json")
    result = check_view(root)
    assert pairs(result) == {("../.mcp.json", "mcp.project")}
    assert result.git_root == Path("/")


def test_without_a_git_root_only_the_workspace_level_counts(root: Path) -> None:
    put(root, ".mcp.json")  # the view's root holds no .git: discovery stops at the workspace
    assert check_view(root).admitted


def test_links_resolve_inside_the_view_never_on_the_host(tmp_path: Path, root: Path) -> None:
    host_etc = tmp_path / "host-etc"
    put(host_etc, "cursor/hooks.json")
    (root / "etc").rmdir()
    (root / "etc").symlink_to(host_etc)  # absolute: inside the view it is root/<host_etc>
    assert check_view(root).admitted  # the host's file was not read
    put(root, str(host_etc.relative_to("/")) + "/cursor/hooks.json")
    assert pairs(check_view(root)) == {("/etc/cursor/hooks.json", "system.hooks")}


def test_dot_dot_never_climbs_above_the_view(tmp_path: Path, root: Path) -> None:
    put(tmp_path, "cursor/hooks.json")  # the view's parent: must stay unreachable
    (root / "etc").rmdir()
    (root / "etc").symlink_to("../../../../..")
    put(root, "cursor/hooks.json")  # what `/etc` means inside: the view's root
    assert pairs(check_view(root)) == {("/etc/cursor/hooks.json", "system.hooks")}


def test_a_link_loop_is_a_finding_not_a_hang(root: Path) -> None:
    (root / "etc").rmdir()
    (root / "etc").symlink_to("/etc")
    assert pairs(check_view(root)) == {
        ("/etc/cursor", "config.unreadable"),
        ("/etc/claude-code", "config.unreadable"),
    }


def test_open_dir_in_root_refuses_files_and_missing_parts(root: Path) -> None:
    put(root, "file", "x")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(NotRegular):
            open_dir_in_root(fd, "file/below")
        with pytest.raises(FileNotFoundError):
            open_dir_in_root(fd, "absent")
        inner = open_dir_in_root(fd, "/workspace/../etc/./")
        assert os.stat(inner).st_ino == (root / "etc").stat().st_ino
        os.close(inner)
    finally:
        os.close(fd)


def test_a_symlinked_workspace_resolves_inside_the_view(tmp_path: Path, root: Path) -> None:
    (root / "workspace").rmdir()
    (root / "real").mkdir()
    (root / "workspace").symlink_to("/real")
    put(root, "real/.mcp.json")
    assert pairs(check_view(root)) == {(".mcp.json", "mcp.project")}


def test_a_missing_workspace_or_root_is_unavailable(tmp_path: Path, root: Path) -> None:
    with pytest.raises(WorkspaceUnavailable):
        check_view(root, workspace="/nope")
    with pytest.raises(WorkspaceUnavailable):
        check_view(tmp_path / "absent")
    with pytest.raises(InvalidInput):
        check_view(root, workspace="workspace")


def test_a_gitfile_is_resolved_inside_the_view(root: Path, tmp_path: Path) -> None:
    # The target exists on the host but not in the view: a dangling marker there.
    host_gitdir = tmp_path / "host-gitdir"
    host_gitdir.mkdir()
    (root / ".git").mkdir()
    put(root, ".mcp.json")
    put(root, "workspace/.git", f"gitdir: {host_gitdir}\n")
    result = check_view(root)
    assert result.git_root == Path("/")
    assert pairs(result) == {("../.mcp.json", "mcp.project")}
    assert {(n.path, n.code) for n in result.notes} == {(".git", "git.marker_dangling")}
    # The same path inside the view is a Git directory: the workspace is the root.
    (root / str(host_gitdir).lstrip("/")).mkdir(parents=True)
    result = check_view(root)
    assert (result.git_root, result.admitted, result.notes) == (Path("/workspace"), True, ())
