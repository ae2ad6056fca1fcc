"""Operator-declared model endpoints, through the worker (issue 14, item 1).

The real claude-agent-acp pack runs in real bubblewrap with no route out; its model API is
our scripted fake Anthropic server (``tests/fake_models``: a real HTTP server on this
host's 127.0.0.1, standing in for a gateway or a self-hosted model, which cannot run
here). The operator declares it as a plain-HTTP, private endpoint; the job names nothing
but its pack, and its network policy is ``none``: the agent reaches the fake only through
the job's proxy, by the tunnel the sandbox's forwarder opens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fake_models import AnthropicFake, FakeModel, call, say
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox import backend_config, get_backend
from worker.settings import Settings

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
KEY = "fake-anthropic-key-77e1b0"
SECRET = "the secret word is quince"


@pytest.fixture(scope="module")
def pack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pack cache for the module: claude's closure is materialized once."""
    return tmp_path_factory.mktemp("pack-cache")


def _settings(tmp_path: Path, fake: FakeModel, cache: Path, **endpoint: Any) -> Settings:
    declared = {
        "packs": ["claude-agent-acp"],
        "url": fake.url,
        "plain_http": True,
        "private": True,
        "default": True,
        **endpoint,
    }
    return Settings(
        cache_dir=cache,
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        results_dir=tmp_path / "results",
        worker_id="w-endpoints",
        model_endpoints={"fake-anthropic": declared},
    )


def _job(tmp_path: Path, prompt: str, **overrides: Any) -> Any:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "notes.txt").write_text(SECRET + "\n")
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "anthropic").write_text(KEY + "\n")
    job: dict[str, Any] = {
        "v": 1,
        "job_id": f"ep-{tmp_path.name[-16:]}".replace("_", "-"),
        "pack": {"name": "claude-agent-acp"},
        "workspace": {"kind": "local", "path": str(ws)},
        "prompt": prompt,
        "credentials": {"ANTHROPIC_API_KEY": "file:anthropic"},
        "limits": {"timeout_s": 120, "memory_mb": 2048, "pids": 256},
        "network": {"mode": "none"},
    }
    job.update(overrides)
    return parse_job(job)


async def _run(settings: Settings, spec: Any) -> tuple[str, list[dict[str, Any]]]:
    if not any((REPO / "provider_packs" / "claude-agent-acp" / "dist").glob("*.tar")):
        pytest.skip("pack claude-agent-acp is not built (make packs)")
    sink = MemorySink()
    outcome = await run_job(
        spec,
        settings=settings,
        backend=get_backend(backend_config(settings, "local")),
        sinks=[sink],
        environ={},
    )
    return outcome.status, [dict(e) for e in sink.events]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"].get("text", "") for e in events if e["type"] == "message.delta")


def _notices(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]


async def test_a_default_endpoint_serves_a_turn_through_the_jobs_proxy(
    tmp_path: Path, pack_cache: Path
) -> None:
    with AnthropicFake([say("hello from the operator's model")]) as fake:
        status, events = await _run(
            _settings(tmp_path, fake, pack_cache), _job(tmp_path, "Say hello.")
        )
        requests = fake.main_requests
    assert status == "succeeded", json.dumps(events[-3:], indent=1)
    assert "hello from the operator's model" in _text(events)
    [endpoint] = _notices(events, "model_endpoint")
    assert endpoint["details"]["name"] == "fake-anthropic"
    assert endpoint["details"]["source"] == "default"
    assert endpoint["details"]["url"].startswith("http://127.0.0.1:3129")  # the tunnel
    assert requests, "the fake saw no model request"
    assert requests[0].headers.get("x-api-key") == KEY  # the bound credential, as bound
    assert KEY not in json.dumps(events)  # and never in an event


async def test_the_agent_reads_a_file_and_the_model_sees_it(
    tmp_path: Path, pack_cache: Path
) -> None:
    script = [call("Read", file_path="/workspace/notes.txt"), say("done reading")]
    with AnthropicFake(script) as fake:
        status, events = await _run(
            _settings(tmp_path, fake, pack_cache), _job(tmp_path, "Read notes.txt.")
        )
        requests = fake.main_requests
    assert status == "succeeded", json.dumps(events[-3:], indent=1)
    assert any(e["type"] == "tool.started" for e in events)
    assert SECRET in requests[-1].text  # the tool result went back to the model
    assert "done reading" in _text(events)


async def test_an_undeclared_endpoint_is_refused_before_anything_runs(
    tmp_path: Path, pack_cache: Path
) -> None:
    with AnthropicFake([say("never")]) as fake:
        spec = _job(tmp_path, "Say hello.", model_endpoint="somewhere-else")
        status, events = await _run(_settings(tmp_path, fake, pack_cache), spec)
        assert fake.requests == []
    assert status == "failed"
    completed = events[-1]["data"]
    assert completed["error"]["code"] == "endpoint_refused"
    assert "fake-anthropic" in completed["error"]["message"]  # what it may use
    assert not any(e["type"] == "sandbox.ready" for e in events)


async def test_a_private_endpoint_not_declared_private_is_denied_with_a_notice(
    tmp_path: Path, pack_cache: Path
) -> None:
    """``localhost`` (a name, not an IP literal) resolves to loopback: without
    ``private`` the proxy refuses it, and the job says so."""
    with AnthropicFake([say("never")]) as fake:
        url = fake.url.replace("127.0.0.1", "localhost")
        settings = _settings(tmp_path, fake, pack_cache, url=url, private=False)
        status, events = await _run(settings, _job(tmp_path, "Say hello.", limits={
            "timeout_s": 40, "memory_mb": 2048, "pids": 256}))  # fmt: skip
        assert fake.main_requests == []
    denied = _notices(events, "network_denied")
    assert denied, json.dumps(events[-3:], indent=1)
    assert denied[0]["details"]["reason"] == "private_address"
    assert status != "succeeded"
