"""pytest fixtures for the API double (import them into a test module, as
``tests/integration/docker_engine.py``'s are): a running double per test, its
kubeconfig, and images named by digest under this suite's own repository name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.k8s_double.server import ApiDouble

NAMESPACE = "acpw-test-sandboxes"
#: The repository the double's tests tag images under (their own, so that a digest
#: reference exists whatever other tests do to the shared engine's tags).
REPOSITORY = "localhost/acpw-k8s-double"


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


def by_digest(docker_host: str, image_id: str, tag: str) -> str:
    """``REPOSITORY@sha256:…`` of ``image_id``, tagged ``REPOSITORY:tag`` first."""
    client = docker.DockerClient(base_url=docker_host)
    try:
        image = client.images.get(image_id)
        image.tag(REPOSITORY, tag)
        image.reload()
        digests = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith(REPOSITORY)]
    finally:
        client.close()
    assert digests, f"the image {image_id} has no digest reference"
    return str(digests[0])


@pytest.fixture(scope="session")
def base_by_digest(docker_host: str, base_image: str) -> str:
    """The sandbox base image, named by digest."""
    return by_digest(docker_host, base_image, "base")
