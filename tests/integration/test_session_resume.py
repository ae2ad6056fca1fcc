"""``session.resume`` across jobs on the real sandboxes: the worker's session store.

Each job's HOME is a fresh tmpfs; the emulator records its sessions at
``$HOME/.cursor/acp-sessions/<id>/`` (its pack declares ``launch.session_store``), which
is a per-job host directory bound there. Job 1 records a session; the worker keeps it in
``ACPW_SESSION_DIR``; job 2, in a new sandbox, resumes it and gets the history replayed
(marked ``replay``) before its own new output. Local jobs run through ``acp-worker run``
on bubblewrap as uid 61000; one pair runs on the docker backend (Podman).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_docker_jobs import _run as run_docker
from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job, run_cli
from tests.procs import finish
from worker.images.engine import EngineConfig
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.service.reaper import reap_workspaces
from worker.settings import Settings

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

PACK = "cursor-emulator"
SECOND = "#!scenario\nsay Second turn, new output.\n"
UNKNOWN = "0f0f0f0f-0000-4000-8000-000000000000"


def _run(
    tmp_path: Path,
    job_id: str,
    prompt: str,
    *,
    code: int = 0,
    env: dict[str, str] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    job = _job(tmp_path, prompt, job_id=job_id, **spec)
    env = env or _env(tmp_path, ACPW_SESSION_DIR=str(tmp_path / "store"))
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    events = _events(result.stdout)
    _check_stream(events)
    assert result.returncode == code, (result.stderr, events[-1])
    return events


def _session_id(events: list[dict[str, Any]]) -> str:
    [started] = [e["data"] for e in events if e["type"] == "session.started"]
    return str(started["session_id"])


def _text(events: list[dict[str, Any]], *, replay: bool, role: str = "assistant") -> str:
    return "".join(
        e["data"]["text"]
        for e in events
        if e["type"] == "message.delta"
        and e["data"]["role"] == role
        and bool(e["data"].get("replay")) is replay
    )


def _notices(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]


def _check_resumed(events: list[dict[str, Any]], session_id: str, said_before: str) -> None:
    """The history came back marked as replay, before the session started, and the new
    turn's output is only the new turn's."""
    started = next(e for e in events if e["type"] == "session.started")
    assert (started["data"]["session_id"], started["data"]["resumed"]) == (session_id, True)
    replay = [e for e in events if e["data"].get("replay")]
    assert replay
    assert max(e["seq"] for e in replay) < started["seq"]
    assert said_before in _text(events, replay=True)
    fresh = _text(events, replay=False)
    assert fresh == "Second turn, new output."
    assert said_before not in fresh  # the history is not repeated as new output


def test_a_session_recorded_by_one_job_is_resumed_by_the_next(tmp_path: Path) -> None:
    first = _run(tmp_path, "sess-one", "scenario: hello")
    session_id = _session_id(first)
    kept = tmp_path / "store" / PACK / session_id
    assert sorted(os.listdir(kept)) == ["history.json", "meta.json"]
    assert list((tmp_path / "work").iterdir()) == []  # the per-job directory is gone
    said = _text(first, replay=False)
    assert said.startswith("Hello!")

    second = _run(tmp_path, "sess-two", SECOND, session={"resume": session_id})
    _check_resumed(second, session_id, said)
    assert _text(second, replay=True, role="user") == "scenario: hello"
    assert [e["data"]["tool_call_id"] for e in second if e["type"] == "tool.started"] == [
        "replay-0-0"
    ]
    assert len(json.loads((kept / "history.json").read_text())) == 2  # saved back

    third = _run(tmp_path, "sess-three", "#!scenario\nsay Third.\n", session={"resume": session_id})
    assert "Second turn, new output." in _text(third, replay=True)
    assert _text(third, replay=False) == "Third."


def test_a_job_that_timed_out_still_keeps_its_session(tmp_path: Path) -> None:
    limits = {"timeout_s": 1.5, "memory_mb": 512, "pids": 128}
    late = "#!scenario\nsay Part one.\nhang\n"
    first = _run(tmp_path, "sess-late", late, code=5, limits=limits)
    assert first[-1]["data"]["status"] == "timed_out"
    session_id = _session_id(first)
    second = _run(tmp_path, "sess-late-2", SECOND, session={"resume": session_id})
    _check_resumed(second, session_id, "Part one.")


def test_an_unknown_session_is_refused_before_anything_launches(tmp_path: Path) -> None:
    events = _run(tmp_path, "sess-unknown", SECOND, code=1, session={"resume": UNKNOWN})
    error = events[-1]["data"]["error"]
    assert error["code"] == "session_not_found"
    assert error["details"]["reason"] == "not_recorded"
    assert UNKNOWN in error["message"]
    assert str(tmp_path / "store" / PACK) in error["message"]
    types = [e["type"] for e in events]
    assert "pack.ready" not in types
    assert "sandbox.ready" not in types


def test_links_and_special_files_an_agent_plants_are_not_kept(tmp_path: Path) -> None:
    plant = (
        "#!scenario\n"
        "exec d=$HOME/.cursor/acp-sessions/{{sessionId}}; mkdir -p $d/sub $d/../intruder"
        " && cd $d && ln -s /etc/passwd passwd && ln -s / sub/root && mkfifo pipe"
        " && echo x > a && ln a b && echo other > ../intruder/meta.json && echo $((6*7))-planted\n"
        "say Planted.\n"
    )
    first = _run(tmp_path, "sess-plant", plant)
    assert "42-planted" in json.dumps([e for e in first if e["type"].startswith("tool.")])
    session_id = _session_id(first)
    [skipped] = _notices(first, "session_entries_skipped")
    assert sorted((s["path"], s["kind"]) for s in skipped["details"]["entries"]) == [
        ("a", "hardlink"),
        ("b", "hardlink"),
        ("passwd", "symlink"),
        ("pipe", "fifo"),
        ("sub/root", "symlink"),
    ]
    kept = tmp_path / "store" / PACK
    assert os.listdir(kept) == [session_id]  # the other directory it made is not kept
    found = sorted(str(p.relative_to(kept)) for p in kept.rglob("*"))
    assert found == [
        session_id,
        *(f"{session_id}/{n}" for n in ("history.json", "meta.json", "sub")),
    ]
    assert not any(p.is_symlink() for p in kept.rglob("*"))

    second = _run(tmp_path, "sess-plant-2", SECOND, session={"resume": session_id})
    _check_resumed(second, session_id, "Planted.")


def test_a_session_over_the_size_bound_is_not_kept_and_the_job_still_succeeds(
    tmp_path: Path,
) -> None:
    big = (
        "#!scenario\n"
        "exec d=$HOME/.cursor/acp-sessions/{{sessionId}}; mkdir -p $d"
        " && head -c 200000 /dev/zero > $d/blob\n"
        "say Wrote a big blob.\n"
    )
    env = _env(tmp_path, ACPW_SESSION_DIR=str(tmp_path / "store"), ACPW_SESSION_MAX_BYTES="65536")
    first = _run(tmp_path, "sess-big", big, env=env)
    assert first[-1]["data"]["status"] == "succeeded"
    session_id = _session_id(first)
    [notice] = _notices(first, "session_not_saved")
    assert notice["details"] == {"session_id": session_id, "reason": "too_large"}
    assert "65536 bytes" in notice["message"]
    assert not (tmp_path / "store" / PACK / session_id).exists()
    assert list((tmp_path / "work").iterdir()) == []
    refused = _run(tmp_path, "sess-big-2", SECOND, code=1, session={"resume": session_id})
    assert refused[-1]["data"]["error"]["code"] == "session_not_found"


def test_the_reaper_removes_the_state_of_a_worker_that_died(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hang", job_id="sess-dead")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path, ACPW_SESSION_DIR=str(tmp_path / "store")),
        cwd=REPO,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # wait until the turn runs
            if '"session.started"' in line:
                break
        [job_dir] = list((tmp_path / "work").iterdir())
        assert (job_dir / "agent-state").is_dir()
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=30)
        assert asyncio.run(_reap(redis_url, tmp_path / "work")) == [job_dir.name]
        assert list((tmp_path / "work").iterdir()) == []
        assert not (tmp_path / "store").exists() or list((tmp_path / "store").rglob("*")) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        asyncio.run(_destroy_local("sess-dead"))


async def _reap(redis_url: str, work: Path) -> list[str]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return await reap_workspaces(client, work)
    finally:
        await client.aclose()


async def _destroy_local(job_id: str) -> None:
    """The dead worker's sandbox (an unfenced ``run`` job: the reaper leaves it alone)."""
    backend = LocalBackend(LocalConfig.from_settings(Settings()))
    for info in await backend.list({LABEL_JOB: job_id}):
        await backend.destroy(info.sandbox_id)


@pytest.mark.usefixtures("base_image")
async def test_resume_on_the_docker_backend(tmp_path: Path, engine_config: EngineConfig) -> None:
    hello = (
        "#!scenario\n"
        "exec touch $HOME/.cursor/probe && echo $((6*7))-home-writable\n"
        "say Hello from a container.\n"
    )
    outcome, first = await run_docker(tmp_path, engine_config, hello, job_id="dk-sess-one")
    assert outcome.status == "succeeded", first[-1]
    # ~/.cursor above the bound store stays the agent's own to write.
    assert "42-home-writable" in json.dumps([e for e in first if e["type"].startswith("tool.")])
    session_id = _session_id(first)
    kept = tmp_path / "sessions" / PACK / session_id  # the default: next to work_dir
    assert sorted(os.listdir(kept)) == ["history.json", "meta.json"]
    outcome, second = await run_docker(
        tmp_path, engine_config, SECOND, job_id="dk-sess-two", session={"resume": session_id}
    )
    assert outcome.status == "succeeded", second[-1]
    assert second[3]["data"]["backend"] == "docker"
    _check_resumed(second, session_id, "Hello from a container.")
    assert len(json.loads((kept / "history.json").read_text())) == 2
