"""Cloning a job's Git workspace on the worker host, safely.

The repository is untrusted. git runs with no system or global config, an empty HOME,
no terminal prompts, only the allowed transports (never ``ext::``), no hooks and no LFS
or other filter drivers (none are configured), no submodules unless asked. A credential
reaches git only through environment-scoped config (``http.extraHeader``), so it is never
written into ``.git/config``. The clone is bounded in time and size.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from worker.errors import InvalidJobSpec, WorkspaceUnavailable
from worker.jobs.spec import GitWorkspace

_STDERR_PREVIEW = 2048


def check_url(url: str, *, allowed_schemes: Sequence[str]) -> str:
    """The URL if its transport is allowed and it carries no secret.

    Raises:
        InvalidJobSpec: another transport (``ext::``, a local path, a disallowed scheme)
            or a password inside the URL.
    """
    parts = urlsplit(url)
    if "::" in url.split("/", 1)[0] or parts.scheme not in allowed_schemes:
        raise InvalidJobSpec(
            f"workspace.url: transport not allowed (allowed: {', '.join(allowed_schemes)})",
            fields=["workspace.url"],
        )
    if parts.password is not None:
        raise InvalidJobSpec(
            "workspace.url: credentials inside the URL are refused; bind one with "
            "`workspace.credential`",
            fields=["workspace.url"],
        )
    return url


def git_env(*, home: Path, allowed_schemes: Sequence[str], token: str | None) -> dict[str, str]:
    """A closed environment for git: nothing from the worker's own."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": ":".join(allowed_schemes),
        "GIT_LFS_SKIP_SMUDGE": "1",
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes",
        "LANG": "C.UTF-8",
    }
    config = {"core.hooksPath": "/dev/null", "protocol.file.allow": "user"}
    if token is not None:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        config["http.extraHeader"] = f"Authorization: Basic {basic}"
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for index, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


async def clone(
    spec: GitWorkspace,
    dest: Path,
    *,
    token: str | None,
    allowed_schemes: Sequence[str],
    timeout: float,
    max_bytes: int,
) -> str:
    """Clone ``spec`` into the new directory ``dest``; returns the checked-out commit.

    Raises:
        WorkspaceUnavailable: the clone failed (bad ref or commit, unreachable, too slow,
            too large).
        InvalidJobSpec: the URL is not allowed.
    """
    url = check_url(spec.url, allowed_schemes=allowed_schemes)
    with tempfile.TemporaryDirectory(prefix="acpw-git-home-") as home:
        env = git_env(home=Path(home), allowed_schemes=allowed_schemes, token=token)
        runner = _Git(env, timeout=timeout, cwd=dest)
        await runner.run("init", "-q", str(dest), here=False)
        await runner.run("remote", "add", "origin", url)
        await runner.run(*_fetch_args(spec))
        await runner.run("checkout", "-q", "--detach", "FETCH_HEAD")
        if spec.submodules:
            await runner.run("submodule", "update", "--init", "--recursive", *_depth(spec))
        commit = (await runner.run("rev-parse", "HEAD")).strip()
    _check_size(dest, max_bytes)
    return commit


def _fetch_args(spec: GitWorkspace) -> list[str]:
    target = spec.commit or spec.ref or "HEAD"
    return ["fetch", "-q", "--no-tags", *_depth(spec), "origin", target]


def _depth(spec: GitWorkspace) -> list[str]:
    return [f"--depth={spec.depth}"] if spec.depth is not None else []


def _check_size(root: Path, max_bytes: int) -> None:
    total = 0
    for current, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(current, name)).st_size
        if total > max_bytes:
            raise WorkspaceUnavailable(
                f"the repository is larger than the {max_bytes}-byte bound", bound=max_bytes
            )


class _Git:
    def __init__(self, env: Mapping[str, str], *, timeout: float, cwd: Path) -> None:
        self._env = dict(env)
        self._timeout = timeout
        self._cwd = cwd

    async def run(self, *args: str, here: bool = True) -> str:
        git = shutil.which("git") or "/usr/bin/git"
        where = ["-C", str(self._cwd)] if here else []
        proc = await asyncio.create_subprocess_exec(
            git, *where, *args, env=self._env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise WorkspaceUnavailable(
                f"git {args[0]} took longer than {self._timeout:g} s", step=args[0]
            ) from None
        if proc.returncode != 0:
            raise WorkspaceUnavailable(
                f"git {args[0]} failed: {_last_line(err)}",
                step=args[0],
                stderr_preview=err[-_STDERR_PREVIEW:].decode("utf-8", "replace"),
            )
        return out.decode("utf-8", "replace")


def _last_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "no message"
