"""Cloning a job's Git workspace on the worker host, safely.

The repository is untrusted. git runs with no system or global config, an empty HOME,
no terminal prompts, only the allowed transports (never ``ext::``), no hooks and no LFS
or other filter drivers (none are configured; a job asking for LFS is refused by the job
spec), no submodules unless asked, and no automatic gc or maintenance behind the clone.

A credential reaches git only through environment-scoped config, so it is never written
into ``.git/config``; and it is scoped to the job's repository: ``http.<url>.extraHeader``
with the repository URL as ``<url>``. git matches that key against a remote's URL (same
scheme, host and port; a path equal to it or below it at a ``/`` boundary), so a
submodule in another repository (another host or port, or another path on the same host)
is fetched without it. Redirects are not followed (``http.followRedirects=false``): git
applies the header of the URL it started with to every later request, so a redirect to
another host would otherwise carry it there. A URL carrying its own credentials
(``https://TOKEN@host/…``) is refused.

The clone is bounded in time (per git step) and in size *while git runs*: a watchdog
measures the clone directory and kills git's whole process group (remote helpers,
``index-pack``) as soon as it holds more than the bound, so the host's disk sees at most
the bound plus what git writes between two measurements.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from worker.errors import InvalidJobSpec, WorkspaceUnavailable
from worker.jobs.spec import GitWorkspace

_STDERR_PREVIEW = 2048
#: The size watchdog measures at most this often, and waits at least _POLL_SHARE times as
#: long as its last measurement took (so walking a large checkout costs a bounded share).
_POLL_S = 0.1
_POLL_SHARE = 4
#: Only ssh may name a user in its URL (``ssh://git@host/…``: a login name, not a secret).
_USER_SCHEMES = ("ssh",)


def check_url(url: str, *, allowed_schemes: Sequence[str]) -> str:
    """The URL if its transport is allowed and it carries no secret.

    Raises:
        InvalidJobSpec: another transport (``ext::``, a local path, a disallowed scheme),
            credentials inside the URL (any user info but an ssh login name), or a
            wildcard host.
    """
    parts = urlsplit(url)
    if "::" in url.split("/", 1)[0] or parts.scheme not in allowed_schemes:
        raise InvalidJobSpec(
            f"workspace.url: transport not allowed (allowed: {', '.join(allowed_schemes)})",
            fields=["workspace.url"],
        )
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and (parts.scheme not in _USER_SCHEMES or ":" in userinfo):
        raise InvalidJobSpec(
            "workspace.url: credentials inside the URL are refused (a token as the user "
            "name too); bind one with `workspace.credential`",
            fields=["workspace.url"],
        )
    if "*" in host:  # git would read it as a pattern matching other hosts
        raise InvalidJobSpec("workspace.url: a wildcard host is refused", fields=["workspace.url"])
    return url


def git_env(
    *, home: Path, allowed_schemes: Sequence[str], url: str, token: str | None
) -> dict[str, str]:
    """A closed environment for git: nothing from the worker's own; the credential (if
    any) is sent to ``url`` and what lies below it only."""
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
    config = {
        "core.hooksPath": "/dev/null",
        "protocol.file.allow": "user",
        "http.followRedirects": "false",
        # keep every fetched pack as it arrives (index-pack writes it while reading, where
        # the size watchdog sees it); below 100 objects git would use unpack-objects,
        # which holds each object in memory and writes nothing until it is complete
        "fetch.unpackLimit": "1",
        # nothing may keep writing in the clone once git has returned
        "gc.auto": "0",
        "maintenance.auto": "false",
    }
    if token is not None:
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        config[f"http.{url}.extraHeader"] = f"Authorization: Basic {basic}"
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
        WorkspaceUnavailable: the clone failed (bad ref or commit, unreachable, a
            redirect, too slow, too large — git is stopped as soon as ``dest`` holds more
            than ``max_bytes``).
        InvalidJobSpec: the URL is not allowed.
    """
    url = check_url(spec.url, allowed_schemes=allowed_schemes)
    with tempfile.TemporaryDirectory(prefix="acpw-git-home-") as home:
        env = git_env(home=Path(home), allowed_schemes=allowed_schemes, url=url, token=token)
        runner = _Git(env, timeout=timeout, cwd=dest, max_bytes=max_bytes)
        await runner.run("init", "-q", str(dest), here=False)
        await runner.run("remote", "add", "origin", url)
        await runner.run(*_fetch_args(spec))
        await runner.run("checkout", "-q", "--detach", "FETCH_HEAD")
        if spec.submodules:
            await runner.run("submodule", "update", "--init", "--recursive", *_depth(spec))
        commit = (await runner.run("rev-parse", "HEAD")).strip()
    size = await asyncio.to_thread(tree_size, dest, stop_above=max_bytes)
    if size > max_bytes:  # a step that ended between two of the watchdog's measurements
        raise _too_large(max_bytes, size=size, step="clone")
    return commit


def _fetch_args(spec: GitWorkspace) -> list[str]:
    target = spec.commit or spec.ref or "HEAD"
    return ["fetch", "-q", "--no-tags", *_depth(spec), "origin", target]


def _depth(spec: GitWorkspace) -> list[str]:
    return [f"--depth={spec.depth}"] if spec.depth is not None else []


def tree_size(root: Path, *, stop_above: int | None = None) -> int:
    """Apparent bytes of everything but directories below ``root`` (0 if it is missing),
    counted up to the first directory that takes the total above ``stop_above``."""
    total = 0
    pending = [str(root)]
    while pending and (stop_above is None or total <= stop_above):
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            total += sum(_entry_size(entry, pending) for entry in entries)
    return total


def _entry_size(entry: os.DirEntry[str], pending: list[str]) -> int:
    try:
        if entry.is_dir(follow_symlinks=False):
            pending.append(entry.path)
            return 0
        return entry.stat(follow_symlinks=False).st_size
    except OSError:  # git renames and removes its temporary files as it goes
        return 0


def _too_large(max_bytes: int, *, size: int, step: str) -> WorkspaceUnavailable:
    return WorkspaceUnavailable(
        f"the repository is larger than the {max_bytes}-byte bound",
        bound=max_bytes,
        size=size,
        step=step,
    )


class _Git:
    def __init__(
        self, env: Mapping[str, str], *, timeout: float, cwd: Path, max_bytes: int
    ) -> None:
        self._env = dict(env)
        self._timeout = timeout
        self._cwd = cwd
        self._max_bytes = max_bytes

    async def run(self, *args: str, here: bool = True) -> str:
        git = shutil.which("git") or "/usr/bin/git"
        where = ["-C", str(self._cwd)] if here else []
        proc = await asyncio.create_subprocess_exec(
            git, *where, *args, env=self._env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        out, err = await self._finish(proc, args[0])
        if proc.returncode != 0:
            raise WorkspaceUnavailable(
                f"git {args[0]} failed: {_last_line(err)}",
                step=args[0],
                stderr_preview=err[-_STDERR_PREVIEW:].decode("utf-8", "replace"),
            )
        return out.decode("utf-8", "replace")

    async def _finish(self, proc: asyncio.subprocess.Process, step: str) -> tuple[bytes, bytes]:
        """git's output once it exits; its process group is killed if it outgrows the
        size bound, outlasts the timeout, or the caller is cancelled."""
        talk = asyncio.ensure_future(proc.communicate())
        watch = asyncio.ensure_future(self._watch())
        try:
            done, _ = await asyncio.wait(
                (talk, watch), timeout=self._timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            watch.cancel()
            if not talk.done():
                _kill_group(proc)
                await talk
        if watch in done:
            raise _too_large(self._max_bytes, size=watch.result(), step=step)
        if talk not in done:
            raise WorkspaceUnavailable(
                f"git {step} took longer than {self._timeout:g} s", step=step
            )
        return talk.result()

    async def _watch(self) -> int:
        """The size of the clone directory once it is above the bound (never returns
        before)."""
        while True:
            started = time.monotonic()
            size = await asyncio.to_thread(tree_size, self._cwd, stop_above=self._max_bytes)
            if size > self._max_bytes:
                return size
            await asyncio.sleep(max(_POLL_S, _POLL_SHARE * (time.monotonic() - started)))


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL git and everything it started (``start_new_session``: its pid is the
    group's id; the group outlives a leader that exited first)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _last_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "no message"
