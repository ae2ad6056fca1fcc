"""Sessions: resume a recorded session with ``session/load`` (history marked as replay,
never duplicated as new output), ``session/list``, and fork/resume reported unsupported
because the agent says method-not-found.

The runner-level tests here use the in-package fake backend, with a fresh HOME per
sandbox in which the job's state mounts appear (the worker's session store keeps the
session between jobs); ``test_session_resume.py`` runs the same on real bubblewrap and
Podman."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.acp_sessions import SessionsClient
from tests.integration.test_run_job import SECRET
from worker.acp.agent import AgentProcess
from worker.acp.client import ClientCapabilities
from worker.errors import SessionNotFound, Unsupported
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import HOME, PACK_ROOT, SandboxSpec, home_relative
from worker.sandbox.fake import FakeBackend, FakeProcess, FakeSandbox
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
EMULATOR = REPO / "provider_packs" / "cursor-emulator" / "src" / "cursor_emulator.py"


class _Sandbox(FakeSandbox):
    """The fake sandbox with the pack root mapped and a fresh host HOME, in which each
    state mount appears as a link to its source (the fake mounts nothing)."""

    def __init__(self, sandbox_id: str, spec: SandboxSpec, homes: Path) -> None:
        super().__init__(sandbox_id, spec)
        homes.mkdir(exist_ok=True)
        self._home = Path(tempfile.mkdtemp(prefix=f"{sandbox_id}-", dir=homes))
        for mount in spec.state_mounts:
            link = self._home / home_relative(mount.target)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(mount.source)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = "/workspace",
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> FakeProcess:
        mapped = [str(self.host_path(a)) if a.startswith(PACK_ROOT) else a for a in argv]
        fixed = {k: v.replace(HOME, str(self._home)) for k, v in env.items()}
        return await super().spawn(mapped, env=fixed, cwd=cwd, stdout_limit=stdout_limit)


class _Backend(FakeBackend):
    def __init__(self, home: Path) -> None:
        super().__init__()
        self._home = home

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = await super().create(spec)
        self.sandboxes[sandbox.sandbox_id] = _Sandbox(sandbox.sandbox_id, spec, self._home)
        return self.sandboxes[sandbox.sandbox_id]


class _Collect:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        self.events.append(dict(event))

    async def close(self) -> None:
        return None


async def _run(tmp_path: Path, homes: Path, **extra: Any) -> list[dict[str, Any]]:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "key").write_text(SECRET)
    spec = parse_job(
        {
            "v": 1,
            "job_id": "resume-1",
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": "ws"},
            "prompt": "scenario: hello",
            "credentials": {"CURSOR_API_KEY": "file:key"},
            **extra,
        }
    )
    settings = Settings(
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        results_dir=tmp_path / "results",
    )
    sink = _Collect()
    await run_job(
        spec,
        settings=settings,
        backend=_Backend(homes),
        sinks=[sink],
        environ={},
        base_dir=tmp_path,
    )
    return sink.events


async def test_resume_replays_history_marked_as_replay(tmp_path: Path) -> None:
    homes = tmp_path / "homes"
    first = await _run(tmp_path, homes)
    assert first[-1]["data"]["status"] == "succeeded", first[-1]
    [started] = [e["data"] for e in first if e["type"] == "session.started"]
    session_id = started["session_id"]
    kept = tmp_path / "sessions" / "cursor-emulator" / session_id
    assert (kept / "history.json").is_file()
    second = await _run(tmp_path, homes, session={"resume": session_id})
    assert second[-1]["data"]["status"] == "succeeded", second[-1]
    [resumed] = [e["data"] for e in second if e["type"] == "session.started"]
    assert (resumed["session_id"], resumed["resumed"]) == (session_id, True)
    replay = [e for e in second if e["data"].get("replay")]
    fresh = [e for e in second if e["type"] == "message.delta" and not e["data"].get("replay")]
    roles = {e["data"]["role"] for e in replay if e["type"] == "message.delta"}
    assert roles == {"user", "thought", "assistant"}
    assert [e["data"]["tool_call_id"] for e in replay if e["type"] == "tool.started"] == [
        "replay-0-0"
    ]
    # Replay comes before the session starts; the new turn's output is not marked.
    assert max(e["seq"] for e in replay) < min(e["seq"] for e in fresh)
    said = "".join(e["data"]["text"] for e in fresh if e["data"]["role"] == "assistant")
    assert said.startswith("Hello!")


async def test_resume_of_an_unknown_session_is_refused_before_launch(tmp_path: Path) -> None:
    events = await _run(
        tmp_path, tmp_path / "homes", session={"resume": "0f0f0f0f-0000-4000-8000-000000000000"}
    )
    error = events[-1]["data"]["error"]
    assert (error["code"], error["details"]["reason"]) == ("session_not_found", "not_recorded")
    assert "sandbox.ready" not in [e["type"] for e in events]


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EMULATOR),
        "--disable-project-configs",
        "--disable-auto-update",
        "acp",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(tmp_path), "CURSOR_API_KEY": "k"},
        start_new_session=True,
    )
    agent = AgentProcess(
        FakeProcess(proc), line_limit=1 << 20, request_timeout=10, stderr_limit=4096
    )
    agent.start()
    acp = SessionsClient(agent.connection)
    await acp.initialize(ClientCapabilities())
    yield acp
    await agent.shutdown(eof_grace=2, term_grace=2)


async def test_fork_and_resume_are_reported_unsupported(client: SessionsClient) -> None:
    session = await client.new_session("/tmp")
    for call in (client.fork_session, client.resume_session):
        with pytest.raises(Unsupported) as caught:
            await call(str(session["sessionId"]), "/tmp")
        assert caught.value.details["rpc_code"] == -32601


async def test_list_and_load(client: SessionsClient) -> None:
    session = await client.new_session("/tmp")
    session_id = str(session["sessionId"])
    # Never prompted: not listed (docs/CURSOR_ACP_FACTS.md §3).
    assert await client.list_sessions() == []
    await client.prompt(session_id, [{"type": "text", "text": "hi"}])
    assert [s["sessionId"] for s in await client.list_sessions()] == [session_id]
    loaded = await client.load_session(session_id, "/tmp")
    assert set(loaded) == {"modes", "models", "configOptions"}
    with pytest.raises(SessionNotFound):
        await client.load_session("0f0f0f0f-0000-4000-8000-000000000000", "/tmp")
