"""The lease watchdogs of a local backend's sandboxes (see ``worker.sandbox.watchdog``).

``start`` launches one per leased sandbox, in its own session, and rewrites its deadline
file on every lease renewal; ``stop`` removes the file and ends it. Any process that
destroys the sandbox (a reaper) ends it too: the file is gone (``remove``). A sandbox
without a lease gets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox import watchdog
from worker.sandbox.base import LeaseDeadline
from worker.sandbox.cgroups import CgroupSet

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Watchdog:
    proc: asyncio.subprocess.Process
    unfollow: Callable[[], None]


class Watchdogs:
    """The running watchdogs of one backend, by sandbox id; deadline files in ``root``."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._running: dict[str, _Watchdog] = {}

    def deadline_file(self, sandbox_id: str) -> Path:
        return self._root / f"{sandbox_id}.deadline"

    async def start(self, sandbox_id: str, deadline: LeaseDeadline, cgs: CgroupSet) -> None:
        """Bound ``sandbox_id`` by ``deadline``: kill ``cgs`` once it passes unrenewed.

        Raises:
            SandboxError: the watchdog could not be started.
        """
        path = self.deadline_file(sandbox_id)
        try:
            self._root.mkdir(mode=0o700, exist_ok=True)
            watchdog.write_deadline(path, deadline.at)
            proc = await asyncio.create_subprocess_exec(
                watchdog.SHELL,
                "-c",
                watchdog.SCRIPT,
                "acpw-watchdog",
                str(path),
                *(str(p) for p in cgs.paths),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,  # a signal to the worker's group misses it
            )
        except OSError as exc:
            watchdog.remove_deadline(path)
            raise SandboxError(
                "cannot start the sandbox's lease watchdog", sandbox_id=sandbox_id, error=str(exc)
            ) from exc

        def renewed(at: float) -> None:
            try:
                watchdog.write_deadline(path, at)
            except OSError as exc:  # the old deadline stands: at worst an early kill
                log.warning("could not extend the lease watchdog of %s: %s", sandbox_id, exc)

        self._running[sandbox_id] = _Watchdog(proc, deadline.follow(renewed))

    def remove(self, sandbox_id: str) -> None:
        """The sandbox is destroyed: its watchdog, wherever it runs, exits (idempotent)."""
        watchdog.remove_deadline(self.deadline_file(sandbox_id))

    async def stop(self, sandbox_id: str) -> None:
        """``remove``, and end and reap this process's watchdog of it now (idempotent)."""
        self.remove(sandbox_id)
        dog = self._running.pop(sandbox_id, None)
        if dog is None:
            return
        dog.unfollow()
        if dog.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # the loop and its `sleep`
                os.killpg(dog.proc.pid, signal.SIGKILL)
        await dog.proc.wait()
