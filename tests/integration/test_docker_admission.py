"""Admission in the docker sandbox's own mount view, right before launch, on real Podman.

``admission_view`` starts the container the agent will run in (its launcher waits for the
launch header) and checks ``/workspace`` through ``/proc/<init pid>/root``: the binds and
masks as that container sees them. What appears after the source tree was admitted and
the masks cannot cover is refused; what a mask covers is not a finding.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import REPO, base_image, docker_host, engine_config
from tests.sandbox_owner import chown_to_sandbox
from worker.errors import AdmissionRefused, SandboxError
from worker.events.sinks import MemorySink
from worker.images.engine import EngineConfig
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import LABEL_JOB, ResourceLimits, SandboxSpec
from worker.sandbox.config import DockerConfig, LocalConfig
from worker.sandbox.docker import LABEL_SANDBOX, DockerBackend, DockerSandbox
from worker.sandbox.view import container_admission
from worker.settings import Settings

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _spec(tmp_path: Path, **overrides: Any) -> SandboxSpec:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "README.md").write_text("# view\n")
    chown_to_sandbox(ws, LocalConfig())
    (tmp_path / "pack").mkdir(exist_ok=True)
    fields: dict[str, Any] = {
        "job_id": "view",
        "attempt": 1,
        "workspace": ws,
        "pack_closure": tmp_path / "pack",
        "limits": ResourceLimits(memory_bytes=200 << 20, cpus=0.5, pids=50),
        "labels": {"suite": "docker-admission"},
    }
    return SandboxSpec(**{**fields, **overrides})


@pytest.fixture
def backend(engine_config: EngineConfig, base_image: str) -> DockerBackend:
    return DockerBackend(DockerConfig(worker_id="w-view"), engine_config=engine_config)


@pytest.fixture
async def box(backend: DockerBackend, tmp_path: Path) -> AsyncIterator[DockerSandbox]:
    sandbox = await backend.create(_spec(tmp_path))
    try:
        yield sandbox
    finally:
        await backend.destroy(sandbox.sandbox_id)


def _containers(backend: DockerBackend, sandbox_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = backend.client.api.containers(
        all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
    )
    return found


async def _run(box: DockerSandbox, argv: list[str]) -> tuple[int, str]:
    proc = await box.spawn(argv, env=ENV)
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), timeout=30)
    return await proc.wait(), out.decode()


async def test_a_clean_view_passes_and_the_launch_uses_that_container(
    backend: DockerBackend, box: DockerSandbox
) -> None:
    view = await asyncio.to_thread(box.admission_view)
    assert view.admitted, view.findings
    assert view.workspace == Path("/workspace")
    assert view.git_root is None
    [checked] = _containers(backend, box.sandbox_id)
    assert checked["State"] == "running"  # started, its launcher waiting for the header
    code, out = await _run(box, ["/bin/cat", "/workspace/README.md"])
    assert (code, out) == (0, "# view\n")
    assert [c["Id"] for c in _containers(backend, box.sandbox_id)] == [checked["Id"]]


async def test_masked_paths_with_content_are_not_findings(
    box: DockerSandbox, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / ".cursor" / "hooks.json").write_text('{"hooks": {"stop": [{"command": "x"}]}}')
    (ws / ".mcp.json").write_text('{"mcpServers": {"x": {"command": "/bin/sh"}}}')
    (ws / ".claude" / "settings.json").write_text('{"hooks": {"Stop": []}}')
    (ws / ".cursor" / "plugins" / "p").mkdir()
    view = await asyncio.to_thread(box.admission_view)
    assert view.admitted, view.findings  # inside, each of them shows its mask
    script = "test -c /workspace/.mcp.json && ls -A /workspace/.cursor/plugins | wc -l"
    assert await _run(box, ["/bin/sh", "-c", script]) == (0, "0\n")


async def test_a_mount_point_swapped_for_a_symlink_after_create_is_refused(
    backend: DockerBackend, box: DockerSandbox, tmp_path: Path
) -> None:
    hooks = tmp_path / "ws" / ".cursor" / "hooks.json"
    hooks.unlink()
    hooks.symlink_to("/etc/passwd")  # after the source was admitted and the masks planned
    # The engine resolves the link inside the container and masks the image's /etc/passwd
    # instead: the agent would see a link where its mask should be.
    view = await asyncio.to_thread(box.admission_view)
    assert [(f.path, f.rule) for f in view.findings] == [(".cursor/hooks.json", "config.symlink")]
    with pytest.raises(AdmissionRefused):
        view.raise_if_refused()


async def test_config_appearing_unmasked_after_create_is_refused(
    backend: DockerBackend, tmp_path: Path
) -> None:
    sandbox = await backend.create(_spec(tmp_path, mask_config=False))
    try:
        assert (await asyncio.to_thread(sandbox.admission_view)).admitted
        (tmp_path / "ws" / ".mcp.json").write_text("{}")  # appears before launch
        (tmp_path / "ws" / ".cursor").mkdir()
        (tmp_path / "ws" / ".cursor" / "hooks.json").write_text("{}")
        view = await asyncio.to_thread(sandbox.admission_view)  # same container, checked again
        assert {(f.path, f.rule) for f in view.findings} == {
            (".mcp.json", "mcp.project"),
            (".cursor/hooks.json", "cursor.hooks"),
        }
        assert len(_containers(backend, sandbox.sandbox_id)) == 1
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert _containers(backend, sandbox.sandbox_id) == []


async def test_config_above_the_workspace_is_not_in_the_view(
    backend: DockerBackend, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".mcp.json").write_text("{}")  # above the workspace on the host only
    sandbox = await backend.create(_spec(repo))
    try:
        view = await asyncio.to_thread(sandbox.admission_view)
        assert view.admitted, view.findings
        assert view.git_root is None
    finally:
        await backend.destroy(sandbox.sandbox_id)


def test_a_process_that_is_not_the_container_is_refused(tmp_path: Path) -> None:
    # What a remote engine's pid would be here: some unrelated local process.
    (tmp_path / "ws").mkdir()
    for pid in (os.getpid(), 0):
        with pytest.raises(SandboxError):
            container_admission(pid, host_workspace=tmp_path / "ws", masks=(), provider="cursor")


# --- through the runner -----------------------------------------------------------------


class _Planting(DockerBackend):
    """Swaps a mask mount point for a symlink once the sandbox exists: after the source
    tree's admission, before launch."""

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        sandbox = await super().create(spec)
        hooks = spec.workspace / ".cursor" / "hooks.json"
        hooks.unlink()
        hooks.symlink_to("/etc/passwd")
        return sandbox


async def test_the_runner_refuses_what_appeared_before_launch(
    tmp_path: Path, engine_config: EngineConfig, base_image: str
) -> None:
    settings = Settings(
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        worker_id="w-view",
        packs_dir=REPO / "provider_packs",
    )
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "README.md").write_text("# hi\n")
    job = parse_job(
        {
            "v": 1,
            "job_id": "view-runner",
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
            "prompt": "scenario: hello",
            "limits": {"timeout_s": 30, "memory_mb": 512, "pids": 128, "disk_mb": 64},
        }
    )
    sink = MemorySink()
    backend = _Planting(DockerConfig.from_settings(settings), engine_config=engine_config)
    outcome = await run_job(job, settings=settings, backend=backend, sinks=[sink], environ={})
    events = [dict(e) for e in sink.events]
    types = [e["type"] for e in events]
    assert outcome.status == "failed", events[-1]
    assert outcome.exit_code == 3
    error = events[-1]["data"]["error"]
    assert error["code"] == "admission_refused", error
    assert [(f["path"], f["rule"]) for f in error["details"]["findings"]] == [
        (".cursor/hooks.json", "config.symlink")
    ]
    assert "sandbox.ready" in types
    assert "agent.initialized" not in types  # nothing of the agent ran
    assert await backend.list({LABEL_JOB: "view-runner"}) == []
