"""The kubernetes backend through the official client, against the API double.

No Kubernetes API server can run on this machine (nor in CI): ``tests/k8s_double``
stands in for it, speaking the real HTTP and exec WebSocket protocols and running each
pod it is given on the shared Podman service. The pods, the client and the containers
are real; only the API server is stood in for. ``make test-k8s`` runs this module
against a real cluster instead when ``KUBECONFIG`` is set (``K8S_REAL``).

Whole jobs run ``run_job`` in-process with a ``KubernetesBackend`` (the core ``acp-worker
run --backend kubernetes`` calls) on the real emulator pack in its pack image.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import REPO, base_image, docker_host, engine_config
from tests.k8s_double.fixtures import NAMESPACE, k8s_double, kubeconfig
from tests.k8s_double.server import ApiDouble
from worker.errors import SandboxError
from worker.events.sinks import MemorySink
from worker.images.engine import EngineConfig
from worker.job import JobOutcome, run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.backend import KubernetesBackend
from worker.settings import Settings

__all__ = ["base_image", "docker_host", "engine_config", "k8s_double", "kubeconfig"]

pytestmark = pytest.mark.integration

SECRET = "emulator-k8s-secret-5be1"


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        packs_dir=REPO / "provider_packs",
        worker_id="w-k8s",
        shutdown_eof_grace=1.0,
        cancel_grace=3.0,
    )


def _backend(tmp_path: Path, kubeconfig: Path, engine: EngineConfig) -> KubernetesBackend:
    config = KubernetesConfig(
        worker_id="w-k8s",
        cache_dir=tmp_path / "cache",
        k8s_namespace=NAMESPACE,
        k8s_kubeconfig=kubeconfig,
        k8s_start_timeout_s=90,
    )
    return KubernetesBackend(config, engine_config=engine)


def _job(tmp_path: Path, prompt: str) -> Any:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    return parse_job(
        {
            "v": 1,
            "job_id": f"k8s-{tmp_path.name[-16:]}".replace("_", "-"),
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
            "prompt": prompt,
            "credentials": {"CURSOR_API_KEY": "file:key"},
            "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
        }
    )


async def _run(
    tmp_path: Path, backend: KubernetesBackend, prompt: str
) -> tuple[JobOutcome, list[dict[str, Any]]]:
    sink = MemorySink()
    outcome = await run_job(
        _job(tmp_path, prompt),
        settings=_settings(tmp_path),
        backend=backend,
        sinks=[sink],
        environ={},
    )
    return outcome, [dict(e) for e in sink.events]


@pytest.mark.usefixtures("base_image")
async def test_hello_job_completes_through_the_client(
    tmp_path: Path, kubeconfig: Path, engine_config: EngineConfig, k8s_double: ApiDouble
) -> None:
    backend = _backend(tmp_path, kubeconfig, engine_config)
    prompt = "#!scenario\nwrite notes/k8s.txt written in the pod\nsay Hello from the pod\n"
    outcome, events = await _run(tmp_path, backend, prompt)
    assert outcome.status == "succeeded", [(e["type"], e["data"]) for e in events[-4:]]
    types = [e["type"] for e in events]
    assert events[3]["type"] == "sandbox.ready"
    assert events[3]["data"]["backend"] == "kubernetes"
    text = "".join(e["data"].get("text", "") for e in events if e["type"] == "message.delta")
    assert "Hello from the pod" in text
    # The file the agent wrote in the pod came back to be captured.
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert [(p["path"], p["status"]) for p in changed["paths"]] == [
        ("notes", "added"),
        ("notes/k8s.txt", "added"),
    ]
    assert types[-1] == "job.completed"
    assert SECRET not in str(events)
    # Through the API: the pod, the stdio exec, the deny-all policy; then nothing left.
    paths = {(m, p.split("/")[-1]) for m, p in k8s_double.requests}
    assert {("POST", "pods"), ("GET", "exec"), ("DELETE", events[3]["data"]["sandbox_id"])} <= paths
    assert ("POST", "networkpolicies") in paths
    assert await backend.list({LABEL_JOB: events[0]["job_id"]}) == []
    assert k8s_double.pods == {}


@pytest.mark.usefixtures("base_image")
async def test_a_pack_image_that_cannot_be_pulled_is_a_typed_error(
    tmp_path: Path, kubeconfig: Path, engine_config: EngineConfig, k8s_double: ApiDouble
) -> None:
    backend = _backend(tmp_path, kubeconfig, engine_config)
    backend._image = lambda spec: "localhost/acpw-k8s-double-absent@sha256:" + "0" * 64  # type: ignore[method-assign]
    outcome, events = await _run(tmp_path, backend, "scenario: hello")
    assert outcome.status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "sandbox_failed"
    assert error["details"]["reason"] == "ErrImagePull"
    await asyncio.sleep(0)
    assert k8s_double.pods == {} or all(
        p.obj["metadata"].get("deletionTimestamp") for p in k8s_double.pods.values()
    )


def test_allowlist_is_refused_until_the_in_cluster_proxy_exists(tmp_path: Path) -> None:
    config = KubernetesConfig(worker_id="w", cache_dir=tmp_path, k8s_namespace=NAMESPACE)
    backend = KubernetesBackend(config)
    from worker.sandbox.base import ResourceLimits, SandboxSpec

    spec = SandboxSpec(
        job_id="j", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64), labels={},
        network="allowlist", network_allow=("example.com:443",),
    )  # fmt: skip
    with pytest.raises(SandboxError, match="allowlist"):
        asyncio.run(backend.create(spec))
