"""Conformance of real third-party ACP agents, each run from its locked npm pack through
``acp-worker run`` in the local bubblewrap sandbox (no network, empty HOME).

Per agent: initialize answers protocol 1 within 15 s and what it advertises lands in
``agent.initialized`` (shape pinned by a golden capture); without credentials the job
fails ``auth_required`` with the agent's message, wherever the agent refuses; the extra
fields it sends are kept; no process outlives the job. Where an agent's prompt hangs
offline, a cancel settles ``cancelled`` within the grace period, and an agent that does
not answer the cancel is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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
from tests.procs import finish
from worker.events.schema import event_schema

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
    for unmapped in of_type(stream, "provider.unmapped"):
        assert unmapped["kind"]
        assert "raw" in unmapped

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
