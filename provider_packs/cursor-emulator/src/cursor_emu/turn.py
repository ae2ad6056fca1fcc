"""One prompt turn's cancellation state, shared by the player and the reader loop."""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    import subprocess
    from typing import Any

    from .rpc import Pending


class TurnCancelled(Exception):
    """Raised inside the player as soon as it notices a cancel."""


class TurnStopped(Exception):
    """Raised by the `stop` verb to end the turn with a given stopReason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Turn:
    """Everything blocking in a turn waits on `cond`, so cancel wakes it within ms."""

    def __init__(self, variables: dict[str, str]) -> None:
        self.cond = threading.Condition()
        self.cancelled = False
        self.vars = variables
        self._proc: subprocess.Popen[bytes] | None = None

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            proc = self._proc
            self.cond.notify_all()
        if proc is not None:
            _kill_group(proc)

    def check(self) -> None:
        if self.cancelled:
            raise TurnCancelled

    def sleep(self, seconds: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.cancelled, timeout=seconds)
        self.check()

    def hang(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.cancelled)
        self.check()

    def wait_reply(self, pending: Pending) -> Pending:
        """Block until the client answers; a cancel abandons the request."""
        with self.cond:
            self.cond.wait_for(lambda: pending.done or self.cancelled)
        self.check()
        return pending

    def run_shell(self, command: str, cwd: str) -> tuple[int, bytes, bytes]:
        """Run `/bin/sh -c` with stdin=/dev/null; a cancel kills its process group."""
        import subprocess  # Only the exec verbs need it: not every start.

        self.check()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self.cond:
            self._proc = proc
            late_cancel = self.cancelled
        if late_cancel:
            _kill_group(proc)
        try:
            out, err = proc.communicate()
        finally:
            with self.cond:
                self._proc = None
        self.check()
        return proc.returncode, out, err


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    import signal  # Loaded already by subprocess (run_shell): not at every start.

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # Already gone.
