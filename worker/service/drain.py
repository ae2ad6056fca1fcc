"""Draining a worker on SIGTERM: finish what runs within a grace, hand back the rest.

    SIGTERM to ``serve`` (Celery's main process) → Celery's warm shutdown stops
    consuming and waits for the running tasks (a message its last fetch brings in after
    the signal goes straight back to the head of the queue, ``tasks``) → after ``drain_grace_s``,
    :class:`DrainTimer` sends ``HAND_BACK_SIGNAL`` to every pool process → in each, the
    :class:`HandBack` switch sets the ``cancel`` of the job under way (and of any job it
    would start later) → that job stops like a cancelled one (sandbox destroyed), but its
    ``job.completed`` is ``cancelled`` with the error ``handed_back`` and queues the next
    attempt in the same Redis call (``lua/append.lua``) → the delivery publishes that
    attempt's message (``Client.requeue``) → the task returns, the worker exits 0.

The Celery wiring (which signal, which processes) is in ``tasks``; the pieces here are
plain: the switch a pool process trips from its signal handler, and the timer the main
process arms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger(__name__)

#: Sent by the main process to its pool processes when the grace is over (billiard uses
#: SIGUSR1 for soft time limits; Celery uses SIGUSR2 only with CELERY_RDBSIG set).
HAND_BACK_SIGNAL = signal.SIGUSR2


class HandBack:
    """One process's request to hand back its jobs: tripped once, for good.

    ``trip`` is safe in a signal handler: it only sets a flag and schedules, on each
    watched job's loop, the setting of its ``cancel`` event.
    """

    def __init__(self) -> None:
        self.requested = False
        self._watched: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def trip(self) -> None:
        self.requested = True
        for loop, event in list(self._watched.values()):
            with contextlib.suppress(RuntimeError):  # that job's loop has just closed
                loop.call_soon_threadsafe(event.set)

    @contextlib.contextmanager
    def watching(self, cancel: asyncio.Event) -> Iterator[None]:
        """While the block runs, a trip sets ``cancel`` (at once if tripped already)."""
        key = id(cancel)
        self._watched[key] = (asyncio.get_running_loop(), cancel)
        if self.requested:
            cancel.set()
        try:
            yield
        finally:
            self._watched.pop(key, None)


class DrainTimer:
    """Armed at SIGTERM in the main process: after ``grace`` seconds, sends
    ``HAND_BACK_SIGNAL`` to the pool processes ``pids()`` names then.

    Every pool process gets it, busy or not, so that one handed a job in the moment the
    signal arrived hands that back too (its switch stays tripped).
    """

    def __init__(
        self,
        grace: float,
        pids: Callable[[], Iterable[int]],
        *,
        send: Callable[[int, int], None] = os.kill,
    ) -> None:
        self._grace = grace
        self._pids = pids
        self._send = send
        self._timer: threading.Timer | None = None

    @property
    def armed(self) -> bool:
        """True once the drain began (SIGTERM)."""
        return self._timer is not None

    def arm(self) -> None:
        """Start the countdown (once; a second SIGTERM does not restart it)."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(self._grace, self.fire)
        self._timer.daemon = True
        self._timer.start()

    def fire(self) -> list[int]:
        """Signal the pool processes now; returns the pids signalled."""
        sent = []
        for pid in list(self._pids()):
            try:
                self._send(pid, HAND_BACK_SIGNAL)
            except ProcessLookupError:
                continue  # it exited meanwhile
            sent.append(pid)
        log.warning("drain grace of %g s is over: handing back the jobs of %s", self._grace, sent)
        return sent
