"""The real agents under conformance, and what each one was observed to do offline.

Every field here is a fact measured against the pinned version inside the local
sandbox (no network, empty HOME), not a wish: the tests assert exactly these.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
FAKE_KEY = "conformance-fake-key-7c1e0b5d"
# Inside every sandbox the closure is mounted here; agents' own children run from it too.
PACK_MOUNT = "/opt/acp-pack/node_modules/"


@dataclass(frozen=True, slots=True)
class Agent:
    pack: str
    credential: str
    # Where the job stops as auth_required without credentials: -32000 from the agent, or
    # the pack's `authenticate` refused (then with the agent's own error code).
    auth_at: str
    # Extra (`_meta`) fields the agent sends at initialize, as paths into agent.initialized.
    extra_paths: tuple[tuple[str | int, ...], ...]
    # With a (fake) credential bound, does session/prompt hang offline, and does the
    # agent answer session/cancel within the grace period (else the worker kills it)?
    prompt_hangs: bool
    answers_cancel: bool
    # What it sends on its own (notifications) offline with a (fake) key, each as
    # `session/update:<kind>` or its method: at least these, every run (wire-tapped).
    sends: frozenset[str]
    # Of what it sends, what no canonical event holds (kept as provider.unmapped). Empty:
    # its real traffic has no unknown kind; the emulator covers those
    # (tests/integration/test_cursor_scenarios.py::test_unknown_kinds_and_fields_are_kept).
    unmapped: frozenset[str] = frozenset()
    auth_rpc_code: int = -32000


AGENTS = (
    Agent(
        pack="claude-agent-acp",
        credential="ANTHROPIC_API_KEY",
        auth_at="session/prompt",
        extra_paths=(("agent_capabilities", "_meta", "claudeCode"),),
        prompt_hangs=True,
        answers_cancel=True,
        # Without a key, a `usage_update` sometimes follows the refused prompt.
        sends=frozenset({"session/update:available_commands_update"}),
    ),
    Agent(
        pack="codex-acp",
        credential="OPENAI_API_KEY",
        # The pack declares `authenticate: api-key`: without a key codex-acp refuses it
        # (-32603, "CODEX_API_KEY or OPENAI_API_KEY is not set"); with one, the prompt runs.
        auth_at="authenticate",
        auth_rpc_code=-32603,
        extra_paths=(("agent_capabilities", "_meta"), ("auth_methods", 0, "_meta", "api-key")),
        prompt_hangs=True,
        answers_cancel=False,
        # After `authenticate`: an extension notification ({"authStatus": {...}}), no
        # session/update at all before the prompt.
        sends=frozenset({"_auth/status_update"}),
        unmapped=frozenset({"_auth/status_update"}),
    ),
    Agent(
        pack="gemini-cli",
        credential="GEMINI_API_KEY",
        auth_at="session/new",
        extra_paths=(("auth_methods", 1, "_meta", "api-key"), ("auth_methods", 3, "_meta")),
        prompt_hangs=True,
        answers_cancel=False,
        sends=frozenset({"session/update:available_commands_update"}),
    ),
)
BY_PACK = {agent.pack: agent for agent in AGENTS}


def write_job(tmp_path: Path, agent: Agent, *, with_key: bool, timeout_s: float = 60) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# conformance\n")
    job: dict[str, Any] = {
        "v": 1,
        "job_id": f"conf-{agent.pack}-{tmp_path.name[-12:]}".replace("_", "-"),
        "pack": {"name": agent.pack},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": "Reply with the single word: pong",
        "limits": {"timeout_s": timeout_s, "memory_mb": 2048, "pids": 512},
    }
    if with_key:
        secrets = tmp_path / "secrets"
        secrets.mkdir(exist_ok=True)
        (secrets / "key").write_text(FAKE_KEY + "\n")
        job["credentials"] = {agent.credential: "file:key"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def run_job(
    job: Path, env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def of_type(stream: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in stream if e["type"] == type_]


def processes_with(*markers: str, settle_s: float = 3.0) -> list[str]:
    """Live processes whose command line holds any marker (polled until none, or settle_s)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = _scan(markers)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _scan(markers: tuple[str, ...]) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (
                (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
        except OSError:
            continue
        if any(marker in cmdline for marker in markers):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def shape(value: Any) -> Any:
    """Keys and JSON types, not values: what a golden capture pins."""
    if isinstance(value, dict):
        return {key: shape(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        seen: dict[str, Any] = {}
        for item in value:
            seen.setdefault(json.dumps(shape(item), sort_keys=True), shape(item))
        return [seen[key] for key in sorted(seen)]
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string"}[type(value)]


def dig(value: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        value = value[step]
    return value
