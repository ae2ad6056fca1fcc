"""Multi-turn across jobs for the npm agents, through the worker (issue 14, item 3).

The real claude-agent-acp and codex-acp packs run in real bubblewrap against our scripted
fake model APIs, declared as the operator's default model endpoint (as in
``test_model_endpoints.py``). Job 1 opens a session and tells the model something; job 2,
a new job in a new sandbox with a fresh HOME, resumes it (``session.resume`` with the id
from job 1's ``session.started``): the worker restored exactly the files the pack
declares (``launch.sessions``), the agent loaded them, and the fake sees the first turn in
the second job's request. A resume the store cannot serve, or for a pack that keeps no
sessions, is refused before anything launches.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fake_models import say
from tests.integration.endpoint_jobs import (
    AGENTS,
    endpoint_job,
    endpoint_settings,
    run_endpoint_job,
    said,
)

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]

#: Where each pack's recording holds the session (its ``launch.sessions``, as recorded
#: from the sandbox's cwd /workspace).
RECORDED = {
    "claude-agent-acp": r"-workspace/{id}\.jsonl",
    "codex-acp": r"\d{{4}}/\d\d/\d\d/rollout-[0-9T-]+-{id}\.jsonl",
}
UNKNOWN = "0badc0de-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def pack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pack cache for the module: claude's closure is materialized once."""
    return tmp_path_factory.mktemp("pack-cache")


def _started(events: list[dict[str, Any]]) -> dict[str, Any]:
    [started] = [e["data"] for e in events if e["type"] == "session.started"]
    return started


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def _job_run(
    tmp_path: Path, fake: Any, cache: Path, job_id: str, prompt: str, pack: str, **spec: Any
) -> tuple[str, list[dict[str, Any]]]:
    settings = endpoint_settings(tmp_path, fake, cache, pack)
    job = endpoint_job(tmp_path, prompt, pack, job_id=job_id, **AGENTS[pack].job, **spec)
    return await run_endpoint_job(settings, job)


@pytest.mark.parametrize("pack", sorted(RECORDED))
async def test_a_second_job_resumes_the_first_jobs_session(
    pack: str, tmp_path: Path, pack_cache: Path
) -> None:
    fake_model = AGENTS[pack].fake
    with fake_model([say("Noted: the code word is tangerine.")]) as fake:
        status, first = await _job_run(
            tmp_path, fake, pack_cache, "mt-one", "Remember the code word tangerine.", pack
        )
    assert status == "succeeded", json.dumps(first[-3:], indent=1)
    started = _started(first)
    session_id = started["session_id"]
    assert started["resumed"] is False
    kept = tmp_path / "sessions" / pack / session_id
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert len(files) == 1, files  # exactly the declared files
    assert re.fullmatch(RECORDED[pack].format(id=re.escape(session_id)), files[0]), files
    assert list((tmp_path / "work").iterdir()) == []  # the per-job directory is gone

    with fake_model([say("The code word was tangerine.")]) as fake:
        status, second = await _job_run(
            tmp_path,
            fake,
            pack_cache,
            "mt-two",
            "What was the code word?",
            pack,
            session={"resume": session_id},
        )
        requests = fake.main_requests
    assert status == "succeeded", json.dumps(second[-3:], indent=1)
    assert (_started(second)["session_id"], _started(second)["resumed"]) == (session_id, True)
    # The agent resumed on the job's model (codex-acp: its config.toml names it), not on
    # its default before the worker selected the job's: codex warns of that switch.
    switched = [e for e in second if "resuming with" in json.dumps(e)]
    assert switched == [], json.dumps(switched, indent=1)
    [request] = requests
    for earlier in ("Remember the code word tangerine.", "Noted: the code word is tangerine."):
        assert earlier in request.text, f"{earlier!r} not in the resumed job's request"
    assert "What was the code word?" in request.text
    types = _types(second)
    replayed = [i for i, e in enumerate(second) if e["data"].get("replay")]
    assert replayed, "the history was not replayed"
    assert max(replayed) < types.index("session.started")
    assert "The code word was tangerine." in said(
        [e for e in second if not e["data"].get("replay")]
    )
    saved_back = (kept / files[0]).read_text()
    assert "What was the code word?" in saved_back  # the second turn was saved too


async def test_an_unknown_session_is_refused_before_anything_launches(
    tmp_path: Path, pack_cache: Path
) -> None:
    with AGENTS["claude-agent-acp"].fake([say("never")]) as fake:
        status, events = await _job_run(
            tmp_path,
            fake,
            pack_cache,
            "mt-unknown",
            "Hello?",
            "claude-agent-acp",
            session={"resume": UNKNOWN},
        )
        assert fake.requests == []
    assert status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "session_not_found"
    assert error["details"]["reason"] == "not_recorded"
    assert UNKNOWN in error["message"]
    assert "pack.ready" not in _types(events)
    assert "sandbox.ready" not in _types(events)


async def test_a_pack_that_keeps_no_sessions_refuses_a_resume_before_launch(
    tmp_path: Path, pack_cache: Path
) -> None:
    """gemini-cli declares no ``launch.sessions``: its resume cannot be served."""
    with AGENTS["gemini-cli"].fake([say("never")]) as fake:
        status, events = await _job_run(
            tmp_path,
            fake,
            pack_cache,
            "mt-gemini",
            "Hello?",
            "gemini-cli",
            session={"resume": UNKNOWN},
        )
        assert fake.requests == []
    assert status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "session_not_found"
    assert error["details"]["reason"] == "not_kept"
    assert "keeps no sessions" in error["message"]
    assert "pack.ready" not in _types(events)
    assert "sandbox.ready" not in _types(events)
