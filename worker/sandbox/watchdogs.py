"""The lease watchdogs of one backend's sandboxes (see ``worker.sandbox.watchdog``).

``start`` launches a watchdog over a set of cgroup directories of a leased sandbox, in
its own session; a sandbox whose processes live in several cgroups over time (a docker
sandbox starts one container per spawn) gets one watchdog per set, all following the
sandbox's one deadline file, which every lease renewal rewrites. ``stop`` removes the file
and ends them. Any process that destroys the sandbox (a reaper) ends them too: the file
is gone (``remove``). A sandbox without a lease gets none.

Blocking but brief (a fork and exec of ``/bin/sh``; a kill and reap): fine to call from
the event loop or from a thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox import watchdog
from worker.sandbox.base import LeaseDeadline

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Watched:
    unfollow: Callable[[], None]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Watchdogs:
    """The running watchdogs of one backend, by sandbox id; deadline files in ``root``."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._running: dict[str, _Watched] = {}

    def deadline_file(self, sandbox_id: str) -> Path:
        return self._root / f"{sandbox_id}.deadline"

    def start(self, sandbox_id: str, deadline: LeaseDeadline, cgroups: Sequence[Path]) -> None:
        """Bound ``sandbox_id`` by ``deadline``: kill the members of ``cgroups`` once it
        passes unrenewed (a further call adds a watchdog over more cgroups).

        Raises:
            SandboxError: the watchdog could not be started, or ``cgroups`` is empty.
        """
        if not cgroups:
            raise SandboxError("no cgroups to bound by the lease", sandbox_id=sandbox_id)
        path = self.deadline_file(sandbox_id)
        watched = self._running.get(sandbox_id)
        try:
            if watched is None:
                self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
                watchdog.write_deadline(path, deadline.at)
            proc = subprocess.Popen(
                [watchdog.SHELL, "-c", watchdog.SCRIPT, "acpw-watchdog", str(path)]
                + [str(p) for p in cgroups],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,  # a signal to the worker's group misses it
                close_fds=True,
            )
        except OSError as exc:
            if watched is None:
                watchdog.remove_deadline(path)
            raise SandboxError(
                "cannot start the sandbox's lease watchdog", sandbox_id=sandbox_id, error=str(exc)
            ) from exc
        if watched is None:

            def renewed(at: float) -> None:
                try:
                    watchdog.write_deadline(path, at)
                except OSError as exc:  # the old deadline stands: at worst an early kill
                    log.warning("could not extend the lease watchdog of %s: %s", sandbox_id, exc)

            watched = self._running[sandbox_id] = _Watched(deadline.follow(renewed))
        watched.procs.append(proc)

    def remove(self, sandbox_id: str) -> None:
        """The sandbox is destroyed: its watchdogs, wherever they run, exit (idempotent)."""
        watchdog.remove_deadline(self.deadline_file(sandbox_id))

    def stop(self, sandbox_id: str) -> None:
        """``remove``, and end and reap this process's watchdogs of it now (idempotent)."""
        self.remove(sandbox_id)
        watched = self._running.pop(sandbox_id, None)
        if watched is None:
            return
        watched.unfollow()
        for proc in watched.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # the loop and its `sleep`
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
