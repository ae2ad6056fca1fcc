"""The daytona backend's stdin path without Daytona: the relay (a real ``python3``
process fed frames through a pipe, as Daytona's daemon feeds input calls) and the input
transport's framing and back-pressure (its HTTP call replaced by a recorder that the
test releases one call at a time)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from worker.sandbox.daytona.process import InputTransport, InputWriter, utf8_cut
from worker.sandbox.daytona.relay import (
    EOF_FRAME,
    KILL_FRAME,
    RELAY,
    TERM_FRAME,
    data_frame,
    launch_header,
)


def _relay(*inputs: str, timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", RELAY],
        input="".join(inputs).encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def test_the_relay_passes_frames_closes_stdin_and_exits_with_the_status() -> None:
    script = (
        "import sys;d=sys.stdin.read()\n"
        "env=sorted(e.split('=')[0] for e in open('/proc/self/environ').read().split('\\0') if e)\n"
        "print(repr(d),env);sys.exit(7)"
    )
    header = launch_header([sys.executable, "-c", script], {"ONLY": "1"}, "/")
    # A newline after a frame, as a daemon appending one to each input would leave.
    done = _relay(header, "\n", data_frame("héllo\n"), "\n", data_frame("x"), EOF_FRAME)
    assert done.returncode == 7
    assert done.stdout.decode().split(" ", 1)[0] == repr("héllo\nx")
    assert done.stdout.decode().rstrip().endswith("['ONLY']")


def test_the_relay_forwards_signals_after_eof() -> None:
    script = (
        "import signal,time;signal.signal(signal.SIGTERM,signal.SIG_IGN)\n"
        "print('ready',flush=True);time.sleep(30)"
    )
    header = launch_header([sys.executable, "-c", script], {}, "/")
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", RELAY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write((header + EOF_FRAME).encode())
    proc.stdin.flush()
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.stdin.write(TERM_FRAME.encode())
    proc.stdin.flush()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(1.0)  # SIGTERM ignored: still running
    proc.stdin.write(KILL_FRAME.encode())
    proc.stdin.close()
    assert proc.wait(20) == 128 + 9
    proc.stdout.close()
    proc.stderr.close()  # type: ignore[union-attr]


def test_a_program_that_cannot_start_exits_127() -> None:
    done = _relay(launch_header(["/nonexistent/agent"], {}, "/"), EOF_FRAME)
    assert done.returncode == 127
    assert b"cannot exec /nonexistent/agent" in done.stderr


def test_the_launch_header_carries_the_environment_and_its_length_in_bytes() -> None:
    header = launch_header(["a"], {"K": "é"}, "/w")
    assert int(header[:10]) == len(header[10:].encode())
    assert json.loads(header[10:]) == {"argv": ["a"], "env": {"K": "é"}, "cwd": "/w"}


def test_utf8_cut_never_splits_a_character() -> None:
    data = "aé€😀".encode()
    for limit in range(1, len(data) + 1):
        cut = utf8_cut(data, limit)
        data[:cut].decode()  # raises if split
        assert 0 < cut <= limit


async def test_writes_are_framed_in_order_and_back_pressured() -> None:
    sent: list[str] = []
    gate = asyncio.Semaphore(0)

    async def send(data: str) -> None:
        await gate.acquire()
        sent.append(data)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = InputTransport(send, protocol, frame_bytes=1024)
    writer = InputWriter(transport, protocol, reader, loop)
    writer.write(b"x" * 10 * 1024)  # 10 frames: over the 4-frame high-water mark
    drained = asyncio.create_task(writer.drain())
    await asyncio.sleep(0.05)
    assert not drained.done()  # paused until the calls go out
    for _ in range(9):  # resumed once at most one frame is left unsent
        gate.release()
    await asyncio.wait_for(drained, 5)
    writer.close()
    for _ in range(10):
        gate.release()
    await asyncio.wait_for(transport.flushed(), 5)
    assert sent[-1] == EOF_FRAME
    payload = "".join(frame[11:] for frame in sent[:-1])
    assert payload == "x" * 10 * 1024
    assert all(frame.startswith("D") and int(frame[1:11]) <= 1024 for frame in sent[:-1])


async def test_a_failed_input_call_closes_stdin() -> None:
    async def send(data: str) -> None:
        raise OSError("gone")

    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = InputTransport(send, protocol, frame_bytes=1024)
    transport.write(b"line\n")
    await transport.flushed()
    assert transport.is_closing()
