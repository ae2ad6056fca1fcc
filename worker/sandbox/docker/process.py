"""A started container's program as a ``SandboxProcess``: the attach stream split into
stdout and stderr, stdin whose ``close`` is an EOF, the exit status as asyncio's."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import struct
from typing import Protocol

from worker.sandbox.base import (
    ExitDiagnosis,
    SignalledByCall,
    ended,
)
from worker.sandbox.launcher import exit_status


class ContainerControl(Protocol):
    """What a container's process needs of the engine: its exit status and signals."""

    async def wait_container(self, container: str) -> int: ...

    async def signal(self, container: str, sig: signal.Signals) -> None: ...

    async def oom_killed(self, container: str) -> bool: ...


STDOUT, STDERR = 1, 2


class StdinWriter(asyncio.StreamWriter):
    """stdin over the attach connection: ``close`` half-closes it (EOF to the program).

    stdout and stderr keep arriving on the same connection after the EOF.
    """

    def close(self) -> None:
        transport = self.transport
        if not transport.is_closing() and transport.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
        self._acpw_eof = True

    def is_closing(self) -> bool:
        return getattr(self, "_acpw_eof", False) or self.transport.is_closing()

    async def wait_closed(self) -> None:
        return None


async def demultiplex(
    raw: asyncio.StreamReader, out: asyncio.StreamReader, err: asyncio.StreamReader
) -> None:
    """Split the engine's framed stream: 8-byte header (stream, 0,0,0, big-endian size)."""
    try:
        while True:
            header = await raw.readexactly(8)
            stream, size = struct.unpack(">BxxxL", header)
            data = await raw.readexactly(size)
            (err if stream == STDERR else out).feed_data(data)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        out.feed_eof()
        err.feed_eof()


class DockerProcess(SignalledByCall):
    """A started container's program. ``pid`` is the container init's host pid (0 if
    the engine does not say); signals go to the container (the init forwards them)."""

    def __init__(
        self,
        engine: ContainerControl,
        container_id: str,
        *,
        stdin: StdinWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        pump: asyncio.Task[None],
        pid: int,
    ) -> None:
        super().__init__(stdin=stdin, stdout=stdout, stderr=stderr)
        self._engine = engine
        self.container_id = container_id
        self._pump = pump
        self._pid = pid
        self._status: int | None = None
        self._waiter: asyncio.Task[int] = asyncio.create_task(self._watch())

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def oom_killed(self) -> bool:
        """Exit 137 that no terminate/kill/destroy of ours explains (Podman's
        ``OOMKilled`` flag is unreliable)."""
        return self._status == 137 and not self.signalled

    async def wait(self) -> int:
        return await asyncio.shield(self._waiter)

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """Its exit status or signal; an end by SIGKILL was the kernel's OOM killer when
        the engine says so (``State.OOMKilled``) or, as that flag is unreliable on
        Podman, when no signal of ours explains it (``oom_killed``)."""
        diagnosis = ended(self._returncode)
        if diagnosis.signal != "SIGKILL":
            return diagnosis
        oom = self.oom_killed or await self._engine.oom_killed(self.container_id)
        return ended(self._returncode, oom_killed=oom)

    async def _watch(self) -> int:
        # The attach stream ends when the container's last process exits.
        await asyncio.shield(self._pump)
        status = await self._engine.wait_container(self.container_id)
        self._stdin.transport.close()
        self._status = status
        self._returncode = exit_status(status)
        return self._returncode

    async def _deliver(self, sig: signal.Signals) -> None:
        """To the container: SIGTERM reaches the program through the container's init,
        SIGKILL ends every process in it."""
        await self._engine.signal(self.container_id, sig)
