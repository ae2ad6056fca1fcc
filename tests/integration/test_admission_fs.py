"""Workspace config admission against real directory trees (no mocks)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.admission import (
    MAX_SETTINGS_BYTES,
    AdmissionResult,
    Finding,
    check_workspace,
)
from worker.admission.walk import find_git_root
from worker.errors import AdmissionRefused, InvalidInput, WorkspaceUnavailable

NOBODY = 65534


def put(root: Path, rel: str, content: str | bytes = "{}") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    return path


def pairs(result: AdmissionResult) -> set[tuple[str, str]]:
    return {(f.path, f.rule) for f in result.findings}


@pytest.fixture
def sysroot(tmp_path: Path) -> Path:
    root = tmp_path / "sysroot"
    root.mkdir()
    return root


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace that is its own Git root, so nothing outside tmp_path is walked."""
    workspace = tmp_path / "ws"
    (workspace / ".git").mkdir(parents=True)
    return workspace


def check(workspace: Path, sysroot: Path) -> AdmissionResult:
    return check_workspace(workspace, system_roots=[sysroot])


def test_clean_workspace_is_admitted(ws: Path, sysroot: Path) -> None:
    (ws / "src").mkdir()
    put(ws, ".cursor/rules/style.mdc", "be terse")
    result = check(ws, sysroot)
    assert result.admitted
    assert result.findings == ()
    assert result.git_root == ws.resolve()
    result.raise_if_refused()  # no-op when admitted


@pytest.mark.parametrize(
    ("rel", "is_dir", "rule"),
    [
        (".cursor/mcp.json", False, "cursor.mcp"),
        (".cursor/hooks.json", False, "cursor.hooks"),
        (".cursor/plugins", True, "cursor.plugins"),
        (".cursor/extensions", True, "cursor.plugins"),
        (".cursor/plugins", False, "cursor.plugins"),  # any entry where plugins load
        (".mcp.json", False, "mcp.project"),
        (".codex/config.toml", False, "codex.config"),
    ],
)
def test_presence_rules(ws: Path, sysroot: Path, rel: str, is_dir: bool, rule: str) -> None:
    if is_dir:
        (ws / rel).mkdir(parents=True)
    else:
        put(ws, rel, "{}")
    result = check(ws, sysroot)
    assert not result.admitted
    assert pairs(result) == {(rel, rule)}
    assert result.findings[0].reason.endswith(".")


@pytest.mark.parametrize("provider", ["claude", "codex", "cursor", "gemini"])
def test_codex_project_config_is_refused_for_every_provider(
    ws: Path, sysroot: Path, provider: str
) -> None:
    # A workspace is admitted or not on its own: which agent runs it does not matter.
    put(ws, ".codex/config.toml", '[mcp_servers.x]\ncommand = "/bin/sh"\n')
    put(ws, ".codex/prompts/p.md", "other .codex content is admitted")
    result = check_workspace(ws, provider=provider, system_roots=[sysroot])
    assert pairs(result) == {(".codex/config.toml", "codex.config")}


@pytest.mark.parametrize("name", ["settings.json", "settings.local.json"])
@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        (
            "hooks",
            {"PreToolUse": [{"hooks": [{"type": "command", "command": "id"}]}]},
            "claude.hooks",
        ),
        ("plugins", ["evil@market"], "claude.plugins"),
        ("enabledPlugins", {"evil@market": True}, "claude.plugins"),
        ("mcpServers", {"x": {"command": "nc"}}, "claude.mcp"),
        ("enableAllProjectMcpServers", True, "claude.mcp"),
        ("enabledMcpjsonServers", ["x"], "claude.mcp"),
    ],
)
def test_claude_execution_keys_refused(
    ws: Path, sysroot: Path, name: str, key: str, value: object, rule: str
) -> None:
    put(ws, f".claude/{name}", json.dumps({"permissions": {"allow": []}, key: value}))
    result = check(ws, sysroot)
    assert pairs(result) == {(f".claude/{name}", rule)}
    assert repr(key) in result.findings[0].reason


def test_ordinary_claude_settings_admitted(ws: Path, sysroot: Path) -> None:
    ordinary = {
        "permissions": {"allow": ["Bash(npm test)"], "deny": []},
        "env": {"FOO": "1"},
        "model": "sonnet",
        # Present but declaring nothing: admitted.
        "hooks": {},
        "enabledPlugins": {},
        "enableAllProjectMcpServers": False,
        "mcpServers": None,
    }
    put(ws, ".claude/settings.json", json.dumps(ordinary))
    put(ws, ".claude/settings.local.json", "{}")
    assert check(ws, sysroot).admitted


def test_every_declared_key_is_its_own_finding(ws: Path, sysroot: Path) -> None:
    put(ws, ".claude/settings.json", json.dumps({"hooks": {"a": 1}, "enabledPlugins": {"p": 1}}))
    result = check(ws, sysroot)
    assert [f.rule for f in result.findings] == ["claude.hooks", "claude.plugins"]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b"[1, 2]",  # valid JSON, not an object
        b'"hooks"',
        b"\xff\xfe{}",  # not UTF-8
        b'{"hooks": null, "hooks": {"a": 1}}',  # duplicate key: parsers disagree on the winner
        b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to exhaust recursion
    ],
)
def test_invalid_claude_settings_fail_closed(ws: Path, sysroot: Path, content: bytes) -> None:
    put(ws, ".claude/settings.json", content)
    result = check(ws, sysroot)
    assert pairs(result) == {(".claude/settings.json", "config.invalid_json")}


def test_oversized_settings_refused_unread(ws: Path, sysroot: Path) -> None:
    put(ws, ".claude/settings.json", b"{}" + b" " * (MAX_SETTINGS_BYTES - 1))
    assert pairs(check(ws, sysroot)) == {(".claude/settings.json", "config.too_large")}


def test_settings_exactly_at_the_bound_are_read(ws: Path, sysroot: Path) -> None:
    put(ws, ".claude/settings.json", b"{}" + b" " * (MAX_SETTINGS_BYTES - 2))
    assert check(ws, sysroot).admitted


def test_symlinked_cursor_dir_is_refused_and_not_followed(
    tmp_path: Path, ws: Path, sysroot: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, "hooks.json", "{}")
    (ws / ".cursor").symlink_to(elsewhere)
    result = check(ws, sysroot)
    # One finding for the link; nothing behind it is reported, because nothing is followed.
    assert pairs(result) == {(".cursor", "config.symlink")}


def test_symlinked_claude_dir_is_refused(tmp_path: Path, ws: Path, sysroot: Path) -> None:
    (tmp_path / "harmless").mkdir()
    (ws / ".claude").symlink_to(tmp_path / "harmless")
    assert pairs(check(ws, sysroot)) == {(".claude", "config.symlink")}


@pytest.mark.parametrize(
    "rel",
    [
        ".cursor/hooks.json",
        ".cursor/mcp.json",
        ".cursor/plugins",
        ".mcp.json",
        ".claude/settings.json",
        ".claude/settings.local.json",
    ],
)
def test_symlinked_config_file_is_refused(
    tmp_path: Path, ws: Path, sysroot: Path, rel: str
) -> None:
    target = put(tmp_path, "target.json", "{}")  # even a harmless target
    (ws / rel).parent.mkdir(parents=True, exist_ok=True)
    (ws / rel).symlink_to(target)
    assert pairs(check(ws, sysroot)) == {(rel, "config.symlink")}


def test_dangling_symlink_is_refused(ws: Path, sysroot: Path) -> None:
    (ws / ".mcp.json").symlink_to(ws / "does-not-exist")
    assert pairs(check(ws, sysroot)) == {(".mcp.json", "config.symlink")}


@pytest.mark.parametrize(
    "rel",
    [
        ".cursor/hooks.json",
        ".cursor/mcp.json",
        ".mcp.json",
        ".claude/settings.json",
        ".codex/config.toml",
    ],
)
def test_directory_where_a_file_is_expected(ws: Path, sysroot: Path, rel: str) -> None:
    (ws / rel).mkdir(parents=True)
    assert pairs(check(ws, sysroot)) == {(rel, "config.not_regular")}


def test_fifo_settings_refused_without_blocking(ws: Path, sysroot: Path) -> None:
    (ws / ".claude").mkdir()
    os.mkfifo(ws / ".claude/settings.json")  # opening it for reading would block forever
    assert pairs(check(ws, sysroot)) == {(".claude/settings.json", "config.not_regular")}


@pytest.mark.parametrize("name", [".cursor", ".claude", ".codex"])
def test_config_dir_that_is_a_file_is_refused(ws: Path, sysroot: Path, name: str) -> None:
    put(ws, name, "not a directory")
    assert pairs(check(ws, sysroot)) == {(name, "config.not_regular")}


def test_workspace_below_git_root_sees_config_above(tmp_path: Path, sysroot: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    put(repo, ".cursor/mcp.json")
    put(repo, "a/.mcp.json")
    workspace = repo / "a" / "b"
    workspace.mkdir()
    result = check(workspace, sysroot)
    assert result.git_root == repo.resolve()
    assert pairs(result) == {
        ("../../.cursor/mcp.json", "cursor.mcp"),
        ("../.mcp.json", "mcp.project"),
    }


def test_config_above_the_git_root_is_ignored(tmp_path: Path, sysroot: Path) -> None:
    put(tmp_path, "top/.cursor/hooks.json")
    put(tmp_path, "top/.mcp.json")
    repo = tmp_path / "top" / "repo"
    (repo / ".git").mkdir(parents=True)
    assert check(repo, sysroot).admitted


def test_nested_git_root_stops_at_the_inner_root(tmp_path: Path, sysroot: Path) -> None:
    outer = tmp_path / "outer"
    (outer / ".git").mkdir(parents=True)
    put(outer, ".cursor/hooks.json")  # belongs to the outer repo only
    inner = outer / "vendor" / "inner"
    put(inner, ".git", "gitdir: ../../.git/modules/inner\n")  # a submodule's gitfile
    (outer / ".git/modules/inner").mkdir(parents=True)  # ... and its Git directory
    put(inner, ".mcp.json")
    workspace = inner / "pkg"
    workspace.mkdir()
    result = check(workspace, sysroot)
    assert result.git_root == inner.resolve()
    assert pairs(result) == {("../.mcp.json", "mcp.project")}


def test_without_a_git_root_only_the_workspace_is_checked(tmp_path: Path, sysroot: Path) -> None:
    assert find_git_root(tmp_path) is None, "precondition: no .git above the test directory"
    put(tmp_path, "plain/.cursor/hooks.json")
    workspace = tmp_path / "plain" / "ws"
    workspace.mkdir()
    result = check(workspace, sysroot)
    assert result.git_root is None
    assert result.admitted
    put(workspace, ".cursor/hooks.json")
    assert pairs(check(workspace, sysroot)) == {(".cursor/hooks.json", "cursor.hooks")}


def test_workspace_given_through_a_symlink_is_checked_physically(
    tmp_path: Path, ws: Path, sysroot: Path
) -> None:
    put(ws, ".cursor/hooks.json")
    link = tmp_path / "link"
    link.symlink_to(ws)
    result = check(link, sysroot)
    assert result.workspace == ws.resolve()
    assert pairs(result) == {(".cursor/hooks.json", "cursor.hooks")}


def test_enterprise_cursor_hooks_refused(ws: Path, sysroot: Path) -> None:
    hooks = put(sysroot, "etc/cursor/hooks.json", '{"version": 1, "hooks": {}}')
    assert pairs(check(ws, sysroot)) == {(str(hooks), "system.hooks")}


def test_managed_claude_settings_refused_only_with_hooks(ws: Path, sysroot: Path) -> None:
    managed = put(sysroot, "etc/claude-code/managed-settings.json", '{"permissions": {}}')
    assert check(ws, sysroot).admitted
    managed.write_text('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x"}]}]}}')
    assert pairs(check(ws, sysroot)) == {(str(managed), "system.hooks")}
    managed.write_text("{broken")
    assert pairs(check(ws, sysroot)) == {(str(managed), "config.invalid_json")}


def test_every_system_root_is_checked(tmp_path: Path, ws: Path) -> None:
    host, image = tmp_path / "host", tmp_path / "image"
    host.mkdir()
    hooks = put(image, "etc/cursor/hooks.json")
    result = check_workspace(ws, system_roots=[host, image])
    assert pairs(result) == {(str(hooks), "system.hooks")}


def test_system_location_under_a_file_is_absent(ws: Path, sysroot: Path) -> None:
    put(sysroot, "etc/cursor", "a file, so etc/cursor/hooks.json cannot exist")
    assert check(ws, sysroot).admitted


def test_all_findings_are_listed_together(tmp_path: Path, sysroot: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    put(repo, ".mcp.json")
    workspace = repo / "ws"
    put(workspace, ".cursor/mcp.json")
    put(workspace, ".cursor/hooks.json")
    (workspace / ".cursor/plugins").mkdir()
    (workspace / ".cursor/extensions").mkdir()
    put(workspace, ".claude/settings.json", '{"hooks": {"a": 1}, "mcpServers": {"s": {}}}')
    put(workspace, ".claude/settings.local.json", "{oops")
    hooks = put(sysroot, "etc/cursor/hooks.json")
    expected = {
        (".cursor/mcp.json", "cursor.mcp"),
        (".cursor/hooks.json", "cursor.hooks"),
        (".cursor/plugins", "cursor.plugins"),
        (".cursor/extensions", "cursor.plugins"),
        (".claude/settings.json", "claude.hooks"),
        (".claude/settings.json", "claude.mcp"),
        (".claude/settings.local.json", "config.invalid_json"),
        ("../.mcp.json", "mcp.project"),
        (str(hooks), "system.hooks"),
    }
    result = check(workspace, sysroot)
    assert pairs(result) == expected
    assert len(result.findings) == len(expected)
    with pytest.raises(AdmissionRefused) as info:
        result.raise_if_refused()
    assert info.value.code == "admission_refused"
    assert info.value.exit_code == 3
    assert info.value.details["findings"] == [f.to_dict() for f in result.findings]
    assert json.loads(json.dumps(info.value.to_dict()))["details"]["findings"][0]["rule"]


def test_missing_workspace_is_invalid_input(tmp_path: Path, sysroot: Path) -> None:
    with pytest.raises(WorkspaceUnavailable) as info:
        check(tmp_path / "nope", sysroot)
    assert info.value.exit_code == 2


def test_file_as_workspace_is_invalid_input(tmp_path: Path, sysroot: Path) -> None:
    with pytest.raises(WorkspaceUnavailable):
        check(put(tmp_path, "file.txt", "x"), sysroot)


def test_unknown_provider_is_invalid_input(ws: Path, sysroot: Path) -> None:
    with pytest.raises(InvalidInput, match="unknown provider"):
        check_workspace(ws, provider="nope", system_roots=[sysroot])


# --- unreadable config -------------------------------------------------------------------
# Tests run as root, and root's CAP_DAC_OVERRIDE reads a chmod-000 file anyway. So the
# check runs in a forked child that has dropped to uid/gid nobody with setgroups/setgid/
# setuid: the kernel then really denies the read, exactly as for an unprivileged worker.
# When the suite itself is unprivileged, chmod 000 is effective and the check runs inline.


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory nobody can traverse (pytest's tmp_path is mode 0700, root-only)."""
    path = Path(tempfile.mkdtemp(prefix="acpw-admission-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o755)
        shutil.rmtree(path)


def check_unprivileged(workspace: Path, sysroot: Path) -> tuple[int, dict[str, object]]:
    """``(euid, result.to_dict())`` of a check run without the power to bypass permissions."""
    if os.geteuid() != 0:
        return os.geteuid(), check_workspace(workspace, system_roots=[sysroot]).to_dict()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = check_workspace(workspace, system_roots=[sysroot]).to_dict()
            with os.fdopen(write_end, "w") as out:
                json.dump({"euid": os.geteuid(), "result": result}, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        payload = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, "the unprivileged check crashed"
    data = json.loads(payload)
    return data["euid"], data["result"]


def rule_paths(result: dict[str, object]) -> set[tuple[str, str]]:
    findings = result["findings"]
    assert isinstance(findings, list)
    return {(f["path"], f["rule"]) for f in findings}


def test_unreadable_settings_file_is_refused(shared_dir: Path) -> None:
    workspace = shared_dir / "ws"
    (workspace / ".git").mkdir(parents=True)
    put(workspace, ".claude/settings.json", "{}").chmod(0o000)
    euid, result = check_unprivileged(workspace, shared_dir / "sys")
    assert euid != 0
    assert rule_paths(result) == {(".claude/settings.json", "config.unreadable")}


def test_unsearchable_config_dir_refuses_each_path(shared_dir: Path) -> None:
    workspace = shared_dir / "ws"
    (workspace / ".git").mkdir(parents=True)
    (workspace / ".cursor").mkdir()
    (workspace / ".cursor").chmod(0o000)
    euid, result = check_unprivileged(workspace, shared_dir / "sys")
    assert euid != 0
    # Nothing inside can be examined, so no config path inside can be ruled out.
    assert rule_paths(result) == {
        (".cursor/mcp.json", "config.unreadable"),
        (".cursor/hooks.json", "config.unreadable"),
        (".cursor/plugins", "config.unreadable"),
        (".cursor/extensions", "config.unreadable"),
    }


def test_search_only_parent_is_enough_to_admit(shared_dir: Path) -> None:
    repo = shared_dir / "repo"
    (repo / ".git").mkdir(parents=True)
    workspace = repo / "ws"
    workspace.mkdir()
    repo.chmod(0o711)  # traversable, not listable: like many home directories
    euid, result = check_unprivileged(workspace, shared_dir / "sys")
    assert euid != 0
    assert result["admitted"] is True
    assert result["git_root"] == str(repo)


def test_findings_are_frozen_records() -> None:
    finding = Finding(".mcp.json", "mcp.project", "Why.")
    with pytest.raises(AttributeError):
        finding.rule = "other"  # type: ignore[misc]
    assert not hasattr(finding, "__dict__")


# --- what the admission could not judge: notes, and kinds named in words -------------------


def notes(result: AdmissionResult) -> set[tuple[str, str]]:
    return {(n.path, n.code) for n in result.notes}


def test_a_gitfile_pointing_nowhere_is_noted_and_the_walk_goes_on(
    tmp_path: Path, sysroot: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    put(repo, ".cursor/hooks.json")  # above the dangling marker: must still be seen
    workspace = repo / "ws"
    put(workspace, ".git", "gitdir: /nonexistent/.git/worktrees/ws\n")
    result = check(workspace, sysroot)
    assert result.git_root == repo.resolve()
    assert pairs(result) == {("../.cursor/hooks.json", "cursor.hooks")}
    assert notes(result) == {(".git", "git.marker_dangling")}
    (note,) = result.notes
    assert "/nonexistent/.git/worktrees/ws" in note.reason
    assert "went on above it" in note.reason
    with pytest.raises(AdmissionRefused) as info:
        result.raise_if_refused()
    assert info.value.details["notes"] == [note.to_dict()]


def test_a_dangling_marker_alone_admits_with_a_note(tmp_path: Path, sysroot: Path) -> None:
    assert find_git_root(tmp_path) is None, "precondition: no .git above the test directory"
    workspace = tmp_path / "ws"
    put(workspace, ".git", "gitdir: ../missing\n")
    result = check(workspace, sysroot)
    assert result.admitted
    assert result.git_root is None
    assert notes(result) == {(".git", "git.marker_dangling")}
    assert result.to_dict()["notes"] == [result.notes[0].to_dict()]


@pytest.mark.parametrize(
    ("make", "code", "words"),
    [
        (lambda p: p.write_text("not a gitfile\n"), "git.marker_invalid", "not a gitfile"),
        (os.mkfifo, "git.marker_invalid", "Is a FIFO"),
        (lambda p: p.symlink_to("nowhere"), "git.marker_dangling", "symbolic link to 'nowhere'"),
    ],
)
def test_other_markers_that_mark_nothing_are_noted(
    tmp_path: Path, sysroot: Path, make: Any, code: str, words: str
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    workspace = repo / "a" / "ws"
    workspace.mkdir(parents=True)
    put(repo, "a/.mcp.json")
    make(workspace / ".git")
    result = check(workspace, sysroot)
    assert result.git_root == repo.resolve()
    assert pairs(result) == {("../.mcp.json", "mcp.project")}
    assert notes(result) == {(".git", code)}
    assert words in result.notes[0].reason


def test_valid_gitfiles_and_links_mark_the_root_without_a_note(
    tmp_path: Path, sysroot: Path
) -> None:
    outer = tmp_path / "outer"
    (outer / ".git/worktrees/ws").mkdir(parents=True)
    put(outer, ".mcp.json")  # above the worktree's root: not checked
    workspace = outer / "ws"
    put(workspace, ".git", f"gitdir: {outer / '.git/worktrees/ws'}\n")
    result = check(workspace, sysroot)
    assert (result.git_root, result.admitted, result.notes) == (workspace.resolve(), True, ())
    (workspace / ".git").unlink()
    (workspace / ".git").symlink_to("../.git")
    result = check(workspace, sysroot)
    assert (result.git_root, result.admitted, result.notes) == (workspace.resolve(), True, ())


def test_wrong_kinds_are_named_in_words(ws: Path, sysroot: Path) -> None:
    (ws / ".claude").mkdir()
    os.mkfifo(ws / ".claude/settings.json")
    (ws / ".cursor/mcp.json").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(ws / ".mcp.json"))
        reasons = {f.path: f.reason for f in check(ws, sysroot).findings}
    assert "found a FIFO;" in reasons[".claude/settings.json"]
    assert "found a directory;" in reasons[".cursor/mcp.json"]
    assert "found a socket;" in reasons[".mcp.json"]
    assert not any("a other" in r or "a dir;" in r for r in reasons.values())
