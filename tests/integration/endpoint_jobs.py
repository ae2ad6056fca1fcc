"""Jobs of the real npm agent packs run through the worker (``run_job``, the local
backend) against our scripted fake model APIs declared as an operator model endpoint
(``Settings(model_endpoints=...)``: private, plain HTTP, the pack's default), so a job
names nothing but its pack. Shared by ``test_model_endpoints`` and ``test_full_turns``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.fake_models import AnthropicFake, FakeModel, GeminiFake, OpenAIResponsesFake
from tests.integration.agent_tools import TOOLS, Tools
from worker.events.sinks import EventSink, MemorySink
from worker.job import run_job
from worker.jobs.spec import JobSpec, parse_job
from worker.sandbox import backend_config, get_backend
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
KEY = "fake-anthropic-key-77e1b0"
Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Agent:
    """One npm agent pack against its fake model API."""

    fake: type[FakeModel]
    credential: str
    tools: Tools
    url_path: str = ""  # what the endpoint URL adds to the fake's root
    #: What a job of this agent must say: codex-acp needs a model it has metadata for, else
    #: it offers no tools (its pack sets its `agent-full-access` mode: codex's own sandbox
    #: needs user namespaces, which ours does not give; ours is the isolation).
    job: dict[str, Any] = field(default_factory=dict)


AGENTS = {
    "claude-agent-acp": Agent(AnthropicFake, "ANTHROPIC_API_KEY", TOOLS["claude-agent-acp"]),
    "codex-acp": Agent(
        OpenAIResponsesFake,
        "OPENAI_API_KEY",
        TOOLS["codex-acp"],
        url_path="/v1",
        job={"model": {"id": "gpt-5.5"}},
    ),
    "gemini-cli": Agent(GeminiFake, "GEMINI_API_KEY", TOOLS["gemini-cli"]),
}


def endpoint_settings(
    tmp_path: Path, fake: FakeModel, cache: Path, pack: str = "claude-agent-acp", **endpoint: Any
) -> Settings:
    """The worker's settings with ``fake`` declared as ``pack``'s default endpoint."""
    declared = {
        "packs": [pack],
        "url": fake.url + AGENTS[pack].url_path,
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
        model_endpoints={f"fake-{fake.api}": declared},
    )


def endpoint_job(
    tmp_path: Path,
    prompt: str,
    pack: str = "claude-agent-acp",
    files: dict[str, str] | None = None,
    **overrides: Any,
) -> JobSpec:
    """A job of ``pack`` on a fresh local workspace holding ``files``, its credential bound
    from a secret file."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (ws / name).write_text(text)
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "key").write_text(KEY + "\n")
    job: dict[str, Any] = {
        "v": 1,
        "job_id": f"ep-{uuid.uuid4().hex[:12]}",
        "pack": {"name": pack},
        "workspace": {"kind": "local", "path": str(ws)},
        "prompt": prompt,
        "credentials": {AGENTS[pack].credential: "file:key"},
        "limits": {"timeout_s": 120, "memory_mb": 2048, "pids": 256},
        "network": {"mode": "none"},
    }
    job.update(overrides)
    return parse_job(job)


def require_pack(pack: str) -> None:
    if not any((REPO / "provider_packs" / pack / "dist").glob("*.tar")):
        pytest.skip(f"pack {pack} is not built (make packs)")


async def run_endpoint_job(
    settings: Settings,
    spec: JobSpec,
    *,
    sinks: Sequence[EventSink] = (),
    cancel: Any = None,
    control: aioredis.Redis | None = None,
) -> tuple[str, list[Event]]:
    """Run ``spec`` on the local backend; its status and every event it emitted."""
    require_pack(spec.pack.name)
    memory = MemorySink()
    outcome = await run_job(
        spec,
        settings=settings,
        backend=get_backend(backend_config(settings, "local")),
        sinks=[memory, *sinks],
        environ={},
        cancel=cancel,
        control=control,
    )
    return outcome.status, [dict(e) for e in memory.events]


def said(events: list[Event]) -> str:
    """The assistant's text, joined."""
    return "".join(
        e["data"].get("text", "")
        for e in events
        if e["type"] == "message.delta" and e["data"].get("role") == "assistant"
    )


def notices(events: list[Event], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]
