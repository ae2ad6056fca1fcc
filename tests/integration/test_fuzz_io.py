"""Untrusted bytes, fuzzed through real I/O: the ACP line reader and the archive extractor.

The ACP ``Connection`` reads an agent's stdout over a real socketpair; whatever arrives,
it reads to the end (``AgentExited``), skipping and reporting each line over the bound,
answers each request it cannot serve with a JSON-RPC error, and passes on at most a
bounded preview of a malformed line. The archive extractor's member-level fuzzing lives in
``test_packs_integration.py``; here the bytes of valid archives are corrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_packs_integration import entry, reg, tar_bytes
from worker.errors import AgentExited, ArchiveRefused
from worker.events.emitter import EventEmitter
from worker.events.normalizer import Normalizer
from worker.events.sinks import JsonlSink
from worker.packs.archive import ArchiveFormat, extract_tar
from worker.rpc.connection import Connection
from worker.rpc.oversize import PREFIX_BYTES, LineSplitter, OversizeLine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
LINE_LIMIT = 4096

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.just("2.0") | json_values,
        "id": st.integers(0, 3) | json_values,
        "method": st.sampled_from(["session/update", "fs/read_text_file", "cursor/task", "x"])
        | json_values,
        "params": json_values,
        "result": json_values,
        "error": json_values,
    },
)
lines = st.one_of(
    messages.map(lambda m: json.dumps(m).encode()),
    st.binary(max_size=200),
    st.builds(lambda n: b"[" * n, st.integers(0, 3 * LINE_LIMIT)),  # deep or over-long
    st.just(b"x" * (LINE_LIMIT + 1)),
)


async def _feed(
    chunks: list[bytes],
) -> tuple[BaseException, list[Any], list[str], bytes, list[OversizeLine]]:
    ours, agent = socket.socketpair()
    agent.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=ours)
    notified: list[Any] = []
    malformed: list[str] = []

    async def on_notification(method: str, params: Any) -> None:
        notified.append((method, params))

    async def on_malformed(preview: str, reason: str) -> None:
        malformed.append(preview)

    oversize: list[OversizeLine] = []

    async def on_oversize(line: OversizeLine) -> None:
        oversize.append(line)

    conn = Connection(
        reader,
        writer,
        line_limit=LINE_LIMIT,
        on_notification=on_notification,
        on_malformed=on_malformed,
        on_oversize=on_oversize,
    )
    conn.start()
    loop = asyncio.get_running_loop()

    async def send() -> None:
        for chunk in chunks:
            await loop.sock_sendall(agent, chunk)
        agent.shutdown(socket.SHUT_WR)

    # Concurrently: the agent may fill the socket before the reader drains it.
    sender = asyncio.create_task(send())
    try:
        reason = await asyncio.wait_for(conn.closed, 3)
        await asyncio.sleep(0)  # let in-flight answers be written
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        await conn.aclose()
        writer.close()
        await asyncio.gather(writer.wait_closed(), return_exceptions=True)
        answers = await _received(loop, agent)
        agent.close()
    return reason, notified, malformed, answers, oversize


async def _received(loop: asyncio.AbstractEventLoop, agent: socket.socket) -> bytes:
    answers = b""
    with contextlib.suppress(TimeoutError, OSError):
        while data := await asyncio.wait_for(loop.sock_recv(agent, 65536), 1):
            answers += data
    return answers


@FUZZ
@given(st.lists(lines, max_size=8), st.integers(1, 64))
def test_the_line_reader_survives_any_stream(items: list[bytes], split: int) -> None:
    stream = b"".join(line + b"\n" for line in items)
    chunks = [stream[i : i + split * 97] for i in range(0, len(stream), split * 97)]
    reason, notified, malformed, answers, oversize = asyncio.run(_feed(chunks))
    assert isinstance(reason, AgentExited)  # read to the end: the agent closed stdout
    # Every over-long line skipped and reported with its size, and only those.
    sizes = [len(part) for part in stream.split(b"\n") if len(part) > LINE_LIMIT]
    assert [line.size for line in oversize] == sizes
    assert all(len(preview) <= 512 for preview in malformed)  # bounded previews
    assert all(isinstance(method, str) for method, _ in notified)
    for raw in answers.splitlines():  # every answer is a well-formed JSON-RPC error
        reply = json.loads(raw)
        assert reply["jsonrpc"] == "2.0"
        assert reply["error"]["code"] == -32601


@FUZZ
@given(st.lists(lines | st.binary(max_size=3 * LINE_LIMIT), max_size=8), st.integers(1, 9000))
def test_the_line_splitter_agrees_with_a_plain_split(items: list[bytes], size: int) -> None:
    # Any chunking: exactly the lines of a plain split, each over-long one as its size.
    stream = b"".join(item + b"\n" for item in items) + b"trailing, no newline"
    splitter = LineSplitter(LINE_LIMIT)
    got: list[bytes | int] = []
    for i in range(0, len(stream), size):
        fed = splitter.feed(stream[i : i + size])
        got.extend(item if isinstance(item, bytes) else item.size for item in fed)
        assert splitter.held <= LINE_LIMIT + size + PREFIX_BYTES
    assert splitter.end() is None
    expected = [
        part.strip() if len(part) <= LINE_LIMIT else len(part)
        for part in stream.split(b"\n")[:-1]
        if len(part) > LINE_LIMIT or part.strip()
    ]
    assert got == expected


def test_deeply_nested_json_is_a_malformed_line_not_a_dead_reader() -> None:
    # Within the line limit, past the parser's recursion limit: RecursionError, which is
    # not a ValueError, once escaped and killed the reader (found by the fuzz test above).
    line = b"[" * 2000 + b"\n"
    reason, _, malformed, _, _ = asyncio.run(_feed([line]))
    assert isinstance(reason, AgentExited)
    assert len(malformed) == 1


# --- archives: corrupted bytes of valid archives --------------------------------------------

MEMBERS = [
    entry("lib", tarfile.DIRTYPE),
    reg("lib/a.js", b"console.log(1)\n" * 20, 0o755),
    reg("README", b"hello\n"),
    entry("lib/link", tarfile.SYMTYPE, "a.js"),
]
ARCHIVES: dict[ArchiveFormat, bytes] = {
    "tar": tar_bytes(MEMBERS),
    "tar.gz": tar_bytes(MEMBERS, gz=True),
}


@FUZZ
@given(
    st.sampled_from(sorted(ARCHIVES)),
    st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 255)), min_size=1, max_size=6),
    st.none() | st.integers(0, 4096),
)
def test_corrupted_archives_are_refused_or_contained(
    fmt: ArchiveFormat, flips: list[tuple[int, int]], cut: int | None
) -> None:
    data = bytearray(ARCHIVES[fmt])
    for offset, value in flips:
        data[offset % len(data)] = value
    if cut is not None:
        data = data[:cut]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest = root / "sandbox" / "dest"
        dest.mkdir(parents=True)
        try:
            inventory = extract_tar(io.BytesIO(bytes(data)), dest, fmt=fmt)
        except ArchiveRefused:  # the typed refusal, nothing else
            inventory = None
        for path in root.rglob("*"):
            assert path == dest.parent or path.is_relative_to(dest)
            assert not path.is_symlink()
        if inventory is not None:
            assert {e.path for e in inventory} == {
                p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()
            }


def test_a_lone_surrogate_on_the_wire_reaches_every_sink_as_a_replacement(
    tmp_path: Path,
) -> None:
    """JSON lets an agent write "\\ud800": the reader decodes it to a str no UTF-8 can
    carry. Normalized and emitted, it must reach a real file as valid UTF-8."""
    update = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "lone \ud800 surrogate"},
    }
    line = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s1", "update": update}}).encode() + b"\n"  # fmt: skip
    assert b"\\ud800" in line
    _, notified, malformed, _, _ = asyncio.run(_feed([line]))
    assert malformed == []
    [(method, params)] = notified
    assert method == "session/update"
    events_file = tmp_path / "events.jsonl"

    async def emit_all() -> None:
        with events_file.open("w", encoding="utf-8") as stream:
            emitter = EventEmitter(job_id="j", attempt=1, sinks=[JsonlSink(stream)])
            for event in Normalizer(workspace_root="/workspace").session_update(params):
                await emitter.emit(event)

    asyncio.run(emit_all())
    [event] = [json.loads(x) for x in events_file.read_bytes().decode("utf-8").splitlines()]
    assert event["type"] == "message.delta"
    assert event["data"]["text"] == "lone \ufffd surrogate"
