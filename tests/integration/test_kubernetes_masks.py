"""Config masks in the sandbox pod and admission in its own view, against the API double
(pods on Podman; see test_kubernetes_backend.py for why no real cluster is needed here,
and ``make test-k8s`` for a real one)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import (
    ENV,
    _backend,
    _on_base,
    _spec,
    assert_within_rbac,
)
from tests.k8s_double.fixtures import (
    REPOSITORY,
    Cluster,
    base_by_digest,
    by_digest,
    cluster,
    images,
    real_cluster,
)
from worker.images.engine import EngineConfig
from worker.sandbox.kubernetes.backend import KubernetesBackend, KubernetesSandbox

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = pytest.mark.integration

SETTINGS = json.dumps({"permissions": {"allow": ["Read"]}}) + "\n"


async def _sh(sandbox: KubernetesSandbox, script: str) -> tuple[int, bytes, bytes]:
    proc = await sandbox.spawn(["/bin/sh", "-c", script], env=ENV)
    proc.stdin.close()
    code = await asyncio.wait_for(proc.wait(), 30)
    return code, await proc.stdout.read(), await proc.stderr.read()


def _masked_backend(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base: str
) -> KubernetesBackend:
    return _on_base(_backend(tmp_path, cluster, images), base)


async def test_config_is_masked_in_the_pod_for_the_whole_run(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    backend = _masked_backend(tmp_path, cluster, images, base_by_digest)
    spec = _spec(tmp_path)
    (spec.workspace / ".claude").mkdir()
    (spec.workspace / ".claude" / "settings.json").write_text(SETTINGS)
    (spec.workspace / ".cursor" / "rules").mkdir(parents=True)
    (spec.workspace / ".cursor" / "rules" / "style.md").write_text("be brief\n")
    sandbox = await backend.create(spec)
    try:
        view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
        assert view.admitted, view.to_dict()
        # The admitted settings are hidden: not readable, and nothing can replace them.
        code, out, _ = await _sh(sandbox, "cat .claude/settings.json")
        assert code != 0
        assert out == b""
        code, _, _ = await _sh(sandbox, "echo '{}' > .cursor/hooks.json")
        assert code != 0
        code, _, _ = await _sh(sandbox, "mkdir -p .codex && echo x > .codex/config.toml")
        assert code != 0
        # An anchor cannot be moved aside to build an unmasked twin.
        code, _, _ = await _sh(sandbox, "mv .cursor .cursor-old")
        assert code != 0
        # What the masks do not cover stays usable.
        code, out, _ = await _sh(
            sandbox, "cat .cursor/rules/style.md; echo new > .cursor/rules/x.md"
        )
        assert (code, out) == (0, b"be brief\n")
        code, out, _ = await _sh(sandbox, "ls -A .cursor")
        assert code == 0
    finally:
        await backend.destroy(sandbox.sandbox_id)
    ws = spec.workspace
    assert (ws / ".claude" / "settings.json").read_text() == SETTINGS
    assert (ws / ".cursor" / "rules" / "x.md").read_text() == "new\n"
    assert not (ws / ".cursor" / "hooks.json").exists()
    # No mask point came back to the host, nor an anchor it did not have.
    assert sorted(p.name for p in ws.iterdir()) == [".claude", ".cursor", "README.md"]
    assert sorted(p.name for p in (ws / ".cursor").iterdir()) == ["rules"]
    assert sorted(p.name for p in (ws / ".claude").iterdir()) == ["settings.json"]


async def test_no_anchor_is_left_in_a_workspace_that_had_none(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    backend = _masked_backend(tmp_path, cluster, images, base_by_digest)
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        code, _, err = await _sh(sandbox, "echo hi > out.txt")
        assert code == 0, err
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert sorted(p.name for p in spec.workspace.iterdir()) == ["README.md", "out.txt"]


async def test_config_planted_in_the_pods_view_is_refused_before_launch(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """Unmasked (``mask_config`` off), config written into the pod after the copy in
    (as an image or a copy-in could plant it) is what the check in the pod's view sees."""
    backend = _masked_backend(tmp_path, cluster, images, base_by_digest)
    spec = dataclasses.replace(_spec(tmp_path), mask_config=False)
    sandbox = await backend.create(spec)
    try:
        clean = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
        assert clean.admitted, clean.to_dict()
        script = "mkdir -p /workspace/.cursor && echo '{}' > /workspace/.cursor/hooks.json"
        await asyncio.to_thread(backend.run, sandbox.sandbox_id, ["/bin/sh", "-c", script])
        planted = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
        assert not planted.admitted
        assert [f.path for f in planted.findings] == [".cursor/hooks.json"]
        assert not (spec.workspace / ".cursor").exists()  # seen in the pod, not on the host
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert_within_rbac(cluster)


PLANTED_TAG = f"planted-hooks-{uuid.uuid4().hex[:12]}"  # this session's own tag


@pytest.fixture
def planted_image(docker_host: str, base_image: str) -> Iterator[str]:
    """The base image with Cursor's enterprise hooks file planted in it, by digest (this
    test's own image, removed afterwards)."""
    if real_cluster() is not None:
        pytest.skip("builds its image on the local engine: the double's case only")
    containerfile = (
        f"FROM {base_image}\nUSER 0\n"
        "RUN mkdir -p /etc/cursor && echo '{}' > /etc/cursor/hooks.json\n"
        "USER 1000\n"
    )
    client = docker.DockerClient(base_url=docker_host)
    try:
        image, _ = client.images.build(fileobj=io.BytesIO(containerfile.encode()), rm=True)
        reference = by_digest(docker_host, str(image.id), PLANTED_TAG)
        yield reference
    finally:
        with contextlib.suppress(docker.errors.APIError):  # only this test's own tag
            client.images.remove(f"{REPOSITORY}:{PLANTED_TAG}")
        client.close()


async def test_config_planted_in_the_image_is_refused_before_launch(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, planted_image: str
) -> None:
    backend = _masked_backend(tmp_path, cluster, images, planted_image)
    sandbox = await backend.create(_spec(tmp_path))
    try:
        view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert not view.admitted
    assert [f.path for f in view.findings] == ["/etc/cursor/hooks.json"]
