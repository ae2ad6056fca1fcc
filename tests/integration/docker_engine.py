"""Fixtures for tests that need a real container engine (Podman's Docker API).

``docker_host`` starts the service with ``scripts/podman-service.sh`` once per session
and stops it afterwards (unless it was already running). When Podman is not installed
the tests skip with the reason, except in CI (``CI=true``), where they fail. A service
that is installed but cannot start always fails.

The image store and the base image cache outlive the session on purpose: the base
image (≈ 70 s to make) is built once per machine; ``scripts/podman-service.sh purge``
drops it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.images.build import PackImages
from worker.images.engine import EngineConfig, connect

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "scripts" / "podman-service.sh"
IMAGES_DIR = Path(os.environ.get("ACPW_TEST_IMAGES_DIR", "/var/tmp/acpw-test-images"))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"container engine required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    """``unix://…`` of a running Podman Docker-API service."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        _unavailable("podman/runc not installed (apt-get install podman runc catatonit)")
    was_running = subprocess.run([SERVICE, "status"], capture_output=True).returncode == 0
    done = subprocess.run([SERVICE, "start"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"podman service did not start: {done.stderr[-2000:]}")
    host = done.stdout.strip().removeprefix("DOCKER_HOST=")
    yield host
    if not was_running:
        subprocess.run([SERVICE, "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def engine_config(docker_host: str) -> EngineConfig:
    return EngineConfig(docker_host=docker_host, images_dir=IMAGES_DIR)


@pytest.fixture(params=["local", "docker", "daytona", "kubernetes"])
def job_backend(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The environment that makes ``acp-worker run`` use each backend in turn: nothing
    for ``local``; for ``docker``, the engine and image store of these fixtures (the
    base image built first); for ``daytona``, the Daytona double served from a thread
    (``daytona_thread``), with the job's pack cache as its registry; for ``kubernetes``,
    the API double (``tests/k8s_double``), its pods on the same engine."""
    if request.param == "local":
        yield {}
        return
    if request.param == "kubernetes":
        yield from _kubernetes(request)
        return
    if request.param == "daytona":
        from tests.integration.daytona_thread import double_in_thread  # the SDK: only here

        tmp_path: Path = request.getfixturevalue("tmp_path")
        with double_in_thread(tmp_path / "daytona", tmp_path / "cache") as env:
            yield env
        return
    config: EngineConfig = request.getfixturevalue("engine_config")
    request.getfixturevalue("base_image")
    yield {
        "ACPW_BACKEND": "docker",
        "ACPW_DOCKER_HOST": str(config.docker_host),
        "ACPW_IMAGES_DIR": str(config.images_dir),
    }


@pytest.fixture(scope="session")
def base_image(engine_config: EngineConfig) -> str:
    """The base image id (built on first use on this machine: ≈ 70 s)."""
    images = PackImages(connect(engine_config), engine_config)
    return images.base_id(build=True)


def _kubernetes(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    from tests.k8s_double.fixtures import NAMESPACE
    from tests.k8s_double.server import ApiDouble

    config: EngineConfig = request.getfixturevalue("engine_config")
    request.getfixturevalue("base_image")
    tmp_path: Path = request.getfixturevalue("tmp_path")
    double = ApiDouble(str(config.docker_host))
    double.start()
    try:
        yield {
            "ACPW_BACKEND": "kubernetes",
            "ACPW_K8S_KUBECONFIG": str(
                double.kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
            ),
            "ACPW_K8S_NAMESPACE": NAMESPACE,
            "ACPW_DOCKER_HOST": str(config.docker_host),
            "ACPW_IMAGES_DIR": str(config.images_dir),
        }
    finally:
        double.close()
