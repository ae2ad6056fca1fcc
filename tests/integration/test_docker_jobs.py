"""Whole jobs on the docker backend: the real emulator pack in its pack image.

``run_job`` in-process with a ``DockerBackend`` (the same core ``acp-worker run
--backend docker`` calls): hello end to end, timeout, cancel, kill-the-worker-then-reap,
and a tampered pack image refused with ``image_mismatch`` before anything starts.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.hungry_pack import hungry_packs
from tests.integration.docker_engine import REPO, base_image, docker_host, engine_config
from worker.events.sinks import MemorySink
from worker.images.build import PackImages
from worker.images.engine import EngineConfig, connect
from worker.images.identity import ImageIdentity
from worker.job import JobOutcome, run_job
from worker.jobs.spec import parse_job
from worker.packs.manifest import load_pack
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.config import DockerConfig
from worker.sandbox.docker import DockerBackend
from worker.service.reaper import reap_workspaces
from worker.settings import Settings
from worker.workspace.disk import mounts_below

__all__ = ["base_image", "docker_host", "engine_config"]

SECRET = "emulator-docker-secret-41c7"


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(
        **overrides,
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        worker_id="w-docker",
        shutdown_eof_grace=1.0,
        cancel_grace=3.0,
    )


def _job(tmp_path: Path, prompt: str, **overrides: Any) -> Any:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    job: dict[str, Any] = {
        "v": 1,
        "job_id": f"dk-{tmp_path.name[-16:]}".replace("_", "-"),
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
        "prompt": prompt,
        "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 30, "memory_mb": 512, "pids": 128},
    }
    job.update(overrides)
    return parse_job(job)


async def _run(
    tmp_path: Path,
    config: EngineConfig,
    prompt: str,
    cancel: asyncio.Event | None = None,
    packs_dir: Path = REPO / "provider_packs",
    **kw: Any,
) -> tuple[JobOutcome, list[dict[str, Any]]]:
    settings = _settings(tmp_path, packs_dir=packs_dir)
    sink = MemorySink()
    outcome = await run_job(
        _job(tmp_path, prompt, **kw),
        settings=settings,
        backend=DockerBackend(DockerConfig.from_settings(settings), engine_config=config),
        sinks=[sink],
        environ={},
        cancel=cancel,
    )
    return outcome, [dict(e) for e in sink.events]


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


@pytest.mark.usefixtures("base_image")
async def test_hello_end_to_end(tmp_path: Path, engine_config: EngineConfig) -> None:
    outcome, events = await _run(tmp_path, engine_config, "scenario: hello")
    assert outcome.status == "succeeded", events[-1]
    types = _types(events)
    assert types[:4] == ["job.accepted", "job.started", "pack.ready", "sandbox.ready"]
    assert events[3]["data"]["backend"] == "docker"
    assert "tool.completed" in types
    text = "".join(e["data"].get("text", "") for e in events if e["type"] == "message.delta")
    assert "Hello" in text
    assert events[-1]["data"]["status"] == "succeeded"
    assert SECRET not in str(events)
    assert (
        await DockerBackend(
            DockerConfig.from_settings(_settings(tmp_path)), engine_config=engine_config
        ).list({LABEL_JOB: events[0]["job_id"]})
        == []
    )


@pytest.mark.usefixtures("base_image")
async def test_timeout_settles_timed_out(tmp_path: Path, engine_config: EngineConfig) -> None:
    # Long enough for the container to start on a loaded machine (~1.6 s seen), so that
    # the timeout lands mid-turn, which is what this checks.
    limits = {"timeout_s": 8, "memory_mb": 512, "pids": 128}
    outcome, events = await _run(tmp_path, engine_config, "scenario: hang", limits=limits)
    assert outcome.status == "timed_out"
    assert events[-1]["data"]["stop_reason"] == "cancelled"


@pytest.mark.usefixtures("base_image")
async def test_cancel_settles_cancelled(tmp_path: Path, engine_config: EngineConfig) -> None:
    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(3.0, cancel.set)
    outcome, events = await _run(tmp_path, engine_config, "scenario: hang", cancel=cancel)
    assert outcome.status == "cancelled"
    assert events[-1]["type"] == "job.completed"


@pytest.mark.usefixtures("base_image")
async def test_agent_crash_carries_its_exit_status(
    tmp_path: Path, engine_config: EngineConfig
) -> None:
    outcome, events = await _run(tmp_path, engine_config, "scenario: crash")
    assert outcome.status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "agent_exited"
    assert error["details"]["exit_code"] == 3  # the scenario's `crash 3`
    assert "signal" not in error["details"]


@pytest.mark.usefixtures("base_image")
async def test_agent_killed_for_memory_fails_oom_killed(
    tmp_path: Path, engine_config: EngineConfig
) -> None:
    limits = {"timeout_s": 30, "memory_mb": 64, "pids": 128}
    packs = hungry_packs(tmp_path)
    outcome, events = await _run(
        tmp_path, engine_config, "scenario: hello", packs_dir=packs, limits=limits
    )
    assert outcome.status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "oom_killed"
    assert "limits.memory_mb = 64" in error["message"]
    assert error["details"]["signal"] == "SIGKILL"
    assert error["details"]["memory_mb"] == 64
    [notice] = [e["data"] for e in events if e["type"] == "notice"]
    assert notice["code"] == "oom_killed"
    assert notice["details"] == {"limit": "limits.memory_mb", "memory_mb": 64}


_WORKER = """
import asyncio, sys
from pathlib import Path
from worker.images.engine import EngineConfig
from worker.jobs.spec import parse_job
from worker.job import run_job
from worker.sandbox.docker import DockerBackend
from worker.settings import Settings
from worker.events.sinks import JsonlSink
from worker.sandbox.config import DockerConfig

async def main():
    tmp = Path(sys.argv[1])
    config = EngineConfig(docker_host=sys.argv[2], images_dir=Path(sys.argv[3]))
    settings = Settings(cache_dir=tmp / "cache", work_dir=tmp / "work",
                        secrets_dir=tmp / "secrets", worker_id="w-doomed")
    spec = parse_job(Path(sys.argv[4]).read_text())
    backend = DockerBackend(DockerConfig.from_settings(settings), engine_config=config)
    await run_job(spec, settings=settings, backend=backend,
                  sinks=[JsonlSink(sys.stdout)], environ={})
asyncio.run(main())
"""


@pytest.mark.usefixtures("base_image")
async def test_kill_the_worker_then_reap(
    tmp_path: Path, engine_config: EngineConfig, redis_url: str
) -> None:
    spec = _job(tmp_path, "scenario: hang", job_id=f"reap-{uuid.uuid4().hex[:12]}")
    (tmp_path / "job.json").write_text(spec.model_dump_json(exclude_none=True))
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(tmp_path), str(engine_config.docker_host),
         str(engine_config.images_dir), str(tmp_path / "job.json")],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert worker.stdout is not None
    for line in worker.stdout:  # the turn is running inside the container
        if '"message.delta"' in line or '"tool.started"' in line:
            break
    worker.kill()
    worker.wait(10)
    worker.stdout.close()
    reaper = DockerBackend(
        DockerConfig.from_settings(_settings(tmp_path)), engine_config=engine_config
    )
    orphans = await reaper.list({LABEL_JOB: spec.job_id, "acpw.worker": "w-doomed"})
    assert len(orphans) == 1
    # Still there (the agent may have exited on stdin EOF, the container remains).
    assert await reaper.status(orphans[0].sandbox_id) is not None
    await reaper.destroy(orphans[0].sandbox_id)
    assert await reaper.list({LABEL_JOB: spec.job_id}) == []
    # The dead worker's work dir, its workspace disk still mounted: unmounted and removed.
    [job_dir] = list((tmp_path / "work").iterdir())
    assert mounts_below(job_dir) == [job_dir / "disk"]
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await reap_workspaces(client, tmp_path / "work") == [job_dir.name]
    finally:
        await client.aclose()
    assert mounts_below(tmp_path) == []
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.usefixtures("base_image")
async def test_tampered_pack_image_is_refused(tmp_path: Path, engine_config: EngineConfig) -> None:
    # Fresh pins: only what the engine holds can betray the tampering.
    config = EngineConfig(docker_host=engine_config.docker_host, images_dir=tmp_path / "images")
    images = PackImages(connect(config), config)
    pack = load_pack(Settings().packs_dir, "cursor-emulator")
    identity = ImageIdentity(images.base_id(), pack.for_platform().pin.closure.digest)
    honest = images.resolve(identity) or _build_emulator(tmp_path, images, identity)
    evil = _derive(images, honest.image_id, identity.tag)
    try:
        outcome, events = await _run(tmp_path, config, "scenario: hello")
    finally:
        images.client.api.tag(honest.image_id, *identity.tag.rsplit(":", 1))
        images.client.api.remove_image(evil, force=True)
    assert outcome.exit_code == 3
    assert events[-1]["data"]["error"]["code"] == "image_mismatch"
    assert "sandbox.ready" not in _types(events)


def _build_emulator(tmp_path: Path, images: PackImages, identity: ImageIdentity) -> Any:
    from worker.packs.runtime import prepare_pack

    settings = _settings(tmp_path)
    prepared = prepare_pack(settings, load_pack(settings.packs_dir, "cursor-emulator"))
    return images.build(prepared.closure, identity)


def _derive(images: PackImages, image_id: str, tag: str) -> str:
    """An image FROM the honest one (same inherited labels) with one extra file."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Containerfile", f"FROM {image_id}\nCOPY evil /opt/evil\n"),
                           ("evil", "x")):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data.encode()))
    context.seek(0)
    result = images.client.api.build(
        fileobj=context, custom_context=True, dockerfile="Containerfile", tag=tag, decode=True,
        rm=True, forcerm=True,  # no build container left in the engine's store
    )  # fmt: skip
    ids = [c["aux"]["ID"] for c in result if "aux" in c]
    return str(ids[-1])
