"""Warm pools on the kubernetes backend, against the API double (``tests/k8s_double``
stands in for the API server, which cannot run here; the pods run for real on the
shared Podman service): real Redis, the Cursor emulator pack in its pack image, jobs
delivered as the service delivers them (``run_delivery``).

The first job of a launch identity is cold and leaves a slot pod behind; the next one
claims it: the pod is relabelled to the attempt (the reaper's view of it is the
attempt's) and its ``activeDeadlineSeconds`` brought down from the slot's cap to the
job's bound (a raise is refused, as the API server refuses it), the job's workspace is
copied into it, and the job's changes are those of the cold job; the slot serves that
one job; a job with other credentials misses.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

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
from worker.sandbox.base import LABEL_JOB, LABEL_SLOT, LABEL_TOKEN, Sandbox, sandbox_deadline
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.backend import KubernetesBackend

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = pytest.mark.integration

PROMPT = "#!scenario\nwrite notes/k8s.txt written in the pod\nsay Hello from the pod\n"


@pytest.mark.usefixtures("base_image")
def test_a_warm_kubernetes_job_runs_in_its_relabelled_slot_pod(
    tmp_path: Path, redis_url: str, cluster: Cluster, images: EngineConfig
) -> None:
    settings = _warm_settings(tmp_path, "kubernetes", packs_dir=REPO / "provider_packs")
    config = KubernetesConfig(
        worker_id=settings.worker_id,
        cache_dir=settings.cache_dir,
        k8s_namespace=cluster.namespace,
        k8s_kubeconfig=cluster.kubeconfig,
        k8s_start_timeout_s=90,
    )
    backend = KubernetesBackend(config, engine_config=images)
    pool = WarmPool(settings, backend, backend_config=config.model_dump_json())

    # What the reaper saw of the claimed pod once it was relabelled, before its fill;
    # its activeDeadlineSeconds then, and the API's answer to raising it.
    seen: list[Any] = []
    deadlines: list[int] = []
    refusals: list[ApiException] = []
    fill = backend.fill

    def raise_deadline(name: str, seconds: int) -> None:
        body = {"spec": {"activeDeadlineSeconds": seconds}}
        try:
            backend.api.core.patch_namespaced_pod(
                name, cluster.namespace, body, _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            refusals.append(exc)

    async def fill_seen(sandbox: Sandbox, staged: Path) -> Path:
        seen.extend(await backend.list({LABEL_JOB: job_id}))
        pod = await asyncio.to_thread(backend.api.read_pod, sandbox.sandbox_id)
        assert pod is not None
        assert pod.spec is not None
        deadlines.append(int(pod.spec.active_deadline_seconds))
        await asyncio.to_thread(raise_deadline, sandbox.sandbox_id, deadlines[-1] + 1)
        return await fill(sandbox, staged)

    backend.fill = fill_seen  # type: ignore[method-assign]

    def job(key: str) -> dict[str, Any]:
        return {**_job(tmp_path, key), "prompt": PROMPT}

    async def scenario() -> None:
        nonlocal job_id
        try:
            before_slot = time.monotonic()
            first = await _deliver(job("alpha"), settings, pool)
            assert _ready(first).keys() == {"backend", "sandbox_id"}
            await _until_idle(pool, 1)
            slot_made = time.monotonic()
            [slot] = pool.idle()
            assert (await backend.list({LABEL_SLOT: slot.slot_id}))[0].sandbox_id == (
                slot.sandbox.sandbox_id
            )

            second_job = job("alpha")
            job_id = second_job["job_id"]
            claimed = time.monotonic()
            second = await _deliver(second_job, settings, pool)
            assigned = time.monotonic()
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
            # Bounded as the job's cold pod: the seconds the slot pod had been active
            # when it was claimed, plus the job's own bound (timeout and margin), where
            # the slot had the cap; a raise was refused as the API server refuses it.
            bound = sandbox_deadline(second_job["limits"]["timeout_s"])
            [deadline] = deadlines
            assert deadline < config.k8s_active_deadline_s
            assert claimed - slot_made <= deadline - bound <= assigned - before_slot + 1
            [refused] = refusals
            assert refused.status == 422
            status = json.loads(refused.body)
            assert status["reason"] == "Invalid"
            [cause] = status["details"]["causes"]
            assert cause["field"] == "spec.activeDeadlineSeconds"
            assert cause["message"] == (
                f"Invalid value: {deadline + 1}: must be less than or equal to previous value"
            )
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
        # The claim's patch (labels and deadline at once), then the test's refused raise.
        patches = [p for m, p in cluster.double.requests if m == "PATCH"]
        assert patches == [f"/api/v1/namespaces/{cluster.namespace}/pods/{seen[0].sandbox_id}"] * 2
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
