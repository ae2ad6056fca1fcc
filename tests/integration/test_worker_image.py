"""The worker's own image (top-level ``Dockerfile``), built for real and run.

``scripts/worker-image.sh`` builds it offline through Podman FROM the sandbox base image
(by id), with the wheelhouse and layer cache of earlier runs (cold: about a minute;
warm: about 15 s). The containers run through Podman's Docker API; the health check is
the command the image declares, run without and with a route to the test Redis.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import REDIS_URL
from tests.integration.docker_engine import base_image, docker_host, engine_config

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/acp-worker:integration-test"
WORKER_UID = 10001


@pytest.fixture(scope="module")
def client(docker_host: str) -> Iterator[docker.DockerClient]:
    made = docker.DockerClient(base_url=docker_host, timeout=120)
    yield made
    made.close()


@pytest.fixture(scope="module")
def worker_image(client: docker.DockerClient, base_image: str) -> dict[str, Any]:
    """The image's attributes, built (or its cached layers reused) for this session."""
    previous = _image_id(client, TAG)
    started = time.monotonic()
    done = subprocess.run(
        [REPO / "scripts" / "worker-image.sh"],
        env={**os.environ, "BASE": base_image.removeprefix("sha256:"), "TAG": TAG},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"worker image built in {time.monotonic() - started:.1f} s")
    image_id = done.stdout.strip()
    if previous not in (None, image_id):  # our own earlier build, now untagged
        with contextlib.suppress(docker.errors.APIError):  # still used: leave it
            client.api.remove_image(previous)
    attrs: dict[str, Any] = client.api.inspect_image(image_id)
    return attrs


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return str(client.api.inspect_image(ref)["Id"])
    except docker.errors.ImageNotFound:
        return None


def _health_check(client: docker.DockerClient, attrs: dict[str, Any]) -> Any:
    """The image's HEALTHCHECK: Docker's inspect has it in Config; Podman 4.3's
    Docker-compatible inspect drops it, its own (libpod) inspect has it."""
    if "Healthcheck" in attrs["Config"]:
        return attrs["Config"]["Healthcheck"]
    url = f"{client.api.base_url}/v4.0.0/libpod/images/{attrs['Id']}/json"
    response = client.api.get(url)
    response.raise_for_status()
    return response.json()["Healthcheck"]


def _run(
    client: docker.DockerClient,
    image: str,
    command: list[str],
    *,
    network: str = "none",
    entrypoint: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    container = client.containers.create(
        image,
        command,
        entrypoint=entrypoint,
        environment=env or {},
        network_mode=network,
    )
    try:
        container.start()
        code = int(container.wait(timeout=60)["StatusCode"])
        return code, container.logs().decode()
    finally:
        container.remove(force=True)


def test_the_image_is_non_root_with_a_health_check_and_the_cli_as_entrypoint(
    client: docker.DockerClient, worker_image: dict[str, Any], base_image: str
) -> None:
    config = worker_image["Config"]
    assert config["User"] == f"{WORKER_UID}:{WORKER_UID}"
    assert config["Entrypoint"] == ["acp-worker"]
    assert config["Cmd"] == ["serve"]
    health = _health_check(client, worker_image)
    assert health["Test"] == ["CMD", "acp-worker", "ready"]
    assert health["Interval"] == 30 * 10**9
    # FROM the base pinned by id: the base's layers are the image's first layers.
    base_layers = client.api.inspect_image(base_image)["RootFS"]["Layers"]
    assert worker_image["RootFS"]["Layers"][: len(base_layers)] == base_layers
    assert config["Env"].count("ACPW_PACKS_DIR=/opt/acp-worker/provider_packs") == 1
    # Non-root cannot loop-mount the per-job disk: the image says so instead of failing jobs.
    assert "ACPW_WORKSPACE_DISK=off" in config["Env"]


def test_the_cli_runs_as_the_worker_user_from_the_locked_venv(
    client: docker.DockerClient, worker_image: dict[str, Any]
) -> None:
    code, out = _run(client, worker_image["Id"], ["--help"])
    assert code == 0, out
    assert out.startswith("usage: acp-worker")
    assert "pack" in out
    assert "ready" in out

    probe = (
        "id -u; id -g; python3 -c 'import sys; print(sys.version.split()[0])';"
        " command -v acp-worker; command -v bwrap;"
        " touch /opt/acpw/x 2>/dev/null && echo venv-writable;"
        " ls /opt/acpw/share/acp-worker/images; ls /opt/acp-worker/provider_packs/cursor-emulator"
    )
    code, out = _run(client, worker_image["Id"], ["-c", probe], entrypoint=["/bin/sh"])
    assert code == 0, out
    assert out.split() == [
        str(WORKER_UID),
        str(WORKER_UID),
        "3.11.2",  # Debian 12's, as the lock was compiled for
        "/opt/acpw/bin/acp-worker",
        "/usr/bin/bwrap",
        "base.Containerfile",
        "pack.Containerfile",
        "lock",
        "pack.json",
    ]


def test_the_health_check_passes_only_when_redis_answers(
    client: docker.DockerClient, worker_image: dict[str, Any]
) -> None:
    test = _health_check(client, worker_image)["Test"]
    assert test[0] == "CMD"
    check = test[1:]
    env = {"ACPW_REDIS_URL": REDIS_URL}

    code, out = _run(client, worker_image["Id"], check[1:], entrypoint=check[:1], env=env)
    assert code == 1, out  # no network at all: Redis cannot answer
    assert "NOT ready: redis error: ConnectionError" in out

    code, out = _run(
        client, worker_image["Id"], check[1:], entrypoint=check[:1], env=env, network="host"
    )
    assert code == 0, out  # the host's network: the test Redis on 127.0.0.1 answers
    # Which Redis and how it was reached (no secret: the test URL carries none).
    assert out.strip() == f"ready: redis ok ({REDIS_URL}, no TLS), backend ok"

    code, out = _run(client, worker_image["Id"], check[1:], entrypoint=check[:1])
    assert code == 1, out  # no Redis configured is not healthy either
    assert "no Redis configured" in out


def test_serve_imports_celery_with_the_images_time_zone_data(
    client: docker.DockerClient, worker_image: dict[str, Any]
) -> None:
    """Celery's kombu loads the UTC zone when imported: the locally built base has no
    /usr/share/zoneinfo, and without the locked tzdata wheel `serve` died right there
    (found by tests/integration/test_chart_podman.py)."""
    python = "/opt/acpw/bin/python"
    code, out = _run(
        client, worker_image["Id"], ["-c", "import celery.worker.control"], entrypoint=[python]
    )
    assert code == 0, out
