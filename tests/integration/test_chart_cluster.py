"""The Helm chart installed on a real cluster with ``helm``, and a job run through it.

Skipped unless ``ACPW_TEST_KUBECONFIG`` names a cluster (``make test-k8s`` sets it from
``KUBECONFIG``); then every prerequisite is required and a missing one fails the test
loudly, saying what to provide: no cluster here can run it (docs/kubernetes.md, What is
tested). What it does, on the cluster ``ACPW_TEST_KUBECONFIG`` names:

1. builds the emulator pack's image and pushes it to ``ACPW_TEST_K8S_REGISTRY``
   (``acp-worker image build`` with ``ACPW_IMAGE_REGISTRY``), which writes its pin;
2. ``helm upgrade --install`` of helm/acp-worker with the chart's defaults (the sandbox
   namespace ``ACPW_TEST_K8S_NAMESPACE`` made with Pod Security ``restricted``, the
   NetworkPolicies, the Role without NetworkPolicy verbs) and only what an install must
   give: the worker image ``ACPW_TEST_K8S_WORKER_IMAGE`` (by digest), the Redis
   ``ACPW_TEST_K8S_REDIS_URL``, the pin and base image id, the emulator pack and a
   workspace from ConfigMaps, the emulator's dummy key; ``--wait`` for the workers to
   be ready;
3. submits a job from this host (``acp-worker submit`` on the same Redis, or on
   ``ACPW_TEST_K8S_REDIS_HOST_URL`` when this host reaches it by another address) and
   follows it to ``succeeded``: a worker in the cluster ran it in a sandbox pod it
   created with the chart's ServiceAccount and Role;
4. writes a kubeconfig that acts as the chart's ServiceAccount
   (``ACPW_TEST_K8S_SA_KUBECONFIG``, when set) for the backend modules that run after
   it, so that their RBAC is the chart's, and leaves the release installed for them
   (``make test-k8s`` uninstalls it at the end). The official Python client does not
   honour a kubeconfig's impersonation (``as``), so that kubeconfig carries a token of
   the ServiceAccount itself (TokenRequest, ``kubectl create token``): the API server
   authorizes each request as that account, which is what impersonation would test.

Never run yet: no cluster is reachable from the machines this was written on.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not os.environ.get("ACPW_TEST_KUBECONFIG"),
        reason="no cluster: ACPW_TEST_KUBECONFIG is not set (make test-k8s sets it)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "acp-worker"
ACP_WORKER = str(Path(sys.executable).with_name("acp-worker"))
RELEASE = "acpw-test"
EMULATOR = "cursor-emulator"
EMULATOR_KEY = "emulator-demo-key-not-a-real-secret"  # what examples/secrets holds
REQUIRED = {
    "ACPW_TEST_K8S_REGISTRY": "a registry the cluster's nodes pull from (pack images go there)",
    "ACPW_TEST_K8S_WORKER_IMAGE": "the worker image by digest, pullable by the cluster "
    "(make worker-image, then push it: registry/acp-worker@sha256:…)",
    "ACPW_TEST_K8S_REDIS_URL": "a Redis the worker pods reach (job store and broker)",
}


def _required() -> dict[str, str]:
    missing = [f"{name}: {why}" for name, why in REQUIRED.items() if not os.environ.get(name)]
    for tool, why in (("helm", "Helm 3 or 4"), ("kubectl", "for the ConfigMaps and a token")):
        if shutil.which(tool) is None:
            missing.append(f"a `{tool}` binary on PATH ({why})")
    if missing:
        pytest.fail("test-k8s needs, to install the chart:\n  " + "\n  ".join(missing))
    return {name: os.environ[name] for name in REQUIRED}


def _run(*argv: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    assert done.returncode == 0, f"{argv[:3]} failed:\n{done.stderr[-4000:]}{done.stdout[-2000:]}"
    return done.stdout


def _pin(tmp_path: Path, registry: str) -> tuple[str, dict[str, str]]:
    """(base image id, {pin file: content}) of the emulator pack's pushed image."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env |= {
        "ACPW_IMAGE_REGISTRY": registry,
        "ACPW_IMAGES_DIR": str(tmp_path / "images"),
        "ACPW_PACKS_DIR": str(REPO / "provider_packs"),
        "ACPW_CACHE_DIR": str(tmp_path / "cache"),
    }
    if os.environ.get("ACPW_DOCKER_HOST"):
        env["ACPW_DOCKER_HOST"] = os.environ["ACPW_DOCKER_HOST"]
    base = json.loads(_run(ACP_WORKER, "image", "base", "--json", env=env))["image_id"]
    _run(ACP_WORKER, "image", "build", EMULATOR, env=env)
    pins = {p.name: p.read_text() for p in (tmp_path / "images" / "pins").glob("*.json")}
    assert pins, "acp-worker image build wrote no pin (was the image pushed?)"
    return str(base), pins


def _config_maps(namespace: str) -> list[dict[str, Any]]:
    """The emulator pack (declaration, lock, archive) and the job's workspace, as the
    ConfigMaps the release mounts (a pack archive of ~110 KiB fits one)."""
    pack = REPO / "provider_packs" / EMULATOR
    (archive,) = (pack / "dist").glob("*.tar")
    files = {"pack.json": pack / "pack.json"} | {
        f"lock-{p.name}": p for p in (pack / "lock").glob("*.json")
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{RELEASE}-pack", "namespace": namespace},
            "data": {key: path.read_text() for key, path in files.items()},
            "binaryData": {"archive": base64.b64encode(archive.read_bytes()).decode()},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{RELEASE}-workspace", "namespace": namespace},
            "data": {"README.md": (REPO / "examples/hello-workspace/README.md").read_text()},
        },
    ]


def _pack_items() -> list[dict[str, str]]:
    pack = REPO / "provider_packs" / EMULATOR
    (archive,) = (pack / "dist").glob("*.tar")
    items = [{"key": "pack.json", "path": f"{EMULATOR}/pack.json"}]
    items += [
        {"key": f"lock-{p.name}", "path": f"{EMULATOR}/lock/{p.name}"}
        for p in (pack / "lock").glob("*.json")
    ]
    return [*items, {"key": "archive", "path": f"{EMULATOR}/dist/{archive.name}"}]


def _values(need: dict[str, str], base_id: str, pins: dict[str, str], sandbox_ns: str) -> dict:
    return {
        "image": {"ref": need["ACPW_TEST_K8S_WORKER_IMAGE"]},
        "redis": {"url": need["ACPW_TEST_K8S_REDIS_URL"]},
        "replicas": 1,
        "sandbox": {
            "kubernetes": {
                "namespace": sandbox_ns,
                "images": {"baseImageId": base_id, "pins": pins},
            }
        },
        "env": {"ACPW_PACKS_DIR": "/packs", "ACPW_LOCAL_WORKSPACE_ROOTS": '["/workspaces"]'},
        "extraEnv": [{"name": "EMULATOR_API_KEY", "value": EMULATOR_KEY}],
        "extraVolumes": [
            {"name": "packs", "configMap": {"name": f"{RELEASE}-pack", "items": _pack_items()}},
            {"name": "workspace", "configMap": {"name": f"{RELEASE}-workspace"}},
        ],
        "extraVolumeMounts": [
            {"name": "packs", "mountPath": "/packs", "readOnly": True},
            {"name": "workspace", "mountPath": "/workspaces/hello", "readOnly": True},
        ],
    }


def _as_service_account(
    kubeconfig: Path, service_account: str, namespace: str, out: Path, env: dict[str, str]
) -> None:
    """``kubeconfig``'s cluster with the chart's ServiceAccount as its user: a token of
    that account (TokenRequest), so the API server authorizes every request by the
    chart's RBAC."""
    token = _run("kubectl", "create", "token", service_account, "--namespace", namespace,
                 "--duration", "4h", env=env).strip()  # fmt: skip
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    user = "acpw-test-chart-service-account"
    context["context"]["user"] = user
    config["users"] = [{"name": user, "user": {"token": token}}]
    config["contexts"] = [context]
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o600)


def test_a_job_runs_through_the_installed_chart(tmp_path: Path) -> None:
    need = _required()
    kubeconfig = Path(os.environ["ACPW_TEST_KUBECONFIG"])
    release_ns = os.environ.get("ACPW_TEST_K8S_RELEASE_NAMESPACE", "acpw-test-system")
    sandbox_ns = os.environ.get("ACPW_TEST_K8S_NAMESPACE", "acpw-test-sandboxes")
    env = os.environ | {"KUBECONFIG": str(kubeconfig)}
    base_id, pins = _pin(tmp_path, need["ACPW_TEST_K8S_REGISTRY"])
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(_values(need, base_id, pins, sandbox_ns)))
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release_ns}}
    maps = tmp_path / "configmaps.yaml"
    maps.write_text(yaml.safe_dump_all([namespace, *_config_maps(release_ns)]))
    _run("kubectl", "apply", "-f", str(maps), env=env)
    _run("helm", "upgrade", "--install", RELEASE, str(CHART), "--namespace", release_ns,
         "--create-namespace", "--values", str(values), "--wait", "--timeout", "10m",
         env=env)  # fmt: skip

    job_id = f"chart-cluster-{uuid.uuid4().hex[:12]}"
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "v": 1,
                "job_id": job_id,
                "pack": {"name": EMULATOR},
                "workspace": {"kind": "local", "path": "/workspaces/hello"},
                "prompt": "scenario: hello",
                "credentials": {"CURSOR_API_KEY": "env:EMULATOR_API_KEY"},
                "limits": {"timeout_s": 120, "memory_mb": 512, "cpus": 1, "pids": 128},
                "network": {"mode": "none"},
            }
        )
    )
    redis_url = os.environ.get("ACPW_TEST_K8S_REDIS_HOST_URL") or need["ACPW_TEST_K8S_REDIS_URL"]
    lines = _run(ACP_WORKER, "submit", "--follow", "--json", "--redis", redis_url, str(job))
    events = [json.loads(line)["event"] for line in lines.splitlines() if '"event"' in line]
    assert events, lines[-3000:]
    assert events[-1]["type"] == "job.completed", [e["type"] for e in events]
    assert events[-1]["data"]["status"] == "succeeded", events[-1]
    (ready,) = [e["data"] for e in events if e["type"] == "sandbox.ready"]
    assert ready["backend"] == "kubernetes"

    out = os.environ.get("ACPW_TEST_K8S_SA_KUBECONFIG")
    if out:
        account = f"{RELEASE}-acp-worker"
        _as_service_account(kubeconfig, account, release_ns, Path(out), env)
