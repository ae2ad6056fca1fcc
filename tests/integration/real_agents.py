"""Real npm agents driven straight over ACP stdio (no worker, no sandbox), pointed at the
scripted fake model APIs of :mod:`tests.fake_models`.

Each agent runs from its pack's closure (the pinned archive ``provider_packs/<pack>/dist``
extracted once per session) with the pack's own launch argv and env, HOME in a tmp dir and
the fake's URL and a fake key in the environment (``ENDPOINTS``: what each needs, see
docs/agents-endpoints.md). The client is the worker's own :class:`AcpClient` on a
:class:`Connection`; it offers no fs/terminal (the agents use their own tools) and answers
every ``session/request_permission`` with the first allow option, recording it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tarfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fake_models import AnthropicFake, FakeModel, GeminiFake, OpenAIResponsesFake
from worker.acp.client import AcpClient, ClientCapabilities
from worker.rpc.connection import Connection

REPO = Path(__file__).resolve().parents[2]
FAKE_KEY = "fake-model-key-5d1c9a"
TURN_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How one agent is pointed at a fake: the fake's class and the env/files it needs."""

    pack: str
    fake: type[FakeModel]
    authenticate: str | None = None
    # (home, fake url) -> extra environment; may write files under home.
    env: Callable[[Path, str], dict[str, str]] = field(default=lambda home, url: {})


def _claude_env(home: Path, url: str) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": FAKE_KEY, "ANTHROPIC_BASE_URL": url}


CODEX_CONFIG = """\
model = "gpt-5.5"
model_provider = "fake"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false

[model_providers.fake]
name = "fake"
base_url = "{url}/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""


def _codex_env(home: Path, url: str) -> dict[str, str]:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(url=url))
    return {"OPENAI_API_KEY": FAKE_KEY, "CODEX_HOME": str(codex_home)}


def _gemini_env(home: Path, url: str) -> dict[str, str]:
    # Its usage statistics (Clearcut, play.googleapis.com) are on unless the user's
    # settings turn them off; GEMINI_TELEMETRY_ENABLED (the pack's) is OpenTelemetry only.
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False}}))
    return {"GEMINI_API_KEY": FAKE_KEY, "GOOGLE_GEMINI_BASE_URL": url}


ENDPOINTS = {
    "claude-agent-acp": Endpoint("claude-agent-acp", AnthropicFake, env=_claude_env),
    "codex-acp": Endpoint("codex-acp", OpenAIResponsesFake, authenticate="api-key", env=_codex_env),
    "gemini-cli": Endpoint("gemini-cli", GeminiFake, env=_gemini_env),
}


def pack_archive(pack: str) -> Path:
    manifest = json.loads((REPO / "provider_packs" / pack / "pack.json").read_text())
    source = manifest["platforms"]["linux-x64"]["archive"]["source"]
    return REPO / "provider_packs" / pack / source


def extract_closure(pack: str, into: Path) -> Path:
    """The pack's archive extracted under ``into/<pack>`` (once): its ``{pack}`` dir."""
    target = into / pack
    done = target / ".extracted"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(pack_archive(pack)) as tar:
            tar.extractall(target, filter="tar")
        done.touch()
    return target


def launch(pack: str, closure: Path, home: Path) -> tuple[list[str], dict[str, str]]:
    """The pack's argv and env with ``{pack}`` and ``{home}`` filled in."""
    spec = json.loads((REPO / "provider_packs" / pack / "pack.json").read_text())["launch"]
    subst = {"{pack}": str(closure), "{home}": str(home)}

    def fill(value: str) -> str:
        for key, real in subst.items():
            value = value.replace(key, real)
        return value

    argv = [fill(a) for a in spec["argv"]]
    env = {k: fill(v) for k, v in spec.get("env", {}).items()}
    return argv, env


@dataclass
class Session:
    """One live agent: its ACP client, the session, and what it sent."""

    client: AcpClient
    session_id: str
    initialized: Mapping[str, Any]
    updates: list[dict[str, Any]]
    permissions: list[dict[str, Any]]
    stderr: Path

    def mark(self) -> int:
        return len(self.updates)

    async def prompt(self, text: str) -> str:
        block = {"type": "text", "text": text}
        return await asyncio.wait_for(
            self.client.prompt(self.session_id, [block]), timeout=TURN_TIMEOUT
        )

    def kinds(self, since: int = 0) -> list[str]:
        return [u.get("sessionUpdate", "?") for u in self.updates[since:]]

    def said(self, since: int = 0) -> str:
        return "".join(
            u["content"].get("text", "")
            for u in self.updates[since:]
            if u.get("sessionUpdate") == "agent_message_chunk"
        )

    def tool_updates(self, since: int = 0) -> list[dict[str, Any]]:
        return [
            u
            for u in self.updates[since:]
            if u.get("sessionUpdate") in {"tool_call", "tool_call_update"}
        ]

    def tool_text(self, since: int = 0) -> str:
        """Everything the tool calls showed (content, raw output), as JSON text."""
        return json.dumps(self.tool_updates(since))


@contextlib.asynccontextmanager
async def agent_session(
    pack: str,
    closure: Path,
    tmp: Path,
    fake: FakeModel,
    *,
    workspace: Path,
    extra_env: Mapping[str, str] | None = None,
    resume: str | None = None,
    home: Path | None = None,
) -> AsyncIterator[Session]:
    """Start the agent against ``fake``, initialize and open a session in ``workspace``
    (``session/load`` of ``resume`` when given; HOME ``home``, default ``tmp/home``)."""
    endpoint = ENDPOINTS[pack]
    home = tmp / "home" if home is None else home
    home.mkdir(exist_ok=True)
    # Not above HOME: codex refuses to make its helper aliases (codex-linux-sandbox, which
    # its bubblewrap sandbox execs) in a CODEX_HOME under the temp dir.
    scratch = tmp / "tmp"
    scratch.mkdir(exist_ok=True)
    argv, pack_env = launch(pack, closure, home)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": str(scratch),
        "NO_PROXY": "127.0.0.1,localhost",
        **pack_env,
        **endpoint.env(home, fake.url),
        **(extra_env or {}),
    }
    stderr = home.parent / f"{pack}.{home.name}.stderr"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=workspace,
            start_new_session=True,
            limit=16 * 1024 * 1024,
        )
    updates: list[dict[str, Any]] = []
    permissions: list[dict[str, Any]] = []

    async def on_notification(method: str, params: Any) -> None:
        if method == "session/update" and isinstance(params, dict):
            updates.append(params.get("update", {}))

    async def on_permission(params: Any) -> Any:
        permissions.append(params)
        options = params.get("options", [])
        chosen = next(
            (o for o in options if o.get("kind") == "allow_once"),
            next((o for o in options if str(o.get("kind", "")).startswith("allow")), options[0]),
        )
        return {"outcome": {"outcome": "selected", "optionId": chosen["optionId"]}}

    assert proc.stdout is not None
    assert proc.stdin is not None
    connection = Connection(
        proc.stdout, proc.stdin, request_timeout=TURN_TIMEOUT, on_notification=on_notification
    )
    connection.route("session/request_permission", on_permission)
    connection.start()
    client = AcpClient(connection)
    try:
        initialized = await client.initialize(ClientCapabilities(fs=False, terminal=False))
        if endpoint.authenticate:
            await client.authenticate(endpoint.authenticate, initialized.get("authMethods"))
        if resume is None:
            opened = await client.new_session(str(workspace))
        else:
            await client.load_session(resume, str(workspace))
        yield Session(
            client=client,
            session_id=resume if resume is not None else str(opened["sessionId"]),
            initialized=initialized,
            updates=updates,
            permissions=permissions,
            stderr=stderr,
        )
    finally:
        await connection.aclose()
        _record(pack, updates)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout=5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def _record(pack: str, updates: list[dict[str, Any]]) -> None:
    """With ``ACPW_RECORD_UPDATES=DIR``, append the session's updates to
    ``DIR/<pack>.jsonl`` (one update a line): how the fixtures of real shapes under
    ``tests/unit/fixtures/`` were captured."""
    where = os.environ.get("ACPW_RECORD_UPDATES")
    if not where:
        return
    with (Path(where) / f"{pack}.jsonl").open("a", encoding="utf-8") as out:
        out.writelines(json.dumps(update, sort_keys=True) + "\n" for update in updates)
