"""pytest fixtures for the Kubernetes backend's tests (import them into a test module,
as ``tests/integration/docker_engine.py``'s are).

``cluster`` is the API double by default: a running ``ApiDouble`` per test whose pods
run on the shared Podman service. ``make test-k8s`` sets ``ACPW_TEST_KUBECONFIG`` (from
``KUBECONFIG``) to run the same tests against a real cluster instead; its nodes pull
images from ``ACPW_TEST_K8S_REGISTRY`` (required then), where the tests push them, and
its namespace is ``ACPW_TEST_K8S_NAMESPACE`` (default ``NAMESPACE``, which must exist
with the backend's Role bound to the kubeconfig's user: docs/kubernetes.md).

``cluster`` takes an indirect parameter: ``"v4"`` makes the double negotiate only
``v4.channel.k8s.io`` (no stdin half-close, as API servers before 1.30); a real cluster
negotiates what it speaks, so such a test is skipped there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from tests.k8s_double.server import V4, ApiDouble
from worker.images.engine import EngineConfig

NAMESPACE = "acpw-test-sandboxes"
#: The repository the tests tag images under (their own, so that a digest reference
#: exists whatever other tests do to the shared engine's tags).
REPOSITORY = "localhost/acpw-k8s-double"


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where the tests' pods run: the double (``double`` set) or a real cluster."""

    kubeconfig: Path
    namespace: str
    double: ApiDouble | None
    registry: str | None


def real_cluster() -> tuple[Path, str, str] | None:
    """(kubeconfig, namespace, registry) of the real cluster ``make test-k8s`` names."""
    kubeconfig = os.environ.get("ACPW_TEST_KUBECONFIG")
    if not kubeconfig:
        return None
    registry = os.environ.get("ACPW_TEST_K8S_REGISTRY")
    if not registry:
        pytest.fail(
            "a real cluster pulls pack images from a registry: set ACPW_TEST_K8S_REGISTRY "
            "to one its nodes can pull from (docs/kubernetes.md)"
        )
    namespace = os.environ.get("ACPW_TEST_K8S_NAMESPACE", NAMESPACE)
    return Path(kubeconfig), namespace, registry


@pytest.fixture
def k8s_double(docker_host: str) -> Iterator[ApiDouble]:
    """A running API double whose pods run on the shared Podman service."""
    double = ApiDouble(docker_host)
    double.start()
    try:
        yield double
    finally:
        double.close()


@pytest.fixture
def kubeconfig(k8s_double: ApiDouble, tmp_path: Path) -> Path:
    return k8s_double.kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)


@pytest.fixture
def cluster(request: pytest.FixtureRequest, docker_host: str, tmp_path: Path) -> Iterator[Cluster]:
    """The API double, or the real cluster of ``make test-k8s`` (parameter ``"v4"``: a
    double that negotiates only v4; skipped on a real cluster)."""
    v4 = getattr(request, "param", None) == "v4"
    real = real_cluster()
    if real is not None:
        if v4:
            pytest.skip("a real cluster negotiates the channel protocol it speaks")
        yield Cluster(real[0], real[1], None, real[2])
        return
    double = ApiDouble(docker_host, protocols=(V4,)) if v4 else ApiDouble(docker_host)
    double.start()
    try:
        path = double.kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
        yield Cluster(path, NAMESPACE, double, None)
    finally:
        double.close()


@pytest.fixture
def images(engine_config: EngineConfig, cluster: Cluster) -> EngineConfig:
    """The image engine, pushing to the real cluster's registry when there is one."""
    if cluster.registry is None:
        return engine_config
    return dataclasses.replace(engine_config, registry=cluster.registry)


def by_digest(docker_host: str, image_id: str, tag: str, registry: str | None = None) -> str:
    """``<repository>@sha256:…`` of ``image_id``, tagged ``<repository>:tag`` first (and
    pushed, with a ``registry``)."""
    repository = REPOSITORY if registry is None else f"{registry.rstrip('/')}/acpw-k8s-test"
    client = docker.DockerClient(base_url=docker_host)
    try:
        image = client.images.get(image_id)
        image.tag(repository, tag)
        if registry is not None:
            client.images.push(repository, tag)
            return f"{repository}@{client.images.get_registry_data(f'{repository}:{tag}').id}"
        image.reload()
        digests = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith(repository)]
    finally:
        client.close()
    assert digests, f"the image {image_id} has no digest reference"
    return str(digests[0])


@pytest.fixture(scope="session")
def base_by_digest(docker_host: str, base_image: str) -> str:
    """The sandbox base image, named by digest (pushed for a real cluster)."""
    real = real_cluster()
    return by_digest(docker_host, base_image, "base", None if real is None else real[2])
