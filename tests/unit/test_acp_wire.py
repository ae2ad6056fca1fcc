"""The exact bytes the client puts on the wire, and the replies its handlers give.

Agents (and the emulator's recorded transcripts) saw these bytes before, so the lines are
pinned here literally: same keys, same values, same order. ``test_acp_schema`` checks the
same objects against the protocol's schema models.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.acp_far_side import (
    PERMISSION,
    Agent,
    Events,
    HostSandbox,
    answering,
    connected,
    exchange,
)
from worker.acp.client import AcpClient, ClientCapabilities
from worker.acp.fs import FileService
from worker.acp.permissions import PermissionPolicy
from worker.acp.terminal import Terminals
from worker.errors import AuthRequired, ProtocolError
from worker.rpc.connection import RpcError
from worker.sandbox.hostfiles import HostWorkspaceFiles


@pytest.fixture
async def wire() -> AsyncIterator[tuple[AcpClient, Agent]]:
    async with connected() as pair:
        yield pair


async def test_initialize_line_is_unchanged(wire: tuple[AcpClient, Agent]) -> None:
    client, agent = wire
    caps = ClientCapabilities(fs=True, terminal=True, parameterized_models=True)
    answer = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True, "x-new": 1}}
    line, result = await exchange(agent, client.initialize(caps), answering(answer))
    version = json.loads(line)["params"]["clientInfo"]["version"]
    assert line == (
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,'
        b'"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":true},'
        b'"terminal":true,"_meta":{"subagents":true,"parameterizedModelPicker":true}},'
        b'"clientInfo":{"name":"acp-worker","version":"' + version.encode() + b'"}}}\n'
    )
    assert result == answer  # the agent's answer as sent: unknown fields kept


async def test_capabilities_without_extensions_send_no_meta() -> None:
    caps = ClientCapabilities(subagents=False)
    assert json.dumps(caps.to_wire(), separators=(",", ":")) == (
        '{"fs":{"readTextFile":false,"writeTextFile":false},"terminal":false}'
    )


@pytest.mark.parametrize("answer", [{"protocolVersion": 2}, {"protocolVersion": "1"}, [1]])
async def test_initialize_refuses_another_protocol(
    wire: tuple[AcpClient, Agent], answer: Any
) -> None:
    client, agent = wire
    with pytest.raises(ProtocolError):
        await exchange(agent, client.initialize(ClientCapabilities()), answering(answer))


async def test_session_lines_are_unchanged(wire: tuple[AcpClient, Agent]) -> None:
    client, agent = wire
    new = {"sessionId": "s1", "models": {"currentModelId": "m"}, "configOptions": []}
    calls: list[tuple[Awaitable[Any], Any, bytes]] = [
        (
            client.new_session("/workspace"),
            new,
            b'{"cwd":"/workspace","mcpServers":[]}',
        ),
        (
            client.load_session("s1", "/workspace"),
            None,
            b'{"sessionId":"s1","cwd":"/workspace","mcpServers":[]}',
        ),
        (client.list_sessions(), {"sessions": []}, b"{}"),
        (client.list_sessions("/w"), {"sessions": []}, b'{"cwd":"/w"}'),
        (
            client.resume_session("s1", "/w"),
            {},
            b'{"sessionId":"s1","cwd":"/w","mcpServers":[]}',
        ),
        (
            client.fork_session("s1", "/w"),
            {},
            b'{"sessionId":"s1","cwd":"/w","mcpServers":[]}',
        ),
        (client.set_mode("s1", "plan"), {}, b'{"sessionId":"s1","modeId":"plan"}'),
        (
            client.set_config_option("s1", "model", "gpt"),
            {"configOptions": []},
            b'{"sessionId":"s1","configId":"model","value":"gpt"}',
        ),
        (client.set_model("s1", "gpt"), None, b'{"sessionId":"s1","modelId":"gpt"}'),
        (
            client.prompt("s1", [{"type": "text", "text": "hi"}]),
            {"stopReason": "end_turn"},
            b'{"sessionId":"s1","prompt":[{"type":"text","text":"hi"}]}',
        ),
        (client.authenticate("key", [{"id": "key"}]), {}, b'{"methodId":"key"}'),
    ]
    for call, answer, params in calls:
        line, _ = await exchange(agent, call, answering(answer))
        assert line.endswith(b',"params":' + params + b"}\n"), line
    first = json.loads(agent.lines[0])
    assert list(first) == ["jsonrpc", "id", "method", "params"]


async def test_new_session_keeps_what_the_schema_does_not_know(
    wire: tuple[AcpClient, Agent],
) -> None:
    client, agent = wire
    answer = {"sessionId": "s1", "models": {"availableModels": [{"modelId": "m"}]}}
    _, result = await exchange(agent, client.new_session("/w"), answering(answer))
    assert result == answer


async def test_a_stop_reason_the_schema_does_not_list_is_passed_through(
    wire: tuple[AcpClient, Agent],
) -> None:
    client, agent = wire
    answer = {"stopReason": "something_new"}
    _, stop = await exchange(agent, client.prompt("s1", []), answering(answer))
    assert stop == "something_new"


async def test_cancel_line_is_unchanged(wire: tuple[AcpClient, Agent]) -> None:
    client, agent = wire
    await client.cancel("s1")
    await agent.serve_one(answering(None))
    assert agent.lines[-1] == (
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s1"}}\n'
    )


async def test_authenticate_needs_an_offered_method(wire: tuple[AcpClient, Agent]) -> None:
    client, _ = wire
    with pytest.raises(AuthRequired):
        await client.authenticate("key", [{"id": "other"}, "junk"])


async def test_file_replies(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    files = FileService(HostWorkspaceFiles(tmp_path), read_limit=1024)
    read = await files.read({"sessionId": "s", "path": "/workspace/a.txt", "line": 2, "limit": 1})
    assert read == {"content": "two\n"}
    assert await files.read({"path": "a.txt"}) == {"content": "one\ntwo\nthree\n"}
    assert await files.write({"path": "b.txt", "content": "x"}) == {}
    assert (tmp_path / "b.txt").read_text() == "x"
    with pytest.raises(RpcError) as refused:
        await files.write({"path": "b.txt"})
    assert refused.value.to_wire() == {
        "code": -32602,
        "message": "Invalid params",
        "data": {"message": "content is required"},
    }
    # A missing file is ACP's "Resource not found" (gemini-cli then writes a new file).
    with pytest.raises(RpcError) as missing:
        await files.read({"path": "/workspace/none/c.txt"})
    assert missing.value.to_wire() == {
        "code": -32002,
        "message": "Resource not found",
        "data": {
            "uri": "/workspace/none/c.txt",
            "message": "path refused: missing",
            "reason": "missing",
        },
    }


async def test_terminal_replies(tmp_path: Path) -> None:
    terminals = Terminals(HostSandbox(tmp_path), output_limit=1024)  # type: ignore[arg-type]
    created = await terminals.create(
        {
            "sessionId": "s",
            "command": "sh",
            "args": ["-c", 'printf "%s" "$GREETING"; kill -9 $$'],
            "env": [{"name": "GREETING", "value": "hello"}, {"name": "NO_VALUE"}],
        }
    )
    assert created == {"terminalId": "term-1"}
    status = await terminals.wait_for_exit(created)
    assert status == {"exitCode": None, "signal": 9}  # the number, as always sent
    output = await terminals.output(created)
    assert json.dumps(output, separators=(",", ":")) == (
        '{"output":"hello","truncated":false,"exitStatus":{"exitCode":null,"signal":9}}'
    )
    assert await terminals.kill(created) == {}
    assert await terminals.release(created) == {}
    with pytest.raises(RpcError):
        await terminals.output(created)
    with pytest.raises(RpcError):
        await terminals.create({"command": "true", "args": [1]})


@pytest.mark.parametrize(
    ("policy", "answer"),
    [
        ("allow_all", '{"outcome":{"outcome":"selected","optionId":"allow-once"}}'),
        ("deny", '{"outcome":{"outcome":"selected","optionId":"reject-once"}}'),
    ],
)
async def test_permission_answers_are_unchanged(policy: str, answer: str) -> None:
    events = Events()
    handler = PermissionPolicy(policy, emit=events, broker=None)  # type: ignore[arg-type]
    reply = await handler(PERMISSION)
    assert json.dumps(reply, separators=(",", ":")) == answer
    assert [t for t, _ in events.seen] == ["permission.decided"]


async def test_no_option_to_pick_is_cancelled() -> None:
    handler = PermissionPolicy("deny", emit=Events(), broker=None)  # type: ignore[arg-type]
    only_allow = {**PERMISSION, "options": [PERMISSION["options"][0]]}
    assert await handler(only_allow) == {"outcome": {"outcome": "cancelled"}}
