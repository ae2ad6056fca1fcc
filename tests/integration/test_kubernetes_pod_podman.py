"""The generated sandbox pod runs for real, and its security context holds inside it.

There is no Kubernetes API server on this machine (nor in CI): ``podman kube play`` runs
the pod spec ``sandbox_pod`` builds, on the shared Podman service of the docker tests,
with the sandbox base image (built locally from its rootfs; no registry is reached) named
by digest as the backend names pack images. The container runs a probe instead of the
agent, and what it prints is checked: uid/gid 1000, a read-only root (written where its
permissions alone would allow it, and mounted ``ro``), a writable workspace, HOME and
/tmp, no effective capability, no_new_privs, a seccomp filter, the working directory,
the pod's hostname and its memory limit. The pod is removed afterwards, whatever failed.

Podman 4.3 refuses annotation values longer than 63 characters (a Kubernetes *label*
limit; annotations may hold 256 KiB), so the one long annotation (the exact labels) is
left out of what podman is given; nothing else is changed. Podman also keeps emptyDirs
on disk whatever their ``medium`` and ignores their ``sizeLimit``: those two are checked
only against the schemas (tests/unit/test_kubernetes_manifests.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from worker.sandbox.base import SANDBOX_GID, SANDBOX_UID, ResourceLimits, SandboxSpec
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes import manifests

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = pytest.mark.integration

MEMORY = 384 * 1024 * 1024
# One line per fact, `name=value`; every command's failure is reported, not fatal.
PROBE = r"""
echo "uid=$(id -u)"
echo "gid=$(id -g)"
# /var/tmp is world-writable in the image: only a read-only root refuses this write.
if touch /var/tmp/probe 2>/dev/null; then echo root=writable; else echo root=readonly; fi
awk '$5 == "/" { print "root_mount=" $6 }' /proc/self/mountinfo
for d in /workspace /home/agent /tmp; do
  if echo x >"$d/probe" && [ "$(cat "$d/probe")" = x ]; then
    echo "$d=writable"
  else
    echo "$d=readonly"
  fi
done
sed -n 's/^\(CapEff\|NoNewPrivs\|Seccomp\):[[:space:]]*/\1=/p' /proc/self/status
echo "hostname=$(hostname)"
echo "cwd=$(pwd)"
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do
  [ -r "$f" ] && echo "memory=$(cat "$f")" && break
done
"""


def _podman(host: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--remote", "--url", host, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _by_digest(host: str, image_id: str) -> str:
    """``name@sha256:…`` of the image, as the backend names a pack image."""
    client = docker.DockerClient(base_url=host)
    try:
        digests = client.images.get(image_id).attrs.get("RepoDigests") or []
    finally:
        client.close()
    assert digests, f"the image {image_id} has no digest reference"
    return str(digests[0])


def _pod(image: str, tmp_path: Path) -> dict[str, Any]:
    spec = SandboxSpec(
        job_id="K8s_Probe.1",
        attempt=1,
        workspace=tmp_path,
        pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=MEMORY, cpus=0.5, pids=128),
        labels={"acpw.token": "7", "acpw.owner": "boot:4026531836:1:2"},
    )
    config = KubernetesConfig(worker_id="podman-test")
    return manifests.sandbox_pod(
        spec,
        image=image,
        config=config,
        # Stripped: podman 4.3 fails to parse a pod whose string starts with a newline.
        command=["/bin/sh", "-c", PROBE.strip()],
        deadline_s=60,
        disk_bytes=64 * 1024 * 1024,
    )


def _facts(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def test_the_sandbox_pod_runs_with_its_security_context(
    docker_host: str, base_image: str, tmp_path: Path
) -> None:
    pod = _pod(_by_digest(docker_host, base_image), tmp_path)
    annotations = pod["metadata"]["annotations"]
    del annotations[manifests.ANNOTATION_LABELS]  # see the module docstring
    name = pod["metadata"]["name"]
    container = f"{name}-{manifests.CONTAINER}"
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    try:
        played = _podman(docker_host, "kube", "play", str(path))
        assert played.returncode == 0, played.stderr
        waited = _podman(docker_host, "wait", container)
        assert waited.stdout.strip() == "0", waited.stderr
        logs = _podman(docker_host, "logs", container)
        facts = _facts(logs.stdout)
    finally:
        _podman(docker_host, "pod", "rm", "--force", name)
    assert (facts["uid"], facts["gid"]) == (str(SANDBOX_UID), str(SANDBOX_GID)), logs.stdout
    assert facts["root"] == "readonly"
    assert "ro" in facts["root_mount"].split(",")
    assert facts["/workspace"] == facts["/home/agent"] == facts["/tmp"] == "writable"
    assert int(facts["CapEff"], 16) == 0
    assert facts["NoNewPrivs"] == "1"
    assert facts["Seccomp"] == "2"  # a filter is installed (RuntimeDefault)
    assert facts["hostname"] == manifests.HOSTNAME
    assert facts["cwd"] == "/workspace"
    assert int(facts["memory"]) == MEMORY
    assert _podman(docker_host, "pod", "exists", name).returncode == 1  # removed
