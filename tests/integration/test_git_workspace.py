"""Git workspaces: real repositories on the host (``file://``) and behind real smart-HTTP
servers on loopback, cloned by ref and by commit; the credential's scope, the size bound
while git runs, and what is refused."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import git_http
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
        "https://tok-in-user@example.com/r.git",
        "https://:tok@example.com/r.git",
        "https://@example.com/r.git",
        "ssh://git:pass@example.com/r.git",
        "https://*.example.com/r.git",
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


def test_ssh_login_name_is_not_a_credential() -> None:
    url = "ssh://git@example.com/org/r.git"
    assert git.check_url(url, allowed_schemes=("ssh",)) == url


# --- over HTTP: loopback smart-HTTP servers ----------------------------------------------

TOKEN = "tok-9c41e7d2-secret"
BASIC = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()


def _http_clone(
    url: str,
    dest: Path,
    *,
    token: str | None = TOKEN,
    timeout: float = 30,
    max_bytes: int = 10**8,
    **spec: object,
) -> str:
    return asyncio.run(
        git.clone(
            GitWorkspace(kind="git", url=url, ref="main", **spec),  # type: ignore[arg-type]
            dest,
            token=token,
            allowed_schemes=("http",),
            timeout=timeout,
            max_bytes=max_bytes,
        )
    )


def _work(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    for name, data in files.items():
        (path / name).write_bytes(data)
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "c")
    return path


def _bare(work: Path, bare: Path) -> str:
    """Publish the work tree as the bare repository ``bare``; returns its commit."""
    _git(work.parent, "clone", "-q", "--bare", str(work), str(bare))
    return _git(work, "rev-parse", "HEAD")


def _with_submodules(work: Path, submodules: dict[str, tuple[str, str]]) -> None:
    """Commit gitlinks (path → (url, commit)) in the work tree."""
    (work / ".gitmodules").write_text(
        "".join(
            f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, (u, _) in submodules.items()
        )
    )
    _git(work, "add", ".gitmodules")
    for path, (_, commit) in submodules.items():
        _git(work, "update-index", "--add", "--cacheinfo", f"160000,{commit},{path}")
    _git(work, "commit", "-q", "-m", "submodules")


def _assert_secret_free(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text
        assert BASIC.split()[1] not in text


def _assert_tree_secret_free(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            _assert_secret_free(path.read_bytes().decode("latin-1"))


def test_token_as_url_user_is_refused_before_git_runs(tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    with pytest.raises(InvalidJobSpec, match=r"bind one with `workspace\.credential`") as info:
        _http_clone(f"http://{TOKEN}@127.0.0.1:9/r.git", dest, token=None)
    _assert_secret_free(json.dumps(info.value.to_dict()))
    assert not dest.exists()


Servers = tuple[git_http.GitHttpServer, git_http.GitHttpServer]


@pytest.fixture
def http_repos(tmp_path: Path) -> Iterator[Servers]:
    """``super.git`` on server A with two submodules: ``other.git`` on A (same origin,
    another repository) and ``sub.git`` on server B (another port: another origin)."""
    a_root, b_root = tmp_path / "srv-a", tmp_path / "srv-b"
    a_root.mkdir()
    b_root.mkdir()
    with git_http.serve(a_root) as a, git_http.serve(b_root) as b:
        sub = _bare(_work(tmp_path / "w-sub", {"s.txt": b"sub\n"}), b_root / "sub.git")
        other = _bare(_work(tmp_path / "w-other", {"o.txt": b"other\n"}), a_root / "other.git")
        work = _work(tmp_path / "w-super", {"a.txt": b"super\n"})
        _with_submodules(
            work, {"sub": (f"{b.url}/sub.git", sub), "other": (f"{a.url}/other.git", other)}
        )
        _bare(work, a_root / "super.git")
        yield a, b


def _assert_only_the_repository_saw_it(
    a: git_http.GitHttpServer, b: git_http.GitHttpServer
) -> None:
    mine = [s for s in a.seen if s.path.startswith("/super.git/")]
    others = [s for s in [*a.seen, *b.seen] if s not in mine]
    assert mine
    assert {s.authorization for s in mine} == {BASIC}
    assert {s.path.split("/")[1] for s in others} == {"other.git", "sub.git"}
    assert [s for s in others if s.authorization is not None] == []


def test_credential_reaches_the_repository_only(http_repos: Servers, tmp_path: Path) -> None:
    a, b = http_repos
    dest = tmp_path / "ws"
    _http_clone(f"{a.url}/super.git", dest, submodules=True)
    assert (dest / "sub" / "s.txt").read_text() == "sub\n"
    assert (dest / "other" / "o.txt").read_text() == "other\n"
    _assert_only_the_repository_saw_it(a, b)
    _assert_tree_secret_free(dest)  # .git/config and .git/modules/*/config included


def test_redirect_is_not_followed_and_carries_no_credential(
    http_repos: Servers, tmp_path: Path
) -> None:
    a, _ = http_repos
    with (
        git_http.serve(tmp_path, redirect_to=a.url) as moved,
        pytest.raises(WorkspaceUnavailable, match="302") as info,
    ):
        _http_clone(f"{moved.url}/super.git", tmp_path / "ws")
    assert info.value.details["step"] == "fetch"
    assert [s.path for s in moved.seen] == ["/super.git/info/refs?service=git-upload-pack"]
    assert a.seen == []  # with followRedirects=initial, git sends it the header
    _assert_secret_free(json.dumps(info.value.to_dict()))


def test_git_job_with_credential_leaks_it_nowhere(http_repos: Servers, tmp_path: Path) -> None:
    from tests.integration.test_run_job import _check_stream, _env, _events, _job, run_cli

    a, b = http_repos
    workspace = {"kind": "git", "url": f"{a.url}/super.git", "ref": "main",
                 "submodules": True, "credential": "GIT_TOKEN"}  # fmt: skip
    job = _job(tmp_path, "#!scenario\nwrite a.txt changed\n", workspace=workspace)
    spec = json.loads(job.read_text())
    spec["credentials"]["GIT_TOKEN"] = "file:git"
    job.write_text(json.dumps(spec))
    (tmp_path / "secrets" / "git").write_text(TOKEN + "\n")
    events = tmp_path / "events.jsonl"
    env = _env(tmp_path, ACPW_GIT_ALLOWED_SCHEMES=json.dumps(["http"]))
    result = run_cli(tmp_path, "run", str(job), "--json", "--events-out", str(events), env=env)
    assert result.returncode == 0, result.stderr
    assert _check_stream(_events(result.stdout))["status"] == "succeeded"
    _assert_only_the_repository_saw_it(a, b)
    _assert_secret_free(result.stdout, result.stderr, events.read_text())


# --- the size bound while git runs; git stopped as a whole --------------------------------

BIG = 16 * 1024 * 1024
BOUND = 1024 * 1024
#: What git may write past the bound before the watchdog sees it: the server sends
#: 16 KiB per 10 ms (≈1.6 MB/s) and the watchdog measures every 0.1 s; generous.
SLACK = 1024 * 1024


@pytest.fixture
def big_repo(tmp_path: Path) -> Path:
    """A server root holding ``big.git``: one 16 MiB incompressible file."""
    root = tmp_path / "srv"
    root.mkdir()
    _bare(_work(tmp_path / "w-big", {"big.bin": os.urandom(BIG)}), root / "big.git")
    return root


def _left_running(marker: str) -> list[str]:
    """Processes whose command line mentions ``marker`` (a server's unique URL)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
    return found


def _assert_client_went_away(server: git_http.GitHttpServer) -> None:
    """The server saw its client go away mid-response (git did not finish the fetch),
    and no git process for it is left."""
    for _ in range(200):
        if server.aborted:
            break
        time.sleep(0.05)
    assert server.aborted
    assert server.sent < BIG
    assert _left_running(server.url) == []


def test_fetch_is_stopped_at_the_size_bound(big_repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ws"
    with git_http.serve(big_repo, chunk_delay=0.01) as server:
        with pytest.raises(WorkspaceUnavailable, match="larger than") as info:
            _http_clone(f"{server.url}/big.git", dest, token=None, max_bytes=BOUND)
        _assert_client_went_away(server)
    assert info.value.details["step"] == "fetch"
    assert BOUND < info.value.details["size"] <= BOUND + SLACK
    assert git.tree_size(dest) <= BOUND + SLACK  # nothing more was written after the kill
    assert list((dest / ".git" / "objects" / "pack").glob("pack-*.pack")) == []


def test_slow_fetch_times_out_and_git_is_killed(big_repo: Path, tmp_path: Path) -> None:
    with git_http.serve(big_repo, chunk_delay=0.05) as server:
        with pytest.raises(WorkspaceUnavailable, match="took longer") as info:
            _http_clone(f"{server.url}/big.git", tmp_path / "ws", token=None, timeout=1)
        _assert_client_went_away(server)
    assert info.value.details["step"] == "fetch"


def test_cancelled_clone_kills_git(big_repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ws"

    async def clone_then_cancel(url: str) -> None:
        spec = GitWorkspace(kind="git", url=url, ref="main")
        task = asyncio.create_task(
            git.clone(spec, dest, token=None, allowed_schemes=("http",), timeout=120,
                      max_bytes=10**9)
        )  # fmt: skip
        while git.tree_size(dest / ".git" / "objects" / "pack") == 0:
            await asyncio.sleep(0.02)  # until the pack is arriving
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with git_http.serve(big_repo, chunk_delay=0.05) as server:
        asyncio.run(clone_then_cancel(f"{server.url}/big.git"))
        _assert_client_went_away(server)
