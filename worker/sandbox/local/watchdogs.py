"""The lease watchdogs of a local backend's sandboxes (see ``worker.sandbox.watchdog``).

``start`` launches one per leased sandbox, in its own session, and forwards every
lease renewal to it through its stdin; ``stop`` tells it the sandbox was destroyed
normally and reaps it. A sandbox without a lease gets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox import watchdog
from worker.sandbox.base import LeaseDeadline
from worker.sandbox.cgroups import CgroupSet

log = logging.getLogger(__name__)

_SCRIPT = str(Path(watchdog.__file__).resolve())
_STOP_WAIT_S = 5.0


@dataclass(slots=True)
class _Watchdog:
    proc: asyncio.subprocess.Process
    unfollow: Callable[[], None]


class Watchdogs:
    """The running watchdogs of one backend, by sandbox id."""

    def __init__(self) -> None:
        self._running: dict[str, _Watchdog] = {}

    async def start(self, sandbox_id: str, deadline: LeaseDeadline, cgs: CgroupSet) -> None:
        """Bound ``sandbox_id`` by ``deadline``: kill ``cgs`` once it passes unrenewed.

        Raises:
            SandboxError: the watchdog could not be started.
        """
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                _SCRIPT,
                repr(deadline.at),
                *(str(p) for p in cgs.paths),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env={},
                start_new_session=True,  # a signal to the worker's group misses it
            )
        except OSError as exc:
            raise SandboxError(
                "cannot start the sandbox's lease watchdog", sandbox_id=sandbox_id, error=str(exc)
            ) from exc
        stdin = proc.stdin
        assert stdin is not None

        def renewed(at: float) -> None:
            if not stdin.is_closing():
                stdin.write(f"{at!r}\n".encode())

        self._running[sandbox_id] = _Watchdog(proc, deadline.follow(renewed))
        renewed(deadline.at)  # a renewal between the argv and now

    async def stop(self, sandbox_id: str) -> None:
        """The sandbox is destroyed: stop its watchdog and reap it (idempotent)."""
        dog = self._running.pop(sandbox_id, None)
        if dog is None:
            return
        dog.unfollow()
        stdin = dog.proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write(b"done\n")
            with contextlib.suppress(ConnectionError):
                await stdin.drain()
            stdin.close()
        try:
            await asyncio.wait_for(dog.proc.wait(), _STOP_WAIT_S)
        except TimeoutError:
            log.warning("the lease watchdog of %s did not stop: killed", sandbox_id)
            with contextlib.suppress(ProcessLookupError):
                dog.proc.kill()
            await dog.proc.wait()
