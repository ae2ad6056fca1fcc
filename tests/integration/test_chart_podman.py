"""The Helm chart's one-node install, run for real: rendered, played, ready, and a job.

There is no Kubernetes cluster on this machine (nor in CI) and no ``helm`` binary:
Helm v4's own engine (``helm-python-sdk``) renders ``helm/acp-worker`` with
``values-single-node.yaml``, the dev Redis on and the worker image built here from the
Dockerfile (``scripts/worker-image.sh``) named by digest, and ``podman kube play`` stands
in for the kubelet, on the shared Podman service of the docker tests. Then the worker
container starts, its readiness probe (as the chart renders it: GET /ready on the metrics
port) answers 200 through the published port, so does the health check Podman makes of its
liveness probe (GET /healthz), and a job submitted
from the host (``acp-worker submit`` against the dev Redis's published port) with the
emulator pack settles ``succeeded`` with ``job.completed``, having run in a sandbox
container of the docker backend, which the worker reached through the Podman socket
mounted into its pod as the chart mounts the node's engine socket. Everything played is
removed afterwards (``podman kube down``), whatever failed.

Values, not template edits, adapt the install to this host: the engine socket's path,
the work directory's node path (a temporary directory), the pack archives and the job's
workspace as ``extraVolumes`` (``ACPW_PACKS_DIR``, ``ACPW_LOCAL_WORKSPACE_ROOTS``), the
emulator's dummy key as an ``extraEnv``.

What ``podman kube play`` (4.3) is given: the Deployments and the ConfigMap (and a Secret
or PersistentVolumeClaim when the profile renders one). Left out, as kube play does not
take them: the Services (the dev Redis's and the metrics one), the ServiceAccount and the
worker's NetworkPolicy.
Changed in the rendered manifests to suit Podman, and only this (``_for_podman``):

1. ``hostPort`` on every ``containerPort``, each a free port: Podman 4.3 publishes a
   container port on the same host port when none is given (a kubelet publishes none),
   which collides with the host's own Redis on 6379.
2. ``hostAliases`` on the worker pod: the dev Redis Service's name to the Redis pod's
   address, what the left-out Service and cluster DNS would resolve.
3. The node's ``/proc`` mounted at ``/proc`` in the worker container, because Podman 4.3
   ignores ``hostPID`` (supported from 4.5, containers/podman#17168): the worker then
   sees each sandbox's ``/proc/<pid>/root`` and cgroups as with the node's pid
   namespace. Not emulated: signals sent by pid stay in the pod's namespace, so the lease
   watchdog's kill (only when a lease lapses) is not exercised here.
4. The liveness probe's ``httpGet`` as an ``exec`` of the image's Python fetching the same
   path and port: Podman 4.3 runs an ``httpGet`` probe as ``curl`` inside the container
   (containers/podman#15958), and the worker image has no curl; a kubelet makes the
   request itself. (Podman runs an exec probe as one shell command, its words joined.)

Slow on a fresh clone (the wheels from PyPI, the sandbox base image, the worker image
build: about 3 minutes, most of it once per machine), so not part of ``make test``:
``make chart-podman`` runs it (docs/helm.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import helm_python as helm
import pytest
import yaml

from tests.integration.docker_engine import base_image, docker_host, engine_config
from worker.sandbox.base import LABEL_JOB

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "acp-worker"
RELEASE, NAMESPACE = "acpwct", "acp-system"
WORKER_TAG = "localhost/acp-worker:chart-podman-test"
REDIS_TAG = "localhost/acpw-chart-dev-redis:test"
KUBE_PLAY_KINDS = frozenset({"Deployment", "ConfigMap", "Secret", "PersistentVolumeClaim"})
LEFT_OUT = frozenset({"Service", "ServiceAccount", "NetworkPolicy"})
EMULATOR_KEY = "emulator-demo-key-not-a-real-secret"  # what examples/secrets holds
READY_WITHIN_S = 90.0
# The job's own limit is 60 s; past this, it is stuck (e.g. lost: a lease TTL, then a reap).
SUBMIT_TIMEOUT_S = 180.0
# A Redis for the dev Redis Deployment, FROM the sandbox base image (Debian 12) with
# Debian's redis .debs fetched by apt on the host: no registry is reachable here. It runs
# as the uid the chart's dev Redis asks for (999), in /data.
REDIS_CONTAINERFILE = """\
ARG BASE
FROM ${BASE}
USER 0:0
COPY debs/ /tmp/debs/
RUN export PATH="/usr/local/sbin:/usr/sbin:/sbin:$PATH" \\
    && dpkg -i /tmp/debs/lib*.deb \\
    && dpkg-deb -x /tmp/debs/redis-tools_*.deb / \\
    && ln -s redis-check-rdb /usr/bin/redis-server \\
    && rm -rf /tmp/debs && mkdir /data && chown 999:999 /data
USER 999:999
WORKDIR /data
CMD ["redis-server"]
"""
REDIS_DEBS = ("redis-tools", "libjemalloc2", "liblzf1", "libatomic1")


def _podman(host: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--remote", "--url", host, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _by_digest(client: docker.DockerClient, image_id: str) -> str:
    digests = client.images.get(image_id).attrs.get("RepoDigests") or []
    assert digests, f"the image {image_id} has no digest reference"
    return str(digests[0])


@pytest.fixture(scope="module")
def client(docker_host: str) -> Iterator[docker.DockerClient]:
    made = docker.DockerClient(base_url=docker_host, timeout=300)
    yield made
    made.close()


@pytest.fixture(scope="module")
def worker_ref(client: docker.DockerClient, base_image: str) -> str:
    """The worker image (the Dockerfile, built offline by scripts/worker-image.sh)."""
    previous = _image_id(client, WORKER_TAG)
    started = time.monotonic()
    done = subprocess.run(
        [REPO / "scripts" / "worker-image.sh"],
        env={**os.environ, "BASE": base_image.removeprefix("sha256:"), "TAG": WORKER_TAG},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"worker image built in {time.monotonic() - started:.1f} s")
    image_id = done.stdout.strip()
    if previous not in (None, image_id):  # our own earlier build, now untagged
        with contextlib.suppress(docker.errors.APIError):  # still used: leave it
            client.api.remove_image(previous)
    return _by_digest(client, image_id)


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return str(client.api.inspect_image(ref)["Id"])
    except docker.errors.ImageNotFound:
        return None


@pytest.fixture(scope="module")
def redis_ref(
    client: docker.DockerClient, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """A Redis image for the dev Redis Deployment (see REDIS_CONTAINERFILE)."""
    context = tmp_path_factory.mktemp("dev-redis")
    (context / "debs").mkdir()
    fetched = subprocess.run(
        ["apt-get", "download", *REDIS_DEBS],
        cwd=context / "debs",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    (context / "Containerfile").write_text(REDIS_CONTAINERFILE)
    image, _ = client.images.build(
        path=str(context),
        dockerfile="Containerfile",
        tag=REDIS_TAG,
        buildargs={"BASE": base_image},
        network_mode="none",
        pull=False,
        rm=True,
    )
    return _by_digest(client, str(image.id))


# --- rendering ----------------------------------------------------------------------------


def _values(docker_host: str, worker_ref: str, redis_ref: str, tmp_path: Path) -> dict[str, Any]:
    """values-single-node.yaml, the dev Redis, and what differs on this host (values only)."""
    socket_path = docker_host.removeprefix("unix://")
    values = helm.values_from_yaml((CHART / "values-single-node.yaml").read_text())
    values["image"] = {"ref": worker_ref}
    values["devRedis"] = {"enabled": True, "image": redis_ref}
    values["sandbox"]["docker"] = {
        "host": docker_host,
        "socketHostPath": socket_path,
        "workHostPath": str(tmp_path / "jobs"),
    }
    values["env"] = {
        "ACPW_PACKS_DIR": "/packs",
        "ACPW_LOCAL_WORKSPACE_ROOTS": '["/workspaces"]',
    }
    values["extraEnv"] = [{"name": "EMULATOR_API_KEY", "value": EMULATOR_KEY}]
    values["extraVolumes"] = [
        {"name": "packs", "hostPath": {"path": str(REPO / "provider_packs"), "type": "Directory"}},
        {"name": "workspaces", "hostPath": {"path": str(tmp_path / "ws"), "type": "Directory"}},
    ]
    values["extraVolumeMounts"] = [
        {"name": "packs", "mountPath": "/packs", "readOnly": True},
        {"name": "workspaces", "mountPath": "/workspaces", "readOnly": True},
    ]
    return dict(values)


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def _pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


# --- the changes made for Podman (the module docstring's list) -----------------------------


def _publish_on_free_ports(deployment: dict[str, Any]) -> dict[str, int]:
    """Change 1: a free ``hostPort`` for every container port; {port name: host port}."""
    published: dict[str, int] = {}
    for container in _pod_spec(deployment)["containers"]:
        for port in container.get("ports", []):
            port["hostPort"] = published[port["name"]] = _free_port()
    return published


def _resolve_service(worker: dict[str, Any], service: str, address: str) -> None:
    """Change 2: the Service's name resolves to the pod behind it."""
    _pod_spec(worker)["hostAliases"] = [{"ip": address, "hostnames": [service]}]


def _host_proc(worker: dict[str, Any]) -> None:
    """Change 3: the node's /proc in the worker container, for Podman 4.3's ignored hostPID."""
    spec = _pod_spec(worker)
    assert spec["hostPID"] is True  # what the chart asks for, and Podman 4.3 drops
    spec["volumes"].append({"name": "podman-host-proc", "hostPath": {"path": "/proc"}})
    (container,) = spec["containers"]
    container["volumeMounts"].append({"name": "podman-host-proc", "mountPath": "/proc"})


def _liveness_without_curl(worker: dict[str, Any]) -> None:
    """Change 4: the liveness probe's GET made by the image's Python, not Podman's curl."""
    (container,) = _pod_spec(worker)["containers"]
    probe = container["livenessProbe"]
    get = probe.pop("httpGet")
    url = f"http://127.0.0.1:{get['port']}{get['path']}"
    # Podman joins an exec probe's words with spaces into a shell command (`… || exit 1`),
    # so the script is one single-quoted shell word.
    fetch = f"""'__import__("urllib.request").request.urlopen("{url}",timeout=5)'"""
    probe["exec"] = {"command": ["python3", "-c", fetch]}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
    except OSError as exc:
        return 0, repr(exc)


# --- playing ------------------------------------------------------------------------------


class Played:
    """The kube files played, for ``podman kube down`` of each whatever happens."""

    def __init__(self, host: str, directory: Path) -> None:
        self.host, self.directory = host, directory
        self.files: list[Path] = []

    def play(self, name: str, docs: list[dict[str, Any]]) -> list[str]:
        """Plays ``docs``; the ids of the containers made (infra containers aside)."""
        path = self.directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        self.files.append(path)
        played = _podman(self.host, "kube", "play", str(path), timeout=300)
        assert played.returncode == 0, played.stderr + played.stdout
        lines = played.stdout.split()
        return [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "Container:"]

    def down(self) -> list[str]:
        errors = []
        for path in reversed(self.files):
            done = _podman(self.host, "kube", "down", str(path))
            if done.returncode != 0:
                errors.append(done.stderr)
        return errors


def _pod_address(host: str, container: str) -> str:
    """The address of ``container``'s pod on its network (its infra container's)."""
    inspected = json.loads(_podman(host, "inspect", container).stdout)[0]
    pod = json.loads(_podman(host, "pod", "inspect", inspected["Pod"]).stdout)
    infra = json.loads(_podman(host, "inspect", pod["InfraContainerID"]).stdout)[0]
    (network,) = infra["NetworkSettings"]["Networks"].values()
    return str(network["IPAddress"])


def _wait_ready(url: str) -> tuple[int, str]:
    """GETs the readiness probe's URL until it answers 200 (or time's up)."""
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        status, body = _get(url)
        if status == 200 or time.monotonic() > deadline:
            return status, body
        time.sleep(1)


def _remove_sandboxes(host: str, job_id: str) -> None:
    """Sandbox containers of this test's job the worker could not remove (a failed run)."""
    listed = _podman(host, "ps", "-aq", "--filter", f"label={LABEL_JOB}={job_id}")
    for container in listed.stdout.split():
        _podman(host, "rm", "--force", "--time", "0", container)


def _submit(redis_url: str, job: Path) -> list[dict[str, Any]]:
    """``acp-worker submit --follow --json`` from the host: every line it printed."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "acp-worker"),
            "submit",
            "--follow",
            "--json",
            "--redis",
            redis_url,
            str(job),
        ],
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _job(tmp_path: Path, job_id: str) -> Path:
    path = tmp_path / "job.json"
    spec = {
        "v": 1,
        "job_id": job_id,
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "/workspaces/hello"},
        "prompt": "scenario: hello",
        "credentials": {"CURSOR_API_KEY": "env:EMULATOR_API_KEY"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "cpus": 1, "pids": 128},
        "network": {"mode": "none"},
    }
    path.write_text(json.dumps(spec))
    return path


def test_the_single_node_install_runs_a_job_under_kube_play(
    docker_host: str, worker_ref: str, redis_ref: str, tmp_path: Path
) -> None:
    shutil.copytree(REPO / "examples" / "hello-workspace", tmp_path / "ws" / "hello")
    docs = _render(_values(docker_host, worker_ref, redis_ref, tmp_path))
    played_docs = [doc for doc in docs if doc["kind"] in KUBE_PLAY_KINDS]
    assert {doc["kind"] for doc in docs} - KUBE_PLAY_KINDS == LEFT_OUT
    redis_name = f"{RELEASE}-acp-worker-dev-redis"
    (redis,) = [d for d in played_docs if d["metadata"]["name"] == redis_name]
    (worker,) = [d for d in played_docs if d["metadata"]["name"] == f"{RELEASE}-acp-worker"]
    rest = [d for d in played_docs if d is not redis]
    redis_port = _publish_on_free_ports(redis)["redis"]
    worker_ports = _publish_on_free_ports(worker)
    _host_proc(worker)
    _liveness_without_curl(worker)
    (ready_get,) = [c["readinessProbe"]["httpGet"] for c in _pod_spec(worker)["containers"]]
    (metrics,) = [
        p for c in _pod_spec(worker)["containers"] for p in c["ports"]
        if p["containerPort"] == ready_get["port"]
    ]  # fmt: skip
    ready_url = f"http://127.0.0.1:{worker_ports[metrics['name']]}{ready_get['path']}"
    job_id = f"chart-podman-{uuid.uuid4().hex[:12]}"
    played = Played(docker_host, tmp_path)
    try:
        (redis_container,) = played.play("dev-redis", [redis])
        _resolve_service(worker, redis_name, _pod_address(docker_host, redis_container))
        (worker_container,) = played.play("worker", rest)
        status, body = _wait_ready(ready_url)
        # Not ready, no job: a worker that cannot reach its backend would not settle it.
        assert status == 200, body
        assert json.loads(body) == {"redis": "ok", "backend": "ok", "ready": True}
        health = _podman(docker_host, "healthcheck", "run", worker_container)
        lines = _submit(f"redis://127.0.0.1:{redis_port}/0", _job(tmp_path, job_id))
        logs = _podman(docker_host, "logs", "--tail", "60", worker_container)
    finally:
        errors = played.down()
        _remove_sandboxes(docker_host, job_id)
    assert health.returncode == 0, health.stdout + health.stderr  # the liveness probe's check
    events = [line["event"] for line in lines if "event" in line]
    types = [event["type"] for event in events]
    context = "\n".join(types) + logs.stdout[-3000:] + logs.stderr[-3000:]
    assert types[-1] == "job.completed", context
    assert events[-1]["data"]["status"] == "succeeded", context
    (sandbox,) = [event["data"] for event in events if event["type"] == "sandbox.ready"]
    assert sandbox["backend"] == "docker"
    said = "".join(
        e["data"]["text"] for e in events if e["type"] == "message.delta"
        and e["data"]["role"] == "assistant"
    )  # fmt: skip
    assert "README.md" in said  # the agent read the workspace through its sandbox
    assert not errors, errors
    for pod in (f"{redis_name}-pod-0", f"{RELEASE}-acp-worker-pod-0"):  # Podman's names
        assert _podman(docker_host, "pod", "exists", pod).returncode == 1  # removed
