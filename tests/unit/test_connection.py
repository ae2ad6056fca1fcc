"""JSON-RPC routing over a real socket pair: both directions, errors, limits, garbage."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from worker.errors import AgentExited, AgentTimeout, LineTooLong, SinkUnavailable, WorkerError
from worker.rpc.connection import Connection, RpcError, StrayReply
from worker.rpc.oversize import PREFIX_BYTES, LineSplitter, OversizeLine


class Peer:
    """The far side: raw reads and writes of NDJSON lines."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, obj: Any) -> None:
        self.writer.write((obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n")
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), 5)
        return json.loads(line)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Connection, Peer, list[Any]]]:
    left, right = socket.socketpair()
    r1, w1 = await asyncio.open_connection(sock=left, limit=2**24)
    r2, w2 = await asyncio.open_connection(sock=right, limit=2**24)
    seen: list[Any] = []

    async def on_note(method: str, params: Any) -> None:
        seen.append(("note", method, params))

    async def on_bad(preview: str, reason: str) -> None:
        seen.append(("bad", preview, reason))

    async def on_big(line: OversizeLine) -> None:
        seen.append(("big", line))

    async def on_stray(reply: StrayReply) -> None:
        seen.append(("stray", reply))

    conn = Connection(
        r1,
        w1,
        line_limit=1024,
        request_timeout=2,
        on_notification=on_note,
        on_malformed=on_bad,
        on_oversize=on_big,
        on_stray_reply=on_stray,
    )
    conn.start()
    yield conn, Peer(r2, w2), seen
    await conn.aclose()
    w1.close()
    w2.close()


async def test_request_and_result(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, _ = pair
    call = asyncio.create_task(conn.request("initialize", {"protocolVersion": 1}))
    msg = await peer.recv()
    assert msg["method"] == "initialize"
    await peer.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"ok": True}})
    assert await call == {"ok": True}


async def test_error_reply_raises_rpc_error(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, _ = pair
    call = asyncio.create_task(conn.request("session/new", {}))
    msg = await peer.recv()
    await peer.send(
        {
            "jsonrpc": "2.0",
            "id": msg["id"],
            "error": {"code": -32000, "message": "Authentication required"},
        }
    )
    with pytest.raises(RpcError) as info:
        await call
    assert info.value.rpc_code == -32000


async def test_cursor_requests_reach_their_handler(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    conn, peer, _ = pair

    async def todos(params: Any) -> Any:
        return {"seen": params["toolCallId"]}

    conn.route("cursor/update_todos", todos)
    await peer.send(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "cursor/update_todos",
            "params": {"toolCallId": "a\nb"},
        }
    )
    assert await peer.recv() == {"jsonrpc": "2.0", "id": 0, "result": {"seen": "a\nb"}}


async def test_unknown_inbound_request_gets_method_not_found(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    _, peer, _ = pair
    await peer.send({"jsonrpc": "2.0", "id": 7, "method": "cursor/unknown", "params": {}})
    reply = await peer.recv()
    assert reply["id"] == 7
    assert reply["error"]["code"] == -32601


async def test_handler_rpc_error_is_sent_back(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, _ = pair

    async def refuse(params: Any) -> Any:
        raise RpcError(-32602, "Invalid params", {"why": "x"})

    conn.route("fs/read_text_file", refuse)
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "fs/read_text_file", "params": {}})
    assert (await peer.recv())["error"] == {
        "code": -32602,
        "message": "Invalid params",
        "data": {"why": "x"},
    }


async def test_concurrent_requests_both_ways(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, _ = pair
    release = asyncio.Event()

    async def blocking(params: Any) -> Any:
        await release.wait()
        return {"answered": True}

    conn.route("cursor/ask_question", blocking)
    await peer.send({"jsonrpc": "2.0", "id": 0, "method": "cursor/ask_question", "params": {}})
    call = asyncio.create_task(conn.request("session/prompt", {}))
    prompt = await peer.recv()  # the outbound request goes out while the question waits
    assert prompt["method"] == "session/prompt"
    release.set()
    assert (await peer.recv())["result"] == {"answered": True}
    await peer.send({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})
    assert await call == {"stopReason": "end_turn"}


async def test_garbage_is_reported_not_fatal(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, seen = pair
    await peer.send(b"this is not json")
    await peer.send(b"[1,2,3]")
    await peer.send({"jsonrpc": "2.0", "method": "session/update", "params": {"x": 1}})
    for _ in range(50):
        if len(seen) == 3:
            break
        await asyncio.sleep(0.01)
    assert [s[0] for s in seen] == ["bad", "bad", "note"]
    assert seen[0][1] == "this is not json"
    assert not conn.closed.done()


async def _until(seen: list[Any], count: int) -> None:
    """Wait until the reader has reported ``count`` things (bounded: 5 s)."""
    async with asyncio.timeout(5):
        while len(seen) < count:
            await asyncio.sleep(0.005)


def _tool_update(text: str) -> dict[str, Any]:
    update = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t1",
        "status": "completed",
        "content": [{"type": "content", "content": {"type": "text", "text": text}}],
    }
    params = {"sessionId": "s1", "update": update}
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


async def test_an_oversize_line_is_skipped_and_reading_goes_on(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    conn, peer, seen = pair
    call = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    prompt = await peer.recv()
    await peer.send(_tool_update("A" * 20_000))  # over the 1024-byte bound
    await peer.send({"jsonrpc": "2.0", "method": "session/update", "params": {"after": 1}})
    await peer.send({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})
    assert await asyncio.wait_for(call, 5) == {"stopReason": "end_turn"}  # settled on what follows
    assert [s[0] for s in seen] == ["big", "note"]
    line = seen[0][1]
    assert line.size == len(json.dumps(_tool_update("A" * 20_000)))
    assert (line.kind, line.method, line.session_id, line.complete) == (
        "notification",
        "session/update",
        "s1",
        True,
    )
    assert line.update == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t1",
        "status": "completed",
    }
    assert line.output_preview is not None
    assert set(line.output_preview) == {"A"}
    assert PREFIX_BYTES - 400 < len(line.output_preview) < PREFIX_BYTES  # cut
    assert not conn.closed.done()


async def test_an_oversize_reply_fails_only_its_request(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    conn, peer, seen = pair
    call = asyncio.create_task(conn.request("session/load", {}, timeout=None))
    msg = await peer.recv()
    await peer.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"history": "x" * 5000}})
    with pytest.raises(LineTooLong) as info:
        await asyncio.wait_for(call, 5)
    assert info.value.details["bytes"] > 5000
    assert seen[0][1].kind == "response"
    assert seen[0][1].id == msg["id"]
    # The connection lives on: the next request is answered.
    call = asyncio.create_task(conn.request("session/new", {}))
    msg = await peer.recv()
    await peer.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "s"}})
    assert await call == {"sessionId": "s"}


async def test_an_oversize_request_is_refused_unread(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    conn, peer, seen = pair
    asked: list[Any] = []

    async def ask(params: Any) -> Any:
        asked.append(params)
        return {}

    conn.route("cursor/ask_question", ask)
    params = {"questions": ["q" * 5000]}
    await peer.send({"jsonrpc": "2.0", "id": 9, "method": "cursor/ask_question", "params": params})
    reply = await peer.recv()  # the agent is not left waiting
    assert reply["id"] == 9
    assert reply["error"]["code"] == -32600
    assert "over the 1024-byte bound" in reply["error"]["message"]
    assert asked == []
    assert (seen[0][1].kind, seen[0][1].method, seen[0][1].id) == (
        "request",
        "cursor/ask_question",
        9,
    )


async def test_an_oversize_line_cut_by_the_end_of_the_stream_is_reported(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    conn, peer, seen = pair
    peer.writer.write(b'{"jsonrpc":"2.0","method":"session/update","params":' + b"[" * 3000)
    await peer.writer.drain()
    peer.writer.close()
    assert isinstance(await asyncio.wait_for(conn.closed, 5), AgentExited)
    assert seen[0][0] == "big"
    assert (seen[0][1].complete, seen[0][1].size, seen[0][1].method) == (
        False,
        3052,
        "session/update",
    )


def test_an_oversize_line_is_never_held_whole() -> None:
    splitter = LineSplitter(1024)
    chunk = b"x" * 4096
    out: list[Any] = []
    out += splitter.feed(b'{"jsonrpc":"2.0","method":"m","params":"')
    for _ in range(16 * 1024):  # 64 MiB in 4 KiB chunks, no newline until the end
        out += splitter.feed(chunk)
        assert splitter.held <= PREFIX_BYTES + 1024
    out += splitter.feed(b'"}\n{"jsonrpc":"2.0","method":"next"}\n')
    assert [type(o) for o in out] == [OversizeLine, bytes]
    assert out[0].size == 40 + 64 * 1024 * 1024 + 2
    assert out[0].method == "m"
    assert out[1] == b'{"jsonrpc":"2.0","method":"next"}'
    assert splitter.held == 0


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b'{"id":3,"result":{"x":"', {"kind": "response", "id": 3, "method": None}),
        (
            b'{"jsonrpc":"2.0","id":"a","method":"fs/write_text_file","params":{"content":"',
            {"kind": "request", "id": "a", "method": "fs/write_text_file"},
        ),
        # A "method" key inside the params is not the message's method.
        (
            b'{"jsonrpc":"2.0","params":{"method":"no","x":"',
            {"kind": "unknown", "id": None, "method": None},
        ),
        (b"\xff\xfe not json at all", {"kind": "unknown", "id": None, "method": None}),
        (
            (
                b'{"method":"session/update","params":{"update":{"content":[{"type":"content",'
                b'"content":{"type":"text","text":"caf\xc3\xa9 \\"q\\" \\u00e9\\'
            ),
            {"kind": "notification", "output_preview": 'café "q" é'},
        ),
        # A tool's rawOutput (Cursor's shell: {exitCode, stdout, stderr}), rendered as a
        # whole one's output is (json.dumps, ensure_ascii=False) as far as the cut.
        (
            (
                b'{"method":"session/update","params":{"update":{"sessionUpdate":'
                b'"tool_call_update","rawOutput":{"exitCode":1,"ok":[true,null,2.5],'
                b'"stdout":"caf\\u00e9\\n\\"q\\" \\u001b[0m'
            ),
            {
                "output_preview": None,
                "raw_output_preview": (
                    '{"exitCode": 1, "ok": [true, null, 2.5], "stdout": "café\\n\\"q\\" \\u001b[0m'
                ),
            },
        ),
        (  # a string rawOutput is its output as it is; what follows it is not part of it
            b'{"method":"session/update","params":{"update":{"rawOutput":"line\\n","x":"',
            {"raw_output_preview": "line\n"},
        ),
    ],
)
def test_what_a_prefix_tells(prefix: bytes, expected: dict[str, Any]) -> None:
    splitter = LineSplitter(8)
    (line,) = splitter.feed(prefix + b"\n")
    assert isinstance(line, OversizeLine)
    assert {key: getattr(line, key) for key in expected} == expected


async def test_a_late_reply_is_recognised_not_malformed(
    pair: tuple[Connection, Peer, list[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    conn, peer, seen = pair
    with pytest.raises(AgentTimeout):
        await conn.request("session/set_mode", {}, timeout=0.01)
    timed_out = await peer.recv()
    cancelled = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    prompt = await peer.recv()
    cancelled.cancel()  # its caller gave up (the prompt after a cancel's grace)
    await asyncio.gather(cancelled, return_exceptions=True)
    caplog.set_level(logging.DEBUG, logger="worker.rpc.connection")
    await peer.send({"jsonrpc": "2.0", "id": timed_out["id"], "result": {}})
    await peer.send({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "cancelled"}})
    await peer.send({"jsonrpc": "2.0", "id": 4242, "result": {}})  # never asked: stray
    await peer.send({"jsonrpc": "2.0", "method": "session/update", "params": {}})
    await _until(seen, 2)
    assert [s[0] for s in seen] == ["stray", "note"]
    assert seen[0][1] == StrayReply(id=4242, duplicate=False)
    late = [r.getMessage() for r in caplog.records if "late reply" in r.getMessage()]
    assert late == [
        f"a late reply to session/set_mode (id {timed_out['id']}), which was abandoned",
        f"a late reply to session/prompt (id {prompt['id']}), which was abandoned",
    ]
    # A second reply to the same id is no longer late: it is a duplicate.
    await peer.send({"jsonrpc": "2.0", "id": timed_out["id"], "result": {}})
    await _until(seen, 3)
    assert seen[2] == ("stray", StrayReply(timed_out["id"], True, "session/set_mode"))
    assert not conn.closed.done()


async def test_a_duplicate_reply_is_named_so_not_malformed(
    pair: tuple[Connection, Peer, list[Any]],
) -> None:
    """A valid reply repeated after the request was answered is a duplicate reply,
    naming the request it answers again; a reply to an id never sent (or not the
    worker's kind of id) is told apart. Neither is a malformed line."""
    conn, peer, seen = pair
    call = asyncio.create_task(conn.request("session/set_model", {"modelId": "m"}))
    msg = await peer.recv()
    reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {}}
    await peer.send(reply)
    assert await call == {}
    await peer.send(reply)  # the agent answers again
    await peer.send({"jsonrpc": "2.0", "id": msg["id"] + 1, "error": {"code": 1, "message": "x"}})
    await peer.send({"jsonrpc": "2.0", "id": "s-1", "result": None})
    await _until(seen, 3)
    assert seen == [
        ("stray", StrayReply(id=msg["id"], duplicate=True, method="session/set_model")),
        ("stray", StrayReply(id=msg["id"] + 1, duplicate=False)),
        ("stray", StrayReply(id="s-1", duplicate=False)),
    ]
    assert not conn.closed.done()


async def test_request_times_out(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, _, _ = pair
    with pytest.raises(AgentTimeout):
        await conn.request("initialize", {}, timeout=0.05)


async def test_peer_exit_fails_pending_requests(pair: tuple[Connection, Peer, list[Any]]) -> None:
    conn, peer, _ = pair
    call = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    await peer.recv()
    peer.writer.close()
    with pytest.raises(AgentExited):
        await call


async def test_deeply_nested_json_is_malformed_not_fatal() -> None:
    left, right = socket.socketpair()
    r1, w1 = await asyncio.open_connection(sock=left, limit=2**24)
    _, w2 = await asyncio.open_connection(sock=right, limit=2**24)
    seen: list[Any] = []

    async def on_note(method: str, params: Any) -> None:
        seen.append(("note", method))

    async def on_bad(preview: str, reason: str) -> None:
        seen.append(("bad", reason))

    conn = Connection(r1, w1, line_limit=2**22, on_notification=on_note, on_malformed=on_bad)
    conn.start()
    w2.write(b"[" * 200_000 + b"]" * 200_000 + b"\n")
    w2.write(b'{"jsonrpc":"2.0","method":"session/update","params":{}}\n')
    await w2.drain()
    for _ in range(200):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert seen == [("bad", "JSON nested too deeply"), ("note", "session/update")]
    assert not conn.closed.done()
    await conn.aclose()
    w1.close()
    w2.close()


async def _failing_pair(
    **handlers: Any,
) -> tuple[Connection, Peer, asyncio.StreamWriter]:
    left, right = socket.socketpair()
    r1, w1 = await asyncio.open_connection(sock=left, limit=2**24)
    r2, w2 = await asyncio.open_connection(sock=right, limit=2**24)
    conn = Connection(r1, w1, line_limit=1024, request_timeout=2, **handlers)
    conn.start()
    return conn, Peer(r2, w2), w1


async def _close(conn: Connection, peer: Peer, writer: asyncio.StreamWriter) -> None:
    await conn.aclose()
    writer.close()
    peer.writer.close()


async def test_a_failing_notification_handler_fails_pending_requests_typed() -> None:
    async def sink_gone(method: str, params: Any) -> None:
        raise SinkUnavailable("could not write events to Redis")

    conn, peer, writer = await _failing_pair(on_notification=sink_gone)
    call = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    await peer.recv()
    await peer.send({"jsonrpc": "2.0", "method": "session/update", "params": {}})
    with pytest.raises(SinkUnavailable):  # at once, not after a timeout
        await asyncio.wait_for(call, 2)
    assert isinstance(conn.closed.result(), SinkUnavailable)
    with pytest.raises(SinkUnavailable):  # and every later request, without waiting
        await conn.request("session/cancel", {}, timeout=None)
    await _close(conn, peer, writer)


async def test_a_bug_in_a_handler_is_a_typed_failure_not_a_dead_reader() -> None:
    async def buggy(preview: str, reason: str) -> None:
        raise KeyError("oops")

    conn, peer, writer = await _failing_pair(on_malformed=buggy)
    call = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    await peer.recv()
    await peer.send(b"not json")
    with pytest.raises(WorkerError) as info:
        await asyncio.wait_for(call, 2)
    assert info.value.code == "worker_error"
    assert "KeyError" in info.value.message
    await _close(conn, peer, writer)


@pytest.mark.parametrize("inline", [False, True])
async def test_a_failing_request_handler_ends_the_connection(inline: bool) -> None:
    conn, peer, writer = await _failing_pair()

    async def ask(params: Any) -> Any:
        raise SinkUnavailable("could not record the question")

    conn.route("cursor/ask_question", ask, inline=inline)
    call = asyncio.create_task(conn.request("session/prompt", {}, timeout=None))
    await peer.recv()
    await peer.send({"jsonrpc": "2.0", "id": 3, "method": "cursor/ask_question", "params": {}})
    with pytest.raises(SinkUnavailable):
        await asyncio.wait_for(call, 2)
    await _close(conn, peer, writer)
