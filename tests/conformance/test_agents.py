"""Conformance of real third-party ACP agents, each run from its locked npm pack through
``acp-worker run`` in the local bubblewrap sandbox (no network, empty HOME).

Per agent: initialize answers protocol 1 within 15 s and what it advertises lands in
``agent.initialized`` (shape pinned by a golden capture); without credentials the job
fails ``auth_required`` with the agent's message, wherever the agent refuses; the extra
fields it sends are kept; no process outlives the job. Every notification the agent
writes to its stdout (tapped on the wire, through the sandbox backend seam) becomes its
canonical event or a ``provider.unmapped`` carrying its kind and raw payload: nothing is
dropped. Where an agent's prompt hangs offline, a cancel settles ``cancelled`` within
the grace period, and an agent that does not answer the cancel is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conformance.agents import (
    AGENTS,
    BY_PACK,
    FAKE_KEY,
    GOLDEN,
    PACK_MOUNT,
    REPO,
    Agent,
    dig,
    events,
    of_type,
    processes_with,
    run_job,
    shape,
    write_job,
)
from tests.conformance.wiretap import TappedBackend, WireTap
from tests.procs import finish
from worker.events.content import terminal_meta
from worker.events.normalizer import KNOWN_FIELDS
from worker.events.schema import event_schema
from worker.events.sinks import MemorySink
from worker.job import run_job as run_in_process
from worker.jobs.spec import parse_job
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.settings import Settings

pytestmark = pytest.mark.conformance
IDS = [agent.pack for agent in AGENTS]


def _check_stream(stream: list[dict[str, Any]]) -> dict[str, Any]:
    validator = jsonschema.Draft202012Validator(event_schema())
    for event in stream:
        errors = list(validator.iter_errors(event))
        assert not errors, f"{event['type']}: {errors[0].message}"
    assert [e["seq"] for e in stream] == list(range(1, len(stream) + 1))
    assert [e["type"] for e in stream].count("job.completed") == 1
    assert stream[-1]["type"] == "job.completed"
    return stream[-1]["data"]


def _golden(agent: Agent, stream: list[dict[str, Any]]) -> None:
    got = {
        t: [shape(d) for d in of_type(stream, t)] for t in ("agent.initialized", "session.started")
    }
    path = GOLDEN / f"{agent.pack}.shape.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text()), f"{path.name}: the agent's wire shape changed"


@pytest.mark.parametrize("agent", AGENTS, ids=IDS)
def test_initialize_then_auth_required_without_credentials(
    agent: Agent, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    result = run_job(write_job(tmp_path, agent, with_key=False), worker_env)
    assert result.returncode == 1, result.stderr
    stream = events(result.stdout)
    done = _check_stream(stream)

    [init] = of_type(stream, "agent.initialized")
    assert init["protocol_version"] == 1
    assert done["timings_ms"]["initialize"] < 15_000
    assert (
        init["agent_info"]["version"]
        == json.loads((REPO / "provider_packs" / agent.pack / "pack.json").read_text())["version"]
    )
    assert isinstance(init["auth_methods"], list)
    assert init["agent_capabilities"]
    _golden(agent, stream)

    assert done["status"] == "failed"
    error = done["error"]
    assert error["code"] == "auth_required"
    assert error["details"]["method"] == agent.auth_at
    assert error["details"]["rpc_code"] == agent.auth_rpc_code
    prefix = (
        "agent requires authentication: "
        if agent.auth_rpc_code == -32000
        else f"agent refused {agent.auth_at}: "
    )
    assert error["message"].startswith(prefix)
    assert len(error["message"]) > len(prefix)  # the agent's own words are kept
    started = of_type(stream, "session.started")
    assert bool(started) == (agent.auth_at == "session/prompt")

    for path in agent.extra_paths:  # extra fields the agent sent are kept, not dropped
        assert dig(init, path) is not None, path
    # Offline without a key none of them sends anything that has no canonical event but
    # the notifications it is known to keep unmapped (codex's `_auth/status_update`,
    # which arrives or not depending on when its account read ends; what each one sends,
    # and that every bit of it becomes an event, is checked on the wire by
    # test_every_notification_on_the_wire_becomes_an_event).
    unmapped = {e["kind"] for e in of_type(stream, "provider.unmapped")}
    assert unmapped <= agent.unmapped, unmapped - agent.unmapped

    assert processes_with(str(tmp_path), PACK_MOUNT) == []


HANGING = [agent for agent in AGENTS if agent.prompt_hangs]


@pytest.mark.parametrize("agent", HANGING, ids=[a.pack for a in HANGING])
def test_cancel_during_a_hanging_prompt(
    agent: Agent, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    grace = float(worker_env["ACPW_CANCEL_GRACE"])
    shutdown = float(worker_env["ACPW_SHUTDOWN_EOF_GRACE"]) + float(
        worker_env["ACPW_SHUTDOWN_TERM_GRACE"]
    )
    job = write_job(tmp_path, agent, with_key=True, timeout_s=120)
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=worker_env,
        cwd=REPO,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # the prompt is sent right after session.started
        lines.append(line)
        if '"type":"session.started"' in line:
            break
    time.sleep(1.5)  # well inside the turn: offline, it can only be retrying the network
    assert proc.poll() is None, "the prompt did not hang"
    cancelled_at = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc, timeout=60)
    elapsed = time.monotonic() - cancelled_at

    assert proc.returncode == 4, err
    stream = events("".join(lines) + out)
    done = _check_stream(stream)
    assert done["status"] == "cancelled"
    if agent.answers_cancel:
        assert done["stop_reason"] == "cancelled"
        assert elapsed < grace + shutdown + 5
    else:  # no answer within the grace period: the worker stopped waiting and killed it
        assert done["stop_reason"] is None
        assert grace <= elapsed < grace + shutdown + 8
    assert FAKE_KEY not in out + err
    assert processes_with(str(tmp_path), PACK_MOUNT) == []


@pytest.mark.parametrize("agent", AGENTS, ids=IDS)
def test_probe_prints_what_the_agent_advertises(
    agent: Agent, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "agents",
            "probe",
            agent.pack,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=worker_env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["protocol_version"] == 1
    assert report["pack"]["name"] == agent.pack
    assert isinstance(report["auth_methods"], list)
    session = report["session"]
    if agent.auth_at != "session/prompt":  # the probe binds no key and never authenticates
        assert not session["opened"]
        assert session["error"]["code"] == "auth_required"
    else:
        assert session["opened"]
        assert session["modes"]["availableModes"]
        assert any(o["category"] == "model" for o in session["configOptions"])
    assert report["shutdown"]["ended_by"] in {"eof", "term", "kill"}
    assert processes_with(str(tmp_path), PACK_MOUNT) == []
    assert BY_PACK[agent.pack] is agent


@pytest.mark.parametrize("agent", AGENTS, ids=IDS)
def test_probe_with_a_bound_key_shows_modes_and_models(
    agent: Agent, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    """``--credential NAME=env:VAR``: bound as a job binds it (and the pack's
    ``authenticate`` called), so the session opens offline; the key is never printed."""
    probe = ["agents", "probe", agent.pack, "--json"]
    bind = ["--credential", f"{agent.credential}=env:CONFORMANCE_KEY"]
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", *probe, *bind],
        capture_output=True,
        text=True,
        timeout=90,
        env={**worker_env, "CONFORMANCE_KEY": FAKE_KEY},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert FAKE_KEY not in result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["credentials"] == [agent.credential]
    if agent.auth_at == "authenticate":
        assert report["authenticate"] == {"method": "api-key", "ok": True}
    session = report["session"]
    assert session["opened"], session
    assert session["modes"]["availableModes"]
    models = (session.get("models") or {}).get("availableModels") or []
    options = [o for o in session.get("configOptions") or [] if o.get("category") == "model"]
    assert models or options
    assert processes_with(str(tmp_path), PACK_MOUNT) == []


# The canonical events of each ACP update kind (docs/contracts.md, "Canonical events v1"); any other
# kind, and any notification other than session/update, is `provider.unmapped`.
CANONICAL: dict[str, frozenset[str]] = {
    "agent_message_chunk": frozenset({"message.delta"}),
    "agent_thought_chunk": frozenset({"message.delta"}),
    "user_message_chunk": frozenset({"message.delta"}),
    "tool_call": frozenset({"tool.started"}),
    "tool_call_update": frozenset({"tool.updated", "tool.completed"}),
    "plan": frozenset({"plan.updated"}),
    "available_commands_update": frozenset({"commands.available"}),
    "current_mode_update": frozenset({"mode.changed"}),
    "config_option_update": frozenset({"config.updated"}),
    "session_info_update": frozenset({"session.titled"}),
    "usage_update": frozenset({"usage.reported"}),
    "subagent_spawned": frozenset({"delegation.started"}),
    "subagent_state_update": frozenset({"delegation.updated", "delegation.completed"}),
}
Event = Mapping[str, Any]


class _CancelAfterStart:
    """An event sink that cancels the job ``delay`` seconds after ``session.started``, and
    not before the agent wrote every notification ``sends`` names (bounded by
    ``patience``): codex-acp pushes ``_auth/status_update`` whenever its account read
    completes (after the initialize reply, again on a session create), which on a cold
    machine can be after the prompt started; cancelling before it raced the check that
    it is sent. Waiting for it keeps that check as strict; an agent that never sends it
    still fails it, after ``patience``."""

    def __init__(
        self,
        cancel: asyncio.Event,
        delay: float,
        *,
        tap: WireTap,
        sends: frozenset[str],
        patience: float = 30.0,
    ) -> None:
        self.cancel, self.delay = cancel, delay
        self.tap, self.sends, self.patience = tap, sends, patience
        self._task: asyncio.Task[None] | None = None

    async def write(self, event: Event, line: str) -> None:
        if event["type"] == "session.started" and self._task is None:
            self._task = asyncio.create_task(self._cancel_when_ready())

    async def _cancel_when_ready(self) -> None:
        await asyncio.sleep(self.delay)
        await self.tap.until(lambda tap: self.sends <= _sent(tap), timeout=self.patience)
        self.cancel.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _sent(tap: WireTap) -> set[str]:
    """The notification kinds on the wire so far (as ``Agent.sends`` names them)."""
    return {_kind(m["method"], m.get("params")) for m in tap.messages() if _is_notification(m)}


def _is_notification(message: Mapping[str, Any]) -> bool:
    return isinstance(message.get("method"), str) and "id" not in message


def _kind(method: str, params: Any) -> str:
    update = params.get("update") if isinstance(params, dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return f"{method}:{kind}" if method == "session/update" else method


def _unmapped_of(kind: str, raw: Any, *, partial: bool = False) -> Callable[[Event], bool]:
    """``provider.unmapped`` of *kind* carrying exactly *raw* (bounded JSON, not cut)."""

    def match(event: Event) -> bool:
        data = event["data"]
        return (
            event["type"] == "provider.unmapped"
            and data["kind"] == kind
            and bool(data.get("partial")) == partial
            and not data["raw"]["truncated"]
            and json.loads(data["raw"]["text"]) == raw
        )

    return match


def _canonical_of(kind: str) -> Callable[[Event], bool]:
    # `usage.reported` with `available: false` is the worker's own (no usage from the agent).
    return lambda e: e["type"] in CANONICAL[kind] and e["data"].get("available") is not False


def _events_of(method: str, params: Any) -> list[Callable[[Event], bool]]:
    """What one notification must have become, in order."""
    update = params.get("update") if isinstance(params, dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    if method != "session/update" or kind not in CANONICAL:
        named = kind if method == "session/update" and isinstance(kind, str) else method
        return [_unmapped_of(named, params)]
    wanted = [_canonical_of(kind)]
    extra = {k: v for k, v in update.items() if k not in KNOWN_FIELDS[kind]}
    if kind == "tool_call_update" and "_meta" in update:  # only its terminal keys are mapped
        unmapped = terminal_meta(update["_meta"]).unmapped
        if unmapped != {}:
            extra["_meta"] = unmapped
    if extra:  # fields no canonical field holds: kept beside it, marked partial
        wanted.append(_unmapped_of(kind, extra, partial=True))
    return wanted


def _explain(wire: list[tuple[str, Any]], stream: list[Event]) -> set[int]:
    """Match every notification, in order, to its events; the stream indices used."""
    used: set[int] = set()
    at = 0
    for method, params in wire:
        for wanted in _events_of(method, params):
            found = next((i for i in range(at, len(stream)) if wanted(stream[i])), None)
            assert found is not None, f"{_kind(method, params)} was dropped: {params!r:.300}"
            used.add(found)
            at = found + 1
    return used


@pytest.mark.parametrize("agent", AGENTS, ids=IDS)
async def test_every_notification_on_the_wire_becomes_an_event(
    agent: Agent, tmp_path: Path, closure_cache: Path
) -> None:
    """The job runs in process on the local backend, its agent's stdout tapped: with a
    (fake) key each agent opens a session and sends what it sends before a prompt, which
    then hangs offline and is cancelled."""
    settings = Settings(
        cache_dir=closure_cache,
        work_dir=tmp_path / "work",
        results_dir=tmp_path / "results",
        session_dir=tmp_path / "sessions",
        secrets_dir=tmp_path / "secrets",
        shutdown_eof_grace=1.0,
        shutdown_term_grace=1.0,
        cancel_grace=1.0,
    )
    spec = parse_job(write_job(tmp_path, agent, with_key=True).read_bytes())
    tap, memory, cancel = WireTap(), MemorySink(), asyncio.Event()
    outcome = await run_in_process(
        spec,
        settings=settings,
        backend=TappedBackend(LocalBackend(LocalConfig.from_settings(settings)), tap),
        sinks=[memory, _CancelAfterStart(cancel, 2.0, tap=tap, sends=agent.sends)],
        environ={},
        base_dir=tmp_path,
        cancel=cancel,
    )
    stream = [dict(e) for e in memory.events]
    assert _check_stream(stream)["status"] == outcome.status == "cancelled"

    wire = [(m["method"], m.get("params")) for m in tap.messages() if _is_notification(m)]
    kinds = {_kind(method, params) for method, params in wire}
    assert agent.sends <= kinds, f"sent: {sorted(kinds)}"
    unknown = {k for k in kinds if k.removeprefix("session/update:") not in CANONICAL}
    assert unknown == agent.unmapped  # empty: this agent sent no unknown kind
    used = _explain(wire, stream)
    unexplained = [
        stream[i]["data"]
        for i in range(len(stream))
        if stream[i]["type"] == "provider.unmapped" and i not in used
    ]
    assert unexplained == []
    assert FAKE_KEY not in json.dumps(stream)
