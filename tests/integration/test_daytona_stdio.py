"""The daytona backend's stdin path without Daytona: the relay (a real ``python3``
process fed frames through a pipe, as Daytona's daemon feeds input calls) and the input
transport's framing and back-pressure (its HTTP call replaced by a recorder that the
test releases one call at a time)."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.sandbox.daytona.process import InputTransport, InputWriter, utf8_cut
from worker.sandbox.daytona.relay import (
    EOF_FRAME,
    KILL_FRAME,
    RELAY,
    TERM_FRAME,
    data_frame,
    launch_header,
    lease_frame,
)


def _header(tmp: Path, header: bytes) -> str:
    """The header as the worker leaves it: a 0600 file in a 0700 directory."""
    folder = tmp / f"acpw-launch-{secrets.token_hex(4)}"
    folder.mkdir(mode=0o700)
    path = folder / "header.json"
    path.write_bytes(header)
    path.chmod(0o600)
    return str(path)


def _relay(header: str, *inputs: str, timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", RELAY, header],
        input="".join(inputs).encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def test_the_relay_passes_frames_closes_stdin_and_exits_with_the_status(tmp_path: Path) -> None:
    script = (
        "import sys;d=sys.stdin.read()\n"
        "env=sorted(e.split('=')[0] for e in open('/proc/self/environ').read().split('\\0') if e)\n"
        "print(repr(d),env);sys.exit(7)"
    )
    header = _header(tmp_path, launch_header([sys.executable, "-c", script], {"ONLY": "1"}, "/"))
    # A newline after a frame, as a daemon appending one to each input would leave.
    done = _relay(header, "\n", data_frame(1, "héllo\n"), "\n", data_frame(2, "x"), EOF_FRAME)
    assert done.returncode == 7
    assert done.stdout.decode().split(" ", 1)[0] == repr("héllo\nx")
    assert done.stdout.decode().rstrip().endswith("['ONLY']")
    # The header (credentials) is gone from the sandbox once read, its folder too.
    assert not Path(header).exists()
    assert not Path(header).parent.exists()


def test_the_relay_drops_a_frame_it_already_applied(tmp_path: Path) -> None:
    """A retried input call the daemon had applied (the same sequence number again) is
    dropped: the program sees each message once."""
    script = "import sys;print(repr(sys.stdin.read()))"
    header = _header(tmp_path, launch_header([sys.executable, "-c", script], {}, "/"))
    one, two = data_frame(1, '{"id":1}\n'), data_frame(2, '{"id":2}\n')
    done = _relay(header, one, one, two, "\n", two, one, data_frame(3, "end"), EOF_FRAME)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == repr('{"id":1}\n{"id":2}\nend')


def _dead(pid: int) -> bool:
    """Gone, or a zombie (killed; this container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_an_unreadable_header_exits_125(tmp_path: Path) -> None:
    done = _relay(str(tmp_path / "missing" / "header.json"), EOF_FRAME)
    assert done.returncode == 125
    assert b"cannot read the launch header" in done.stderr


def test_the_relay_kills_everything_it_started_when_the_lease_lapses(tmp_path: Path) -> None:
    """A lease renewed (``L`` frames) keeps the program running past its first deadline;
    once renewals stop, the watchdog kills the program and what it left in another session
    (orphaned, reparented to the relay), and the relay exits 137."""
    pidfile = tmp_path / "grandchild.pid"
    script = (
        "import os,subprocess,sys,time\n"
        "p=subprocess.Popen([sys.executable,'-c','import time;time.sleep(60)'],"
        "start_new_session=True)\n"
        f"open({str(pidfile)!r},'w').write(str(p.pid))\n"
        "print('ready',flush=True);time.sleep(60)"
    )
    header = _header(tmp_path, launch_header([sys.executable, "-c", script], {}, "/", lease_s=1.0))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", RELAY, header],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdin.write(EOF_FRAME.encode())
    proc.stdin.flush()
    assert proc.stdout.readline() == b"ready\n"
    grandchild = int(pidfile.read_text())
    for _ in range(4):  # 2 s of renewals, each 1 s ahead: still running
        proc.stdin.write(lease_frame(1.0).encode())
        proc.stdin.flush()
        time.sleep(0.5)
        assert proc.poll() is None
    assert proc.wait(20) == 137
    assert b"the lease lapsed unrenewed" in proc.stderr.read()
    assert _dead(grandchild)
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()


def test_the_relay_forwards_signals_after_eof(tmp_path: Path) -> None:
    script = (
        "import signal,time;signal.signal(signal.SIGTERM,signal.SIG_IGN)\n"
        "print('ready',flush=True);time.sleep(30)"
    )
    header = _header(tmp_path, launch_header([sys.executable, "-c", script], {}, "/"))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", RELAY, header],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(EOF_FRAME.encode())
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


def test_a_program_that_cannot_start_exits_127(tmp_path: Path) -> None:
    done = _relay(_header(tmp_path, launch_header(["/nonexistent/agent"], {}, "/")), EOF_FRAME)
    assert done.returncode == 127
    assert b"cannot exec /nonexistent/agent" in done.stderr


def test_a_first_lease_frame_arms_the_watchdog_of_a_relay_started_without_one(
    tmp_path: Path,
) -> None:
    """A warm slot's agent is started with no lease (no watchdog: it waits for a job);
    the claiming attempt's first ``L`` frame arms the watchdog, and once renewals stop
    the program is killed and the relay exits 137, as with a lease from the start."""
    script = "import time\nprint('ready',flush=True);time.sleep(60)"
    header = _header(tmp_path, launch_header([sys.executable, "-c", script], {}, "/"))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", RELAY, header],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(1.0)  # no lease: nothing bounds it yet
        assert proc.poll() is None
        for _ in range(3):  # armed, then renewed 0.8 s ahead: still running
            proc.stdin.write(lease_frame(0.8).encode())
            proc.stdin.flush()
            time.sleep(0.3)
            assert proc.poll() is None
        assert proc.wait(20) == 137
        assert b"the lease lapsed unrenewed" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()


def test_the_launch_header_carries_the_environment_masks_and_lease() -> None:
    header = launch_header(["a"], {"K": "é"}, "/w", masks=[("file", "/w/.mcp.json")], lease_s=2.5)
    assert json.loads(header) == {
        "argv": ["a"], "env": {"K": "é"}, "cwd": "/w",
        "masks": [["file", "/w/.mcp.json"]], "lease_s": 2.5,
    }  # fmt: skip


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
    # each frame ends with a newline, after its payload: echoed, it is a line of its own
    assert all(frame.endswith("\n") for frame in sent)
    payload = "".join(frame[21:-1] for frame in sent[:-1])
    assert payload == "x" * 10 * 1024
    assert all(frame.startswith("D") and int(frame[11:21]) <= 1024 for frame in sent[:-1])
    # numbered from 1, one more each frame: the relay drops a number it has applied
    assert [int(frame[1:11]) for frame in sent[:-1]] == list(range(1, len(sent)))


async def test_a_burst_of_messages_goes_out_in_few_calls() -> None:
    """While a call is out, what the client writes is buffered and goes in the next
    call: 200 small messages written at once cost a handful of round trips."""
    sent: list[str] = []

    async def send(data: str) -> None:
        await asyncio.sleep(0.01)  # a round trip
        sent.append(data)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = InputTransport(send, protocol, frame_bytes=65536)
    writer = InputWriter(transport, protocol, reader, loop)
    for i in range(200):
        writer.write(b'{"jsonrpc":"2.0","id":%d}\n' % i)
    writer.close()
    await asyncio.wait_for(transport.flushed(), 10)
    assert len(sent) <= 3  # data frame(s), then the EOF
    assert "".join(f[21:-1] for f in sent[:-1]).count("jsonrpc") == 200


async def test_a_failed_input_call_closes_stdin() -> None:
    async def send(data: str) -> None:
        raise OSError("gone")

    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = InputTransport(send, protocol, frame_bytes=1024)
    transport.write(b"line\n")
    await transport.flushed()
    assert transport.is_closing()
