"""Operator-declared model endpoints, through the worker (issue 14, item 1).

The real claude-agent-acp pack runs in real bubblewrap with no route out; its model API is
our scripted fake Anthropic server (``tests/fake_models``: a real HTTP server on this
host's 127.0.0.1, standing in for a gateway or a self-hosted model, which cannot run
here). The operator declares it as a plain-HTTP, private endpoint; the job names nothing
but its pack, and its network policy is ``none``: the agent reaches the fake only through
the job's proxy, by the tunnel the sandbox's forwarder opens. (Full turns of every agent
through its endpoint: ``test_full_turns.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fake_models import AnthropicFake, FakeModel, say
from tests.integration.endpoint_jobs import (
    KEY,
    endpoint_job,
    endpoint_settings,
    notices,
    run_endpoint_job,
    said,
)
from worker.jobs.spec import JobSpec
from worker.settings import Settings

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(240)]

SECRET = "the secret word is quince"


@pytest.fixture(scope="module")
def pack_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pack cache for the module: each closure is materialized once."""
    return tmp_path_factory.mktemp("pack-cache")


def _settings(
    tmp_path: Path, fake: FakeModel, cache: Path, pack: str = "claude-agent-acp", **endpoint: Any
) -> Settings:
    return endpoint_settings(tmp_path, fake, cache, pack, **endpoint)


def _job(tmp_path: Path, prompt: str, pack: str = "claude-agent-acp", **overrides: Any) -> JobSpec:
    return endpoint_job(tmp_path, prompt, pack, {"notes.txt": SECRET + "\n"}, **overrides)


async def _run(settings: Settings, spec: JobSpec) -> tuple[str, list[dict[str, Any]]]:
    return await run_endpoint_job(settings, spec)


_text = said
_notices = notices


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
            "timeout_s": 12, "memory_mb": 2048, "pids": 256}))  # fmt: skip
        assert fake.main_requests == []
    denied = _notices(events, "network_denied")
    assert denied, json.dumps(events[-3:], indent=1)
    assert denied[0]["details"]["reason"] == "private_address"
    assert status != "succeeded"
