"""The Kubernetes backend on a cluster that is slow, throttled and failing for a while,
through the official client against the API double's hostile modes (no cluster runs
here; the double stands in for one: tests/k8s_double): a pod that waits for a node and
fails its image pull before it runs, API calls answered 429/5xx or reset, an exec
refused by RBAC, deletion with the API server's grace semantics, and a copy-out past
the worker's disk bound. Each needs the double's controls, so a real cluster skips
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import (
    ENV,
    _backend,
    _on_base,
    _spec,
    assert_within_rbac,
)
from tests.k8s_double.fixtures import Cluster, base_by_digest, cluster, images
from tests.k8s_double.pods import Gate, podman
from tests.k8s_double.server import ApiDouble
from worker.errors import (
    BackendAuthFailed,
    ImagePullFailed,
    SandboxUnschedulable,
    WorkerDiskExceeded,
)
from worker.images.engine import EngineConfig
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.kubernetes import backend as backend_module
from worker.sandbox.kubernetes.manifests import TERMINATION_GRACE_S

__all__ = [
    "base_by_digest",
    "base_image",
    "cluster",
    "docker_host",
    "engine_config",
    "images",
]

pytestmark = pytest.mark.integration


def _double(cluster: Cluster) -> ApiDouble:
    if cluster.double is None:
        pytest.skip("the API double's controls: a real cluster is not slow on demand")
    return cluster.double


async def test_a_slow_and_failing_cluster_still_runs_the_job(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """No node for 3 s (a node being added), two failed pulls, and on the way: the
    create's answer lost after it was made, reads answered 503, the list throttled with
    Retry-After, an exec handshake 503, a delete 500. The job's pod runs, its program
    runs, it is listed and deleted, every fault was met and got past."""
    double = _double(cluster)
    double.gate = Gate(unschedulable_s=3, pull_failures=2, pull_backoff_s=2)
    double.faults.inject("create pods", 1, reset="after")
    double.faults.inject("get pods", 2, status=503)
    double.faults.inject("get pods/exec", 1, status=503)
    double.faults.inject("list pods", 1, status=429, retry_after=1)
    double.faults.inject("delete pods", 1, status=500)
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        proc = await sandbox.spawn(["/bin/sh", "-c", "echo made >written.txt"], env=ENV)
        assert await proc.wait() == 0
        listed = await backend.list({LABEL_JOB: spec.job_id})
        assert [i.sandbox_id for i in listed] == [sandbox.sandbox_id]
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert (spec.workspace / "written.txt").read_text() == "made\n"
    assert await backend.list({LABEL_JOB: spec.job_id}) == []
    assert double.faults.served == {
        "create pods": 1,
        "get pods": 2,
        "get pods/exec": 1,
        "list pods": 1,
        "delete pods": 1,
    }
    assert_within_rbac(cluster)


async def test_waits_past_their_bounds_fail_typed_with_conditions_and_events(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """Past k8s_unschedulable_timeout_s a pod with no node is `sandbox_unschedulable`;
    past k8s_image_pull_timeout_s an image the kubelet keeps failing to pull is
    `image_pull_failed`: each with the pod's last conditions and the scheduler's or
    kubelet's events, and the pod deleted."""
    double = _double(cluster)
    double.gate = Gate(unschedulable_s=300)
    backend = _on_base(
        _backend(tmp_path, cluster, images, k8s_unschedulable_timeout_s=2), base_by_digest
    )
    with pytest.raises(SandboxUnschedulable) as unschedulable:
        await backend.create(_spec(tmp_path))
    details = unschedulable.value.details
    assert details["reason"] == "Unschedulable"
    assert details["waited_s"] >= 2
    assert details["conditions"][0]["reason"] == "Unschedulable"
    assert [e["reason"] for e in details["events"]] == ["FailedScheduling"]
    assert "nodes are available" in details["events"][0]["message"]
    double.gate = Gate(pull_failures=1000, pull_backoff_s=1)
    (tmp_path / "pull").mkdir()
    backend = _on_base(
        _backend(tmp_path / "pull", cluster, images, k8s_image_pull_timeout_s=3), base_by_digest
    )
    with pytest.raises(ImagePullFailed) as pull:
        await backend.create(_spec(tmp_path / "pull"))
    details = pull.value.details
    assert details["reason"] in {"ErrImagePull", "ImagePullBackOff"}
    assert details["conditions"] == [
        {"type": "PodScheduled", "status": "True", "reason": None, "message": None}
    ]
    reasons = [e["reason"] for e in details["events"]]
    assert {"Failed", "BackOff"} <= set(reasons)
    assert double.pods == {}
    assert_within_rbac(cluster)


async def test_an_exec_rbac_refuses_is_backend_auth_failed(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """An exec the Role does not grant: its handshake is refused 403, which is the
    worker's credentials or RBAC (`backend_auth_failed`), not an unreachable API."""
    double = _double(cluster)
    double.granted -= {("", "pods/exec", "create")}
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    with pytest.raises(BackendAuthFailed) as refused:
        await backend.create(spec)  # the copy-in is the first exec
    assert refused.value.details["reason"] == "Forbidden"
    assert refused.value.details["status"] == 403
    assert await backend.list({LABEL_JOB: spec.job_id}) == []


def _running_on_engine(double: ApiDouble, engine_name: str) -> bool:
    state = podman(double.docker_host, "inspect", "--format", "{{.State.Running}}",
                   f"{engine_name}-agent")  # fmt: skip
    return state.stdout.strip() == "true"


async def test_a_pod_is_deleted_with_its_grace_and_forced_only_past_it(
    tmp_path: Path,
    cluster: Cluster,
    images: EngineConfig,
    base_by_digest: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """destroy deletes with the pod's grace and returns once the pod is gone, its
    containers stopped (a grace-0 delete would free the name while they still ran).
    With the kubelet gone (a lost node) the pod stays terminating: past its grace it is
    forced. And a copy-out over the worker's disk bound is refused as it arrives, the
    host workspace left as it was and the pod deleted all the same."""
    double = _double(cluster)
    double.force_lag_s = 30
    backend = _on_base(
        _backend(tmp_path, cluster, images, k8s_copy_out_max_bytes=1024**2), base_by_digest
    )
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    engine_name = double.pods[(cluster.namespace, sandbox.sandbox_id)].engine_name
    try:
        big = await sandbox.spawn(
            ["/bin/sh", "-c", "head -c 3145728 /dev/urandom >big.bin"], env=ENV
        )
        assert await big.wait() == 0
    finally:
        with pytest.raises(WorkerDiskExceeded) as refused:
            await backend.destroy(sandbox.sandbox_id)
    assert refused.value.details["bound"] == 1024**2
    assert not (spec.workspace / "big.bin").exists()
    assert (spec.workspace / "README.md").read_text() == "# staged\n"
    assert backend.disk.used == 0
    assert double.deletions == [(sandbox.sandbox_id, TERMINATION_GRACE_S)]
    assert not _running_on_engine(double, engine_name)
    # A lost node: nothing stops the pod; its graceful deletion never ends by itself.
    # Its forced deletion is only counted: the kubelet may stop its containers at the
    # double's usual lag (the long one above would keep the double's close waiting).
    double.force_lag_s = 3.0
    monkeypatch.setattr(backend_module, "DELETE_MARGIN_S", 1)
    double.kubelet_down = True
    (tmp_path / "lost").mkdir()
    lost = await backend.create(_spec(tmp_path / "lost"))
    await backend.destroy(lost.sandbox_id)
    assert double.deletions[1:] == [(lost.sandbox_id, TERMINATION_GRACE_S), (lost.sandbox_id, 0)]
    assert await backend.list({LABEL_JOB: lost.spec.job_id}) == []
    assert_within_rbac(cluster)
