"""Every request and reply the worker sends, checked against the ACP schema models.

The worker builds its wire as plain JSON and never imports ``acp`` at run time
(:mod:`worker.rpc.wire` says why: the import alone costs about a third of a second per
process). The protocol is enforced here instead: each object the worker puts on the wire
must validate against its ``acp.schema`` model, and that model dumped back (by alias,
only the fields that were set) must equal the object, so a misspelt key, a key the
schema does not have, or a value the model would coerce fails CI. Validation alone would
not do: the models ignore unknown keys and salvage many invalid values to their default
instead of refusing them.

Deliberate deviations, each checked below so that a schema change that resolves one
fails here and gets looked at:

- ``session/set_model`` is not in the schema. It is the legacy model call Cursor still
  implements; the schema's way is ``session/set_config_option``, which the worker uses
  when the agent offers a model option.
- A terminal's exit ``signal`` (``terminal/output``'s ``exitStatus`` and
  ``terminal/wait_for_exit``) is the signal's *number* in ours (``9``) and a *string*
  (a signal name) in the schema, whose model salvages our number to null. The worker has
  sent the number since terminals were added, and the emulator transcripts and agents
  reading it would see a wire change, so it changes only on purpose (behaviour is frozen
  while the tree is reshaped).
- ``cursor/*`` requests are Cursor's extension methods, outside the schema; their
  answers are Cursor's own shapes (:mod:`worker.acp.cursor`).
- ``initialize``'s ``clientCapabilities._meta`` carries Cursor's ``subagents`` and
  ``parameterizedModelPicker`` switches: inside the schema (``_meta`` is free-form), so
  they validate, but no other agent reads them.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from acp import meta, schema
from pydantic import BaseModel

from tests.unit.acp_far_side import (
    PERMISSION,
    Agent,
    Events,
    HostSandbox,
    answering,
    connected,
    exchange,
)
from worker.acp import client as client_module
from worker.acp.client import AcpClient, ClientCapabilities
from worker.acp.fs import FileService
from worker.acp.permissions import PermissionPolicy
from worker.acp.terminal import Terminals
from worker.interactions.requests import native_reply
from worker.sandbox.hostfiles import HostWorkspaceFiles

ACP_DIR = Path(client_module.__file__).parent
SESSIONS_CLIENT = Path(__file__).resolve().parents[1] / "acp_sessions.py"

#: Method the worker calls -> the schema model of its params.
REQUESTS: dict[str, type[BaseModel]] = {
    "initialize": schema.InitializeRequest,
    "authenticate": schema.AuthenticateRequest,
    "session/new": schema.NewSessionRequest,
    "session/load": schema.LoadSessionRequest,
    "session/list": schema.ListSessionsRequest,
    "session/resume": schema.ResumeSessionRequest,
    "session/fork": schema.ForkSessionRequest,
    "session/set_mode": schema.SetSessionModeRequest,
    "session/set_config_option": schema.SetSessionConfigOptionSelectRequest,
    "session/prompt": schema.PromptRequest,
    "session/cancel": schema.CancelNotification,
}
#: Methods the worker calls that the schema does not have (see the module docstring).
NOT_IN_SCHEMA = frozenset({"session/set_model"})

#: Method the agent calls on the worker -> the schema model of the worker's reply.
REPLIES: dict[str, type[BaseModel]] = {
    "fs/read_text_file": schema.ReadTextFileResponse,
    "fs/write_text_file": schema.WriteTextFileResponse,
    "terminal/create": schema.CreateTerminalResponse,
    "terminal/output": schema.TerminalOutputResponse,
    "terminal/wait_for_exit": schema.WaitForTerminalExitResponse,
    "terminal/kill": schema.KillTerminalResponse,
    "terminal/release": schema.ReleaseTerminalResponse,
    "session/request_permission": schema.RequestPermissionResponse,
}


def assert_conforms(model: type[BaseModel], sent: Mapping[str, Any]) -> None:
    """``sent`` validates as ``model`` and comes back unchanged from it."""
    parsed = model.model_validate(sent)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == sent


@pytest.fixture
async def wire() -> AsyncIterator[tuple[AcpClient, Agent]]:
    async with connected() as pair:
        yield pair


Call = Callable[[AcpClient], Awaitable[Any]]

#: Every call the client makes, with an answer that lets it return.
CALLS: list[tuple[str, Call, Any]] = [
    ("initialize", lambda c: c.initialize(ClientCapabilities()), {"protocolVersion": 1}),
    (
        "initialize",
        lambda c: c.initialize(
            ClientCapabilities(fs=True, terminal=True, parameterized_models=True)
        ),
        {"protocolVersion": 1},
    ),
    (
        "initialize",
        lambda c: c.initialize(ClientCapabilities(fs=True, subagents=False)),
        {"protocolVersion": 1},
    ),
    ("authenticate", lambda c: c.authenticate("key", [{"id": "key"}]), {}),
    ("session/new", lambda c: c.new_session("/workspace"), {"sessionId": "s1"}),
    ("session/load", lambda c: c.load_session("s1", "/workspace"), {}),
    ("session/list", lambda c: c.list_sessions(), {"sessions": []}),
    ("session/list", lambda c: c.list_sessions("/workspace"), {"sessions": []}),
    ("session/resume", lambda c: c.resume_session("s1", "/workspace"), {}),
    ("session/fork", lambda c: c.fork_session("s1", "/workspace"), {}),
    ("session/set_mode", lambda c: c.set_mode("s1", "plan"), {}),
    (
        "session/set_config_option",
        lambda c: c.set_config_option("s1", "model", "gpt-5"),
        {"configOptions": []},
    ),
    (
        "session/prompt",
        lambda c: c.prompt("s1", [{"type": "text", "text": "hi"}]),
        {"stopReason": "end_turn"},
    ),
    (
        "session/prompt",
        lambda c: c.prompt("s1", [{"type": "text", "text": "a"}, {"type": "text", "text": ""}]),
        {"stopReason": "end_turn"},
    ),
]


@pytest.mark.parametrize(
    ("method", "call", "answer"), CALLS, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(CALLS)]
)
async def test_every_request_is_the_schemas(
    wire: tuple[AcpClient, Agent], method: str, call: Call, answer: Any
) -> None:
    client, agent = wire
    line, _ = await exchange(agent, call(client), answering(answer))
    sent = json.loads(line)
    assert sent["method"] == method
    assert method in meta.AGENT_METHODS.values()
    assert_conforms(REQUESTS[method], sent["params"])


async def test_cancel_is_the_schemas(wire: tuple[AcpClient, Agent]) -> None:
    client, agent = wire
    await client.cancel("s1")
    await agent.serve_one(answering(None))
    sent = json.loads(agent.lines[-1])
    assert sent["method"] == "session/cancel"
    assert "id" not in sent  # a notification
    assert_conforms(REQUESTS["session/cancel"], sent["params"])


async def test_set_model_is_not_in_the_schema(wire: tuple[AcpClient, Agent]) -> None:
    """Deviation: the legacy call, kept for Cursor; the schema has neither method nor model."""
    client, agent = wire
    line, _ = await exchange(agent, client.set_model("s1", "gpt-5"), answering(None))
    assert json.loads(line)["params"] == {"sessionId": "s1", "modelId": "gpt-5"}
    assert "session/set_model" not in meta.AGENT_METHODS.values()
    assert not hasattr(schema, "SetSessionModelRequest")


def test_every_method_the_client_sends_is_checked_here() -> None:
    """A new call in the client fails here until it has a schema model or a deviation."""
    # The worker's client, plus the session methods only the tests call.
    source = (ACP_DIR / "client.py").read_text() + SESSIONS_CLIENT.read_text()
    sent = set(re.findall(r'(?:_call|notify)\(\s*"([^"]+)"', source))
    assert sent == set(REQUESTS) | NOT_IN_SCHEMA
    assert {method for method, _, _ in CALLS} | {"session/cancel"} == set(REQUESTS)


def test_every_method_the_worker_answers_is_checked_here() -> None:
    """A new inbound handler fails here until its reply has a model or a deviation."""
    routed: set[str] = set()
    for module in ACP_DIR.glob("*.py"):
        routed |= set(re.findall(r'route\(\s*"([^"]+)"', module.read_text()))
    assert {m for m in routed if not m.startswith("cursor/")} == set(REPLIES)
    assert set(REPLIES) <= set(meta.CLIENT_METHODS.values())


async def test_file_replies_are_the_schemas(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    files = FileService(HostWorkspaceFiles(tmp_path), read_limit=1024)
    for params in ({"path": "a.txt"}, {"path": "/workspace/a.txt", "line": 2, "limit": 1}):
        assert_conforms(REPLIES["fs/read_text_file"], await files.read(params))
    assert_conforms(
        REPLIES["fs/write_text_file"], await files.write({"path": "b.txt", "content": "x"})
    )


async def test_terminal_replies_are_the_schemas(tmp_path: Path) -> None:
    terminals = Terminals(HostSandbox(tmp_path), output_limit=8)  # type: ignore[arg-type]
    created = await terminals.create({"command": "sh", "args": ["-c", "echo 0123456789; exit 3"]})
    assert_conforms(REPLIES["terminal/create"], created)
    assert_conforms(REPLIES["terminal/wait_for_exit"], await terminals.wait_for_exit(created))
    finished = await terminals.output(created)
    assert finished["truncated"] is True
    assert finished["exitStatus"] == {"exitCode": 3, "signal": None}
    assert_conforms(REPLIES["terminal/output"], finished)
    assert_conforms(REPLIES["terminal/kill"], await terminals.kill(created))
    assert_conforms(REPLIES["terminal/release"], await terminals.release(created))


async def test_a_killed_terminal_sends_the_signal_number_the_schema_types_as_a_string(
    tmp_path: Path,
) -> None:
    """Deviation: ``signal`` is ``9`` on our wire, a signal name in the schema."""
    terminals = Terminals(HostSandbox(tmp_path), output_limit=1024)  # type: ignore[arg-type]
    created = await terminals.create({"command": "sleep", "args": ["30"]})
    running = await terminals.output(created)
    assert running["exitStatus"] is None
    assert_conforms(REPLIES["terminal/output"], running)
    assert_conforms(REPLIES["terminal/kill"], await terminals.kill(created))
    status = await terminals.wait_for_exit(created)
    assert status == {"exitCode": None, "signal": 9}
    # The model does not refuse the number: it salvages it to null, so an SDK-built agent
    # reads "no signal". Only the round trip shows it.
    parsed = schema.WaitForTerminalExitResponse.model_validate(status)
    assert parsed.signal is None
    with pytest.raises(AssertionError):
        assert_conforms(REPLIES["terminal/wait_for_exit"], status)
    # Everything but the signal's type is the schema's.
    assert_conforms(REPLIES["terminal/wait_for_exit"], {**status, "signal": "SIGKILL"})
    await terminals.close_all()


def _permission_with(*kinds: str, tool_kind: str = "execute") -> dict[str, Any]:
    options = [o for o in PERMISSION["options"] if o["kind"] in kinds]
    return {**PERMISSION, "toolCall": {**PERMISSION["toolCall"], "kind": tool_kind}} | {
        "options": options
    }


@pytest.mark.parametrize(
    ("policy", "params"),
    [
        ("allow_all", PERMISSION),
        ("deny", PERMISSION),
        ("allow_reads", _permission_with("allow_once", "reject_once", tool_kind="read")),
        ("allow_reads", PERMISSION),
        ("deny", _permission_with("allow_once")),  # nothing to reject with: cancelled
    ],
)
async def test_permission_outcomes_are_the_schemas(policy: str, params: dict[str, Any]) -> None:
    handler = PermissionPolicy(policy, emit=Events(), broker=None)  # type: ignore[arg-type]
    reply = await handler(params)
    assert isinstance(reply, dict)
    assert_conforms(REPLIES["session/request_permission"], reply)


async def test_a_refused_permission_is_the_schemas() -> None:
    handler = PermissionPolicy(
        "allow_all",
        emit=Events(),
        broker=None,  # type: ignore[arg-type]
        attribute=lambda _session, _tool: (None, "unknown_session"),
    )
    reply = await handler(PERMISSION)
    assert reply == {"outcome": {"outcome": "selected", "optionId": "reject-once"}}
    assert_conforms(REPLIES["session/request_permission"], reply)


@pytest.mark.parametrize(
    "answer", [{"outcome": "selected", "option_id": "allow-once"}, {"outcome": "cancelled"}]
)
def test_answered_permissions_are_the_schemas(answer: dict[str, Any]) -> None:
    """What a person's answer becomes on the wire (through the interaction broker)."""
    assert_conforms(REPLIES["session/request_permission"], native_reply("permission", answer))
