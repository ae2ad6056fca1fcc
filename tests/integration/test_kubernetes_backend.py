"""The kubernetes backend through the official client, against the API double.

No Kubernetes API server can run on this machine (nor in CI): ``tests/k8s_double``
stands in for it, speaking the real HTTP and exec WebSocket protocols and running each
pod it is given on the shared Podman service. The pods, the client and the containers
are real; only the API server is stood in for. ``make test-k8s`` runs this module
against a real cluster instead when ``KUBECONFIG`` is set (the ``cluster`` fixture of
``tests/k8s_double/fixtures.py``); what only the double can show (the requests it saw)
is checked only there.

Whole jobs run ``run_job`` in-process with a ``KubernetesBackend`` (the core ``acp-worker
run --backend kubernetes`` calls) on the real emulator pack in its pack image.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.integration.docker_engine import REPO, base_image, docker_host, engine_config
from tests.integration.test_run_job import SECRET as CLI_SECRET
from tests.integration.test_run_job import _check_stream, _env, _events, run_cli
from tests.integration.test_run_job import _job as _job_file
from tests.integration.test_service import ACP_WORKER, BROKER_URL, _flush, completed, wait_for
from tests.integration.test_service import _env as _service_env
from tests.integration.test_service import job as _service_job
from tests.k8s_double import rbac
from tests.k8s_double.fixtures import Cluster, base_by_digest, cluster, images
from worker.client import Client
from worker.events.sinks import MemorySink
from worker.images.engine import EngineConfig
from worker.job import JobOutcome, run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import (
    LABEL_JOB,
    SANDBOX_DEADLINE_MARGIN_S,
    ResourceLimits,
    SandboxSpec,
)
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.api import PULL_FAILURES
from worker.sandbox.kubernetes.backend import KubernetesBackend
from worker.sandbox.kubernetes.manifests import RBAC_RULES
from worker.service.reaper import reap_once
from worker.settings import Settings
from worker.store.owner import owner_label

__all__ = [
    "base_by_digest",
    "base_image",
    "cluster",
    "docker_host",
    "engine_config",
    "images",
]

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


def _backend(
    tmp_path: Path, cluster: Cluster, engine: EngineConfig, **config: Any
) -> KubernetesBackend:
    settings = KubernetesConfig(
        worker_id="w-k8s",
        cache_dir=tmp_path / "cache",
        k8s_namespace=cluster.namespace,
        k8s_kubeconfig=cluster.kubeconfig,
        k8s_start_timeout_s=90,
        **config,
    )
    return KubernetesBackend(settings, engine_config=engine)


def _job(tmp_path: Path, prompt: str, *, timeout_s: int = 60) -> Any:
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
            "limits": {"timeout_s": timeout_s, "memory_mb": 512, "pids": 128},
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
async def test_a_pack_image_that_cannot_be_pulled_is_a_typed_error(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    # The kubelet retries a failed pull: waited out for k8s_image_pull_timeout_s first.
    backend = _backend(tmp_path, cluster, images, k8s_image_pull_timeout_s=3)
    backend._image = lambda spec: "localhost/acpw-k8s-double-absent@sha256:" + "0" * 64  # type: ignore[method-assign]
    outcome, events = await _run(tmp_path, backend, "scenario: hello")
    assert outcome.status == "failed"
    error = events[-1]["data"]["error"]
    assert error["code"] == "image_pull_failed"
    assert error["details"]["reason"] in PULL_FAILURES
    assert "Traceback" not in error["message"]
    assert await backend.list({LABEL_JOB: events[0]["job_id"]}) == []
    if cluster.double is not None:
        # The job's timeout (60 s) and the setup/teardown margin: the kubelet's backstop.
        (pod,) = cluster.double.created
        assert pod["spec"]["activeDeadlineSeconds"] == 60 + SANDBOX_DEADLINE_MARGIN_S


@pytest.mark.usefixtures("base_image")
def test_acp_worker_run_backend_kubernetes_completes_a_job(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    """`acp-worker run --backend kubernetes`: the CLI builds the backend from its
    variables; the emulator pack runs in its pack image in a pod to job.completed, and
    the file it wrote there comes back to be captured."""
    prompt = "#!scenario\nwrite notes/k8s.txt written in the pod\nsay Hello from the pod\n"
    job = _job_file(tmp_path, prompt)
    env = _env(
        tmp_path,
        ACPW_K8S_KUBECONFIG=str(cluster.kubeconfig),
        ACPW_K8S_NAMESPACE=cluster.namespace,
        ACPW_DOCKER_HOST=str(images.docker_host),
        ACPW_IMAGES_DIR=str(images.images_dir),
        **({} if images.registry is None else {"ACPW_IMAGE_REGISTRY": images.registry}),
    )
    args = ("run", "--backend", "kubernetes", str(job), "--json")
    result = run_cli(tmp_path, *args, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    events = _events(result.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    ready = next(e["data"] for e in events if e["type"] == "sandbox.ready")
    assert ready["backend"] == "kubernetes"
    text = "".join(e["data"].get("text", "") for e in events if e["type"] == "message.delta")
    assert "Hello from the pod" in text
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert [(p["path"], p["status"]) for p in changed["paths"]] == [
        ("notes", "added"),
        ("notes/k8s.txt", "added"),
    ]
    assert CLI_SECRET not in result.stdout
    if cluster.double is not None:
        # Through the API: the pod, the stdio exec, the deny-all policy; nothing left.
        seen = {(m, p.split("/")[-1]) for m, p in cluster.double.requests}
        assert {("POST", "pods"), ("GET", "exec"), ("DELETE", ready["sandbox_id"])} <= seen
        assert ("POST", "networkpolicies") in seen
        assert cluster.double.pods == {}
    assert_within_rbac(cluster)


def assert_within_rbac(cluster: Cluster) -> None:
    """Every request the double saw needs only what ``RBAC_RULES`` grants (a real
    cluster would refuse the rest; only the double records requests)."""
    if cluster.double is None:
        return
    granted = {(r.api_group, r.resource, v) for r in RBAC_RULES for v in r.verbs}
    assert cluster.double.requests
    assert rbac.outside(cluster.double.requests, granted) == set()


def _spec(tmp_path: Path, **labels: str) -> SandboxSpec:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# staged\n")
    (tmp_path / "closure").mkdir(exist_ok=True)
    return SandboxSpec(
        job_id=f"kb-{tmp_path.name[-12:]}".replace("_", "-"), attempt=1,
        workspace=tmp_path / "ws", pack_closure=tmp_path / "closure",
        limits=ResourceLimits(memory_bytes=256 * 1024 * 1024, cpus=0.5, pids=64),
        labels={"acpw.worker": "w-k8s", **labels},
    )  # fmt: skip


def _on_base(backend: KubernetesBackend, image: str) -> KubernetesBackend:
    """The base image instead of a pack image (its python3 runs the launcher)."""
    backend._image = lambda spec: image  # type: ignore[method-assign]
    return backend


ENV = {"PATH": "/usr/bin:/bin", "FOO": "from-the-header"}


async def test_spawn_carries_stdio_env_signals_and_exit_status(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        script = 'cat README.md; echo "$FOO"; cat; echo made >written.txt; echo err >&2'
        proc = await sandbox.spawn(["/bin/sh", "-c", script], env=ENV)
        proc.stdin.write(b"via stdin\n")
        proc.stdin.close()  # the program's EOF ends its `cat`
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        out, err = await proc.stdout.read(), await proc.stderr.read()
        assert out == b"# staged\nfrom-the-header\nvia stdin\n"
        assert err == b"err\n"
        failing = await sandbox.spawn(["/bin/sh", "-c", "exit 3"], env=ENV)
        assert await asyncio.wait_for(failing.wait(), 30) == 3
        assert (await failing.exit_diagnosis()).details() == {"exit_code": 3}
        sleeper = await sandbox.spawn(["/bin/sleep", "60"], env=ENV)
        sleeper.terminate()
        assert await asyncio.wait_for(sleeper.wait(), 30) == -15
        deaf = (
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('on', flush=True); time.sleep(60)"
        )
        stubborn = await sandbox.spawn(["/usr/bin/python3", "-c", deaf], env=ENV)
        assert await stubborn.stdout.readline() == b"on\n"
        stubborn.kill()
        assert await asyncio.wait_for(stubborn.wait(), 30) == -9
        assert not (await stubborn.exit_diagnosis()).oom_killed  # we killed it
        # Past the pod's memory limit (256 MiB): the kernel's OOM killer, diagnosed so.
        hog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
        hungry = await sandbox.spawn(["/usr/bin/python3", "-c", hog], env=ENV)
        assert await asyncio.wait_for(hungry.wait(), 60) == -9
        assert (await hungry.exit_diagnosis()).oom_killed
        listed = await backend.list({LABEL_JOB: spec.job_id})
        assert [i.sandbox_id for i in listed] == [sandbox.sandbox_id]
        assert listed[0].labels["acpw.worker"] == "w-k8s"
    finally:
        await backend.destroy(sandbox.sandbox_id)
    # What the program wrote in the pod is in the host workspace now.
    assert (spec.workspace / "written.txt").read_text() == "made\n"
    await backend.destroy(sandbox.sandbox_id)  # idempotent
    assert await backend.list({LABEL_JOB: spec.job_id}) == []
    assert_within_rbac(cluster)


async def test_a_create_cancelled_as_its_pod_is_made_leaves_no_pod(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """A create cancelled while its request is under way (a job cancelled, a warm slot
    being made as its pool closes): the request still makes the pod, whose answer comes
    late; the create waits for it and deletes the pod before it ends cancelled."""
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    made = threading.Event()
    create_pod = backend.api.create_pod

    def answered_late(pod: Any) -> None:
        create_pod(pod)
        made.set()
        time.sleep(1.0)

    backend.api.create_pod = answered_late  # type: ignore[method-assign]
    creating = asyncio.ensure_future(backend.create(spec))
    assert await asyncio.to_thread(made.wait, 60)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert await backend.list({LABEL_JOB: spec.job_id}) == []


async def test_the_reaper_deletes_a_pod_whose_owner_is_gone(
    tmp_path: Path,
    cluster: Cluster,
    images: EngineConfig,
    base_by_digest: str,
    redis_url: str,
) -> None:
    gone = subprocess.Popen(["/bin/sleep", "30"])
    label = owner_label(gone.pid)
    gone.kill()
    gone.wait()
    assert label is not None
    creator = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    sandbox = await creator.create(_spec(tmp_path, **{"acpw.owner": label}))
    # Another process's backend: it has no record of the pod, only the API's labels.
    reaper = _backend(tmp_path, cluster, images)
    client = aioredis.Redis.from_url(redis_url)
    try:
        report = await reap_once(client, _settings(tmp_path), {"kubernetes": reaper})
    finally:
        await client.aclose()
    assert report.destroyed == (sandbox.sandbox_id,)
    assert await reaper.list({LABEL_JOB: sandbox.spec.job_id}) == []
    assert (tmp_path / "ws" / "README.md").read_text() == "# staged\n"  # nothing copied back
    assert_within_rbac(cluster)


@pytest.mark.usefixtures("base_image")
def test_a_served_job_runs_in_a_pod(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, redis_url: str
) -> None:
    """`acp-worker serve` with ACPW_BACKEND=kubernetes (and its reaper sweeping the
    kubernetes backend every second) runs a submitted job to `succeeded`."""
    _flush(BROKER_URL)
    env = {
        **_service_env("it-k8s"),
        "ACPW_BACKEND": "kubernetes",
        "ACPW_REAP_BACKENDS": '["kubernetes"]',
        "ACPW_K8S_KUBECONFIG": str(cluster.kubeconfig),
        "ACPW_K8S_NAMESPACE": cluster.namespace,
        "ACPW_CACHE_DIR": str(tmp_path / "cache"),
        "ACPW_DOCKER_HOST": str(images.docker_host),
        "ACPW_IMAGES_DIR": str(images.images_dir),
        **({} if images.registry is None else {"ACPW_IMAGE_REGISTRY": images.registry}),
    }
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [ACP_WORKER, "serve", "--concurrency", "1"], cwd=REPO, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: " ready." in log.read_text(), "the Celery worker", 60)
        job_id = f"served-{tmp_path.name[-10:]}".replace("_", "-")
        with Client(
            redis_url, settings=Settings(redis_url=redis_url, broker_url=BROKER_URL)
        ) as client:
            client.submit(_service_job(job_id))
            events = [dict(e.event) for e in client.events(job_id, follow=True, timeout=90)]
        # The task returns once its job settled; only then is the worker stopped, so the
        # stop never lands between the job's last event and its task's return.
        wait_for(lambda: "succeeded in" in log.read_text(), "the task's return", 60)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)  # nothing of it outlives the test
            worker.wait()
            pytest.fail(f"serve outlived SIGTERM by 60 s:\n{log.read_text()[-3000:]}")
        finally:
            _flush(BROKER_URL)
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"], log.read_text()[
        -3000:
    ]
    ready = next(e["data"] for e in events if e["type"] == "sandbox.ready")
    assert ready["backend"] == "kubernetes"
    if cluster.double is not None:
        assert cluster.double.pods == {}
