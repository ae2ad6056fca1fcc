"""Full turns of every real npm agent pack, through the worker (issue 14, item 2).

claude-agent-acp, codex-acp and gemini-cli run from their packs in real bubblewrap
(``run_job``, the local backend), their model API our scripted fake on 127.0.0.1
(``tests/fake_models``) declared as the operator's model endpoint (``endpoint_jobs``).
Per agent:

- ``text``: a plain reply streams as ``message.delta``; the job succeeds, ``end_turn``;
- ``read``: the model reads a workspace file with the agent's tool: a tool event, and the
  next model request carries the file's content;
- ``write_edit``: the model writes a new file and edits an existing one, under
  ``permissions.policy`` ``allow_all`` and ``ask`` (each permission asked is answered
  allow through Redis by a task watching the events); ``workspace.changed`` and its patch
  show both files. codex-acp asks only in a mode where its commands fail (below);
- ``shell``: a command's output reaches the model and a tool event (gemini-cli 0.61 shows
  it to the model only: asserted as such);
- ``cancel``: the fake holds a streamed reply open, the test cancels, the job settles
  ``cancelled`` promptly, the model request is dropped and no sandbox or work dir is left.

codex-acp: in ``agent-full-access`` (what its jobs use) it asks no permission at all and
its commands run; in ``workspace-write`` and ``read-only`` it asks before each
``apply_patch`` (and applies it once allowed), but every ``exec_command`` fails unasked:
its own bubblewrap sandbox needs user namespaces, which our sandbox does not give
(``test_codex_commands_fail_where_it_asks``).

No sleeps: each wait is the job's end or an event, bounded (the job's ``timeout_s``, 60 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests.fake_models import FakeModel, Reply, hang, say
from tests.integration.agent_tools import SHELL_CMD, SHELL_OUT
from tests.integration.endpoint_jobs import (
    AGENTS,
    KEY,
    Event,
    endpoint_job,
    endpoint_settings,
    run_endpoint_job,
    said,
)
from worker.interactions.send import send_answer
from worker.sandbox import backend_config, get_backend
from worker.sandbox.base import LABEL_JOB

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(240)]

PACKS = sorted(AGENTS)
WS = Path("/workspace")  # the workspace as the agent sees it
SECRET = "the secret word is marmalade"
EDITED = "the secret word is quince"
WRITTEN = "written by the fake model\n"
FILES = {"notes.txt": SECRET + "\n"}
WAIT = 60.0  # the longest any wait of these tests may take


@dataclass(frozen=True, slots=True)
class Asks:
    """What writing one file and editing another asks, per agent and policy."""

    mode: str | None  # the job's mode (None: the agent's table's)
    permissions: int  # permission asks (``permission.decided`` events)


# claude (Write, Edit) and gemini-cli (write_file, replace) ask once per change in their
# default modes. codex-acp asks nothing in agent-full-access; in workspace-write it asks
# before each apply_patch (read-only does the same: docs/agents-endpoints.md).
# (gemini-cli creates files only because its pack turns the client's fs methods off,
# ``launch.client_fs``: through them its write_file fails with "Error checking existing
# file: Resource not found".)
ASKS: dict[tuple[str, str], Asks] = {
    ("claude-agent-acp", "allow_all"): Asks(None, 2),
    ("claude-agent-acp", "ask"): Asks(None, 2),
    ("codex-acp", "allow_all"): Asks(None, 0),
    ("codex-acp", "ask"): Asks("workspace-write", 2),
    ("gemini-cli", "allow_all"): Asks(None, 2),
    ("gemini-cli", "ask"): Asks(None, 2),
}


@pytest.fixture(scope="module")
def pack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pack cache for the module: each closure is materialized once."""
    return tmp_path_factory.mktemp("pack-cache")


def _of(events: list[Event], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _explain(fake: FakeModel, events: list[Event]) -> str:
    lines = [f"{r.method} {r.path} main={r.main}" for r in fake.requests]
    lines += [f"unknown: {r.method} {r.path}" for r in fake.unknown]
    lines += [f"fake error: {e}" for e in fake.errors]
    lines += [json.dumps(e)[:600] for e in events[-6:]]
    return "\n".join(lines)


def _tool_outputs(events: list[Event]) -> str:
    return "".join(
        (d.get("output") or {}).get("text", "")
        for d in _of(events, "tool.updated") + _of(events, "tool.completed")
    )


async def _job(
    tmp_path: Path,
    pack_cache: Path,
    pack: str,
    script: list[Reply],
    prompt: str,
    **job: Any,
) -> tuple[str, list[Event], FakeModel]:
    """One job of ``pack`` whose model plays ``script``; checks the script was used up
    and the credential never showed."""
    agent = AGENTS[pack]
    with agent.fake(script) as fake:
        settings = endpoint_settings(tmp_path, fake, pack_cache, pack)
        spec = endpoint_job(tmp_path, prompt, pack, FILES, **{**agent.job, **job})
        status, events = await run_endpoint_job(settings, spec)
    assert not fake.errors, _explain(fake, events)
    assert not fake.script, f"unconsumed {fake.script}\n{_explain(fake, events)}"
    assert KEY not in json.dumps(events)
    return status, events, fake


#: What each agent reports of its usage, kept in ``job.completed.usage``: claude its cost
#: (from the fake's token counts) and tokens, codex tokens only, gemini nothing.
USAGE = {"claude-agent-acp": {"cost", "tokens"}, "codex-acp": {"tokens"}, "gemini-cli": set()}


@pytest.mark.parametrize("pack", PACKS)
async def test_text(tmp_path: Path, pack_cache: Path, pack: str) -> None:
    status, events, fake = await _job(
        tmp_path, pack_cache, pack, [say("Hello from the fake model")], "Say hello"
    )
    assert status == "succeeded", _explain(fake, events)
    assert said(events).endswith("Hello from the fake model")
    [done] = _of(events, "job.completed")
    assert (done["status"], done["stop_reason"], done["error"]) == ("succeeded", "end_turn", None)
    [request] = fake.main_requests
    assert "Say hello" in request.text
    usage = done["usage"]
    assert (usage["available"], set(usage) - {"available"}) == (bool(USAGE[pack]), USAGE[pack])
    if "tokens" in usage:
        assert usage["tokens"]["total"] >= usage["tokens"]["output"] > 0
    if "cost" in usage:
        assert usage["cost"]["currency"] == "USD"
        assert usage["cost"]["amount"] > 0


@pytest.mark.parametrize("pack", PACKS)
async def test_read(tmp_path: Path, pack_cache: Path, pack: str) -> None:
    script = [AGENTS[pack].tools.read(WS / "notes.txt"), say("It says marmalade")]
    status, events, fake = await _job(
        tmp_path, pack_cache, pack, script, "What does notes.txt say?"
    )
    assert status == "succeeded", _explain(fake, events)
    first, second = fake.main_requests
    assert SECRET not in first.text
    assert SECRET in second.text, "the tool result never reached the model"
    # gemini-cli 0.61 may send only the completed call.
    [tool] = {
        d["tool_call_id"] for d in _of(events, "tool.started") + _of(events, "tool.completed")
    }
    assert [d["status"] for d in _of(events, "tool.completed")] == ["completed"], tool
    assert said(events).endswith("It says marmalade")


class _Feed:
    """An event sink handing every event to the test as the job emits it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    async def write(self, event: Event, line: str) -> None:
        self.queue.put_nowait(dict(event))

    async def close(self) -> None:
        return None


async def _allow_permissions(feed: _Feed, client: redis.Redis) -> list[str]:
    """The control plane: answers each permission the job asks with its allow-once
    option, through Redis, until the job completes; the interactions answered."""
    answered = []
    while True:
        event = await feed.queue.get()
        if event["type"] == "job.completed":
            return answered
        data = event["data"]
        if event["type"] != "interaction.requested" or data["kind"] != "permission":
            continue
        [allow] = [o for o in data["permission"]["options"] if o["kind"] == "allow_once"]
        answer = {"outcome": "selected", "option_id": allow["option_id"]}
        send_answer(client, event["job_id"], data["interaction_id"], answer)
        answered.append(data["interaction_id"])


@pytest.mark.parametrize("policy", ["allow_all", "ask"])
@pytest.mark.parametrize("pack", PACKS)
async def test_write_edit(
    tmp_path: Path, pack_cache: Path, pack: str, policy: str, redis_url: str
) -> None:
    agent = AGENTS[pack]
    asks = ASKS[pack, policy]
    tools = agent.tools
    script = [
        tools.write(WS / "out.txt", WRITTEN),
        *tools.edit(WS / "notes.txt", SECRET, EDITED),
        say("Wrote and edited"),
    ]
    job: dict[str, Any] = {**agent.job, "permissions": {"policy": policy}}
    if asks.mode is not None:
        job["mode"] = asks.mode
    feed = _Feed()
    sync = redis.Redis.from_url(redis_url)
    control = aioredis.Redis.from_url(redis_url)
    try:
        with agent.fake(script) as fake:
            settings = endpoint_settings(tmp_path, fake, pack_cache, pack)
            spec = endpoint_job(tmp_path, "Write out.txt, edit notes.txt", pack, FILES, **job)
            answering = asyncio.create_task(_allow_permissions(feed, sync))
            status, events = await run_endpoint_job(
                settings, spec, sinks=[feed], control=control if policy == "ask" else None
            )
            answered = await asyncio.wait_for(answering, WAIT)
    finally:
        await control.aclose()
        sync.close()
    assert status == "succeeded", _explain(fake, events)
    assert not fake.script, _explain(fake, events)
    decided = _of(events, "permission.decided")
    assert len(decided) == asks.permissions, decided
    assert {(d["policy"], d["decision"]) for d in decided} <= {(policy, "allowed")}
    if policy == "ask":
        resolved = _of(events, "interaction.resolved")
        assert [r["interaction_id"] for r in resolved] == answered
        assert len(answered) == asks.permissions
        assert {(r["outcome"], r["resolved_by"], r["delivered"]) for r in resolved} <= {
            ("selected", "answer", True)
        }
        assert [d["interaction_id"] for d in decided] == answered
    else:
        assert answered == []
    [changed] = _of(events, "workspace.changed")
    assert {p["path"]: p["status"] for p in changed["paths"]} == {
        "out.txt": "added",
        "notes.txt": "modified",
    }
    patch = Path(changed["patch"]["path"]).read_text()
    assert "+" + WRITTEN.strip() in patch
    assert f"-{SECRET}\n+{EDITED}" in patch
    # The job worked on a copy: the caller's workspace is as it was.
    assert (tmp_path / "ws" / "notes.txt").read_text() == SECRET + "\n"


@pytest.mark.parametrize("pack", PACKS)
async def test_shell(tmp_path: Path, pack_cache: Path, pack: str) -> None:
    tools = AGENTS[pack].tools
    script = [tools.shell(SHELL_CMD), say("Ran it")]
    status, events, fake = await _job(
        tmp_path,
        pack_cache,
        pack,
        script,
        "Run the marker command",
        permissions={"policy": "allow_all"},
    )
    assert status == "succeeded", _explain(fake, events)
    assert SHELL_OUT in fake.main_requests[1].text  # the output went back to the model
    [completed] = _of(events, "tool.completed")
    assert completed["status"] == "completed"
    # gemini-cli 0.61 sends the output to the model only: its updates carry none.
    assert (SHELL_OUT in _tool_outputs(events)) == tools.shell_output_shown, events
    if tools.shell_output_shown:
        assert completed.get("exit_code") in (0, None)


async def test_codex_commands_fail_where_it_asks(tmp_path: Path, pack_cache: Path) -> None:
    """codex-acp asks permissions only in modes that run its commands in its own
    bubblewrap sandbox, which cannot start inside ours (no user namespaces): the command
    fails, unasked, and the model is told why."""
    script = [AGENTS["codex-acp"].tools.shell(SHELL_CMD), say("It failed")]
    status, events, fake = await _job(
        tmp_path,
        pack_cache,
        "codex-acp",
        script,
        "Run the marker command",
        mode="workspace-write",
        permissions={"policy": "allow_all"},
    )
    assert status == "succeeded", _explain(fake, events)
    assert _of(events, "permission.decided") == []
    [completed] = _of(events, "tool.completed")
    assert (completed["status"], completed["exit_code"]) == ("failed", 1)
    assert "bwrap: No permissions to create new namespace" in completed["output"]["text"]
    assert SHELL_OUT not in fake.main_requests[1].text
    assert "No permissions to create new namespace" in fake.main_requests[1].text


class _CancelOnText:
    """Cancels the job (run_job's ``cancel``) at the first assistant text, noting when."""

    def __init__(self, cancel: asyncio.Event) -> None:
        self.cancel = cancel
        self.at: float | None = None

    async def write(self, event: Event, line: str) -> None:
        if self.at is None and event["type"] == "message.delta":
            self.at = time.monotonic()
            self.cancel.set()

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("pack", PACKS)
async def test_cancel(tmp_path: Path, pack_cache: Path, pack: str) -> None:
    agent = AGENTS[pack]
    cancel = asyncio.Event()
    trigger = _CancelOnText(cancel)
    with agent.fake([hang("Thinking it over")]) as fake:
        settings = endpoint_settings(tmp_path, fake, pack_cache, pack)
        spec = endpoint_job(tmp_path, "Think", pack, FILES, **agent.job)
        status, events = await run_endpoint_job(settings, spec, sinks=[trigger], cancel=cancel)
        settled = time.monotonic()
        held = fake.holding.is_set()
        # The agent (or its sandbox going) closed the model request it was reading.
        dropped = await asyncio.to_thread(fake.dropped.wait, WAIT)
    assert trigger.at is not None, _explain(fake, events)
    assert held
    assert status == "cancelled", _explain(fake, events)
    [done] = _of(events, "job.completed")
    # Each agent honoured session/cancel: its turn ended "cancelled" (not the worker's
    # kill after ACPW_CANCEL_GRACE).
    assert (done["status"], done["stop_reason"], done["error"]) == ("cancelled", "cancelled", None)
    assert events[-1]["type"] == "job.completed"
    assert settled - trigger.at < 15, settled - trigger.at  # ACPW_CANCEL_GRACE is 10 s
    assert dropped
    left = await get_backend(backend_config(settings, "local")).list({LABEL_JOB: spec.job_id})
    assert left == []
    work = tmp_path / "work"
    assert not work.exists() or list(work.iterdir()) == []
