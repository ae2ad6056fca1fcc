"""A Daytona session command as a ``SandboxProcess``.

stdin is a ``StreamWriter`` over :class:`InputTransport`: what the agent's client writes
is buffered, cut into frames of at most ``frame_bytes`` (at a UTF-8 boundary, the input
call carries text) and sent one input call at a time, in order. Everything buffered while
a call is out goes in the next one (up to ``frame_bytes``): a burst of messages costs one
round trip per frame, not one per message. Each frame carries a sequence number, so a
call retried after the daemon had applied it (a 5xx on the way back) is dropped by the
relay: every retry is safe. The writer is paused
(``drain`` waits) while more than ``4 * frame_bytes`` are unsent, so a fast writer is
back-pressured by the HTTP calls. ``close``/``write_eof`` sends the relay's EOF frame
after what is buffered. stdout and stderr are followed from Daytona's log stream
(a websocket); if it drops while the command runs, it is opened again and what was
already delivered (counted in characters per stream) is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from worker.errors import SandboxError
from worker.sandbox.base import ExitDiagnosis, StdioProcess, ended
from worker.sandbox.daytona.relay import EOF_FRAME, KILL_FRAME, TERM_FRAME, data_frame

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]


def exit_status(status: int) -> int:
    """The relay's exit status as asyncio reports a process's: 128+N → -N (signal N)."""
    if 128 < status < 128 + signal.NSIG:
        return -(status - 128)
    return status


def utf8_cut(data: bytes | bytearray, limit: int) -> int:
    """The largest length ``<= limit`` that does not split a UTF-8 sequence of ``data``."""
    if len(data) <= limit:
        return len(data)
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or limit


class InputTransport(asyncio.WriteTransport):
    """stdin as framed input calls (module docstring)."""

    def __init__(
        self,
        send: Send,
        protocol: asyncio.StreamReaderProtocol,
        *,
        frame_bytes: int,
    ) -> None:
        super().__init__()
        self._send = send
        self._protocol = protocol
        self._frame = frame_bytes
        self._high = 4 * frame_bytes
        self._buffer = bytearray()
        self._wake = asyncio.Event()
        self._eof = False
        self._paused = False
        self._failed: BaseException | None = None
        self._seq = 0
        self._pump = asyncio.create_task(self._run())

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof or self._failed is not None:
            return  # the program's stdin is closed: as a closed pipe, nothing goes
        self._buffer += data
        self._wake.set()
        if not self._paused and len(self._buffer) > self._high:
            self._paused = True
            self._protocol.pause_writing()

    def write_eof(self) -> None:
        self._eof = True
        self._wake.set()

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.write_eof()

    def is_closing(self) -> bool:
        return self._eof or self._failed is not None

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def abort(self) -> None:
        self._eof = True
        self._buffer.clear()
        self._pump.cancel()

    def get_extra_info(self, name: str, default: object = None) -> Any:
        return default

    async def flushed(self) -> None:
        """Wait until every frame (and the EOF, once asked) has been sent."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(self._pump)

    async def _run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._buffer:
                    await self._send_one()
                if self._eof:
                    await self._send(EOF_FRAME)
                    return
        except Exception as exc:  # an input call failed: stdin is gone for the program
            self._failed = exc
            log.warning("daytona: agent stdin lost: %s", exc)
        finally:
            if self._paused:
                self._paused = False
                self._protocol.resume_writing()

    async def _send_one(self) -> None:
        cut = utf8_cut(self._buffer, self._frame)
        chunk = bytes(self._buffer[:cut])
        del self._buffer[:cut]
        self._seq += 1
        await self._send(data_frame(self._seq, chunk.decode("utf-8", "replace")))
        if self._paused and len(self._buffer) <= self._frame:
            self._paused = False
            self._protocol.resume_writing()


class InputWriter(asyncio.StreamWriter):
    """stdin as a ``StreamWriter``: ``close`` is the EOF frame; nothing to wait for on
    close (the frames go out on their own)."""

    async def wait_closed(self) -> None:
        return None


class CommandControl:
    """What a Daytona process needs of its sandbox: follow the logs, ask the exit code,
    send a control frame, delete the session."""

    async def follow_logs(
        self, on_stdout: Callable[[str], None], on_stderr: Callable[[str], None]
    ) -> None:
        raise NotImplementedError

    async def exit_code(self) -> int | None:
        raise NotImplementedError

    async def send(self, data: str) -> None:
        raise NotImplementedError

    async def kill_session(self) -> None:
        raise NotImplementedError


class DaytonaProcess(StdioProcess):
    """The agent as a relay command of a Daytona session (module docstring). ``pid`` is
    0: the process is on Daytona's runner."""

    def __init__(
        self,
        control: CommandControl,
        *,
        stdout_limit: int,
        frame_bytes: int,
        poll_s: float = 0.5,
    ) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=stdout_limit)
        protocol = asyncio.StreamReaderProtocol(reader)
        self._transport = InputTransport(control.send, protocol, frame_bytes=frame_bytes)
        stdin = InputWriter(self._transport, protocol, reader, loop)
        out = asyncio.StreamReader(limit=stdout_limit)
        err = asyncio.StreamReader(limit=stdout_limit)
        super().__init__(stdin=stdin, stdout=out, stderr=err)
        self._control = control
        self._poll_s = poll_s
        self._returncode: int | None = None
        self._status: int | None = None
        self.signalled = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._watch = asyncio.create_task(self._follow())

    @property
    def pid(self) -> int:
        return 0

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        if self._watch.cancelled() and self._returncode is not None:
            return self._returncode  # closed with its sandbox
        return await asyncio.shield(self._watch)

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """Its exit status or signal. Daytona reports no OOM kill; as on Podman, a
        SIGKILL that no kill of ours explains is read as one."""
        diagnosis = ended(self._returncode)
        oom = diagnosis.signal == "SIGKILL" and not self.signalled
        return ended(self._returncode, oom_killed=oom)

    async def stop(self) -> None:
        """Kill it now if it still runs: its session deleted, awaited (before the
        workspace is read back, nothing of it may still write)."""
        if self._returncode is None:
            self.signalled = True
            await self._control.kill_session()

    async def close(self) -> None:
        """Stop following it (its sandbox is gone); an end not seen is read as a kill."""
        if not self._watch.done():
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._returncode is None:
            self._status = 128 + signal.SIGKILL
            self._returncode = -signal.SIGKILL
        for task in list(self._tasks):
            task.cancel()

    def terminate(self) -> None:
        """SIGTERM to the program's process group, through the relay; idempotent."""
        self._fire(self._control.send(TERM_FRAME))

    def kill(self) -> None:
        """SIGKILL through the relay, and the session deleted (which kills what is left
        in it even if the relay is stuck); idempotent."""
        self._fire(self._control.send(KILL_FRAME))
        self._fire(self._control.kill_session())

    def _fire(self, call: Awaitable[None]) -> None:
        if self._returncode is not None:
            if asyncio.iscoroutine(call):
                call.close()
            return
        self.signalled = True
        future = asyncio.ensure_future(call)
        self._tasks.add(future)
        future.add_done_callback(self._settle)

    def _settle(self, future: asyncio.Future[None]) -> None:
        self._tasks.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("daytona: signal not delivered: %s", future.exception())

    async def _follow(self) -> int:
        seen = {"out": 0, "err": 0}
        try:
            while True:
                skip = dict(seen)
                await self._stream(seen, skip)
                status = await self._control.exit_code()
                if status is not None:
                    break
                await asyncio.sleep(self._poll_s)  # the stream dropped; the command runs
        except SandboxError as exc:
            log.warning("daytona: the command's end is unknown (%s): read as killed", exc)
            status = 128 + signal.SIGKILL
        finally:
            self._stdout.feed_eof()
            self._stderr.feed_eof()
            self._transport.abort()
        self._status = status
        self._returncode = exit_status(status)
        return self._returncode

    async def _stream(self, seen: dict[str, int], skip: dict[str, int]) -> None:
        def feeder(name: str, reader: asyncio.StreamReader) -> Callable[[str], None]:
            def feed(text: str) -> None:
                drop = min(skip[name], len(text))
                skip[name] -= drop
                text = text[drop:]
                if text:
                    seen[name] += len(text)
                    reader.feed_data(text.encode())

            return feed

        with contextlib.suppress(SandboxError):
            await self._control.follow_logs(
                feeder("out", self._stdout), feeder("err", self._stderr)
            )
