"""Warm pools on the kubernetes backend, against the API double (``tests/k8s_double``
stands in for the API server, which cannot run here; the pods run for real on the
shared Podman service): real Redis, the Cursor emulator pack in its pack image, jobs
delivered as the service delivers them (``run_delivery``).

The first job of a launch identity is cold and leaves a slot pod behind; the next one
claims it: the pod is relabelled to the attempt (the reaper's view of it is the
attempt's), the job's workspace is copied into it, and the job's changes are those of
the cold job; the slot serves that one job; a job with other credentials misses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import REPO, base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import assert_within_rbac
from tests.integration.test_warm import _changed, _deliver, _job, _ready, _until_idle
from tests.integration.test_warm import _settings as _warm_settings
from tests.integration.test_warm import (
    test_a_claimed_slot_is_judged_by_its_attempts_lease as judged_by_its_lease,
)
from tests.k8s_double.fixtures import Cluster, base_by_digest, cluster, images
from worker.images.engine import EngineConfig
from worker.job.warm import WarmPool
from worker.sandbox.base import LABEL_JOB, LABEL_SLOT, LABEL_TOKEN, Sandbox
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.backend import KubernetesBackend

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = pytest.mark.integration

PROMPT = "#!scenario\nwrite notes/k8s.txt written in the pod\nsay Hello from the pod\n"


@pytest.mark.usefixtures("base_image")
def test_a_warm_kubernetes_job_runs_in_its_relabelled_slot_pod(
    tmp_path: Path, redis_url: str, cluster: Cluster, images: EngineConfig
) -> None:
    settings = _warm_settings(tmp_path, "kubernetes").model_copy(
        update={"packs_dir": REPO / "provider_packs"}
    )
    config = KubernetesConfig(
        worker_id=settings.worker_id,
        cache_dir=settings.cache_dir,
        k8s_namespace=cluster.namespace,
        k8s_kubeconfig=cluster.kubeconfig,
        k8s_start_timeout_s=90,
    )
    backend = KubernetesBackend(config, engine_config=images)
    pool = WarmPool(settings, backend, backend_config=config.model_dump_json())

    # What the reaper saw of the claimed pod once it was relabelled, before its fill.
    seen: list[Any] = []
    fill = backend.fill

    async def fill_seen(sandbox: Sandbox, staged: Path) -> Path:
        seen.extend(await backend.list({LABEL_JOB: job_id}))
        return await fill(sandbox, staged)

    backend.fill = fill_seen  # type: ignore[method-assign]

    def job(key: str) -> dict[str, Any]:
        return {**_job(tmp_path, key), "prompt": PROMPT}

    async def scenario() -> None:
        nonlocal job_id
        try:
            first = await _deliver(job("alpha"), settings, pool)
            assert _ready(first).keys() == {"backend", "sandbox_id"}
            await _until_idle(pool, 1)
            [slot] = pool.idle()
            assert (await backend.list({LABEL_SLOT: slot.slot_id}))[0].sandbox_id == (
                slot.sandbox.sandbox_id
            )

            second_job = job("alpha")
            job_id = second_job["job_id"]
            second = await _deliver(second_job, settings, pool)
            ready = _ready(second)
            assert ready["warm"] is True
            assert ready["backend"] == "kubernetes"
            assert ready["sandbox_id"] == slot.sandbox.sandbox_id
            assert second[-1]["data"]["status"] == "succeeded"
            # Relabelled: the attempt's sandbox to the reaper, no longer a slot.
            [info] = seen
            assert info.sandbox_id == slot.sandbox.sandbox_id
            assert LABEL_SLOT not in info.labels
            assert info.labels[LABEL_TOKEN] != "0"
            # The job's workspace was the pod's: the same changes as the cold job's.
            assert _changed(second) == _changed(first)
            paths = {(p["path"], p["status"]) for p in _changed(second)["paths"]}
            assert ("notes/k8s.txt", "added") in paths
            # One use: the slot pod went with its job.
            assert await backend.list({LABEL_SLOT: slot.slot_id}) == []
            assert await backend.list({LABEL_JOB: job_id}) == []

            # Another credential binding is another identity: a miss, cold.
            third = await _deliver(job("beta"), settings, pool)
            assert "warm" not in _ready(third)
            assert third[-1]["data"]["status"] == "succeeded"
        finally:
            await pool.close()
        assert await backend.list({"acpw.worker": settings.worker_id}) == []

    job_id = ""
    asyncio.run(scenario())
    if cluster.double is not None:
        patches = [p for m, p in cluster.double.requests if m == "PATCH"]
        assert patches == [f"/api/v1/namespaces/{cluster.namespace}/pods/{seen[0].sandbox_id}"]
    assert_within_rbac(cluster)


@pytest.mark.usefixtures("base_image")
def test_a_claimed_slot_pod_is_judged_by_its_attempts_lease(
    tmp_path: Path,
    redis_url: str,
    cluster: Cluster,
    images: EngineConfig,
    base_by_digest: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``test_warm``'s lease case on a pod: relabelled, it is the attempt's to the reaper
    (kept while the lease holds, its slot record gone; deleted once the lease is gone).
    The pod runs the base image (the case's closure is empty: no pack image)."""
    monkeypatch.setattr(KubernetesBackend, "_image", lambda self, spec: base_by_digest)
    monkeypatch.setenv("ACPW_K8S_KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("ACPW_K8S_NAMESPACE", cluster.namespace)
    monkeypatch.setenv("ACPW_DOCKER_HOST", str(images.docker_host))
    monkeypatch.setenv("ACPW_IMAGES_DIR", str(images.images_dir))
    judged_by_its_lease(tmp_path, redis_url, "kubernetes")
