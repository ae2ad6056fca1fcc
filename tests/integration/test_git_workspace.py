"""Git workspaces: a real repository on the host, cloned by ref and by commit."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from worker.errors import InvalidJobSpec, WorkspaceUnavailable
from worker.jobs.spec import GitWorkspace
from worker.workspace import git

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=GIT_ENV
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q", "-b", "main")
    (origin / "a.txt").write_text("one\n")
    _git(origin, "add", ".")
    _git(origin, "commit", "-q", "-m", "one")
    first = _git(origin, "rev-parse", "HEAD")
    (origin / "a.txt").write_text("two\n")
    _git(origin, "commit", "-q", "-am", "two")
    _git(origin, "tag", "v2")
    second = _git(origin, "rev-parse", "HEAD")
    return origin, first, second


def _clone(spec: GitWorkspace, dest: Path, **kw: object) -> str:
    return asyncio.run(
        git.clone(
            spec, dest, token=None, allowed_schemes=("file",), timeout=30, max_bytes=10**8, **kw
        )
    )  # type: ignore[arg-type]


def test_clone_by_ref_is_shallow(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    origin, _, second = repo
    dest = tmp_path / "ws"
    commit = _clone(GitWorkspace(kind="git", url=f"file://{origin}", ref="main"), dest)
    assert commit == second
    assert (dest / "a.txt").read_text() == "two\n"
    assert _git(dest, "rev-list", "--count", "HEAD") == "1"


def test_clone_by_commit(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    origin, first, _ = repo
    dest = tmp_path / "ws"
    assert _clone(GitWorkspace(kind="git", url=f"file://{origin}", commit=first), dest) == first
    assert (dest / "a.txt").read_text() == "one\n"


def test_bad_ref_is_workspace_unavailable(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    origin, _, _ = repo
    with pytest.raises(WorkspaceUnavailable) as info:
        _clone(
            GitWorkspace(kind="git", url=f"file://{origin}", ref="no-such-branch"), tmp_path / "ws"
        )
    assert info.value.details["step"] == "fetch"


def test_token_never_lands_in_git_config(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    origin, _, _ = repo
    dest = tmp_path / "ws"
    asyncio.run(
        git.clone(
            GitWorkspace(kind="git", url=f"file://{origin}", ref="main"),
            dest,
            token="tok-secret-123",
            allowed_schemes=("file",),
            timeout=30,
            max_bytes=10**8,
        )
    )
    basic = base64.b64encode(b"x-access-token:tok-secret-123")
    for path in (dest / ".git").rglob("*"):
        if path.is_file():
            assert b"tok-secret-123" not in path.read_bytes(), path
            assert basic not in path.read_bytes(), path


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% /tmp/pwned",
        "/srv/repo",
        "file:///etc",
        "https://user:pass@example.com/r.git",
    ],
)
def test_refused_urls(url: str) -> None:
    with pytest.raises(InvalidJobSpec):
        git.check_url(url, allowed_schemes=("https",))


def test_repository_size_bound(repo: tuple[Path, str, str], tmp_path: Path) -> None:
    origin, _, _ = repo
    with pytest.raises(WorkspaceUnavailable, match="larger than"):
        asyncio.run(
            git.clone(
                GitWorkspace(kind="git", url=f"file://{origin}", ref="main"),
                tmp_path / "ws",
                token=None,
                allowed_schemes=("file",),
                timeout=30,
                max_bytes=10,
            )
        )


def test_git_job_end_to_end_with_change_capture(
    repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    from tests.integration.test_run_job import _check_stream, _env, _events, _job, run_cli

    origin, _, second = repo
    script = "#!scenario\nwrite a.txt three\n"
    job = _job(tmp_path, script, workspace={"kind": "git", "url": f"file://{origin}", "ref": "v2"})
    env = _env(tmp_path, ACPW_GIT_ALLOWED_SCHEMES=json.dumps(["file"]))
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    _check_stream(events)
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert [(p["path"], p["status"]) for p in changed["paths"]] == [("a.txt", "modified")]
    assert _git(origin, "rev-parse", "HEAD") == second  # the origin is untouched
    assert os.listdir(tmp_path / "work") == []
