"""``image build`` pushes to a registry and ``image resolve`` pulls back, for real.

The registry is the distribution v2 server from Debian's ``docker-registry`` package,
started on a free loopback port with its storage in a temp dir (not the system service).
It speaks plain HTTP, which Podman allows only for registries its ``registries.conf``
marks ``insecure``: the shared Podman service has no such file, and restarting it would
break other sessions' containers, so these tests start a second API service on a
private socket over the same image store, with a ``registries.conf`` naming only this
registry. Pack images here are made from a pack with random content, so every image and
tag these tests create is their own and is removed afterwards.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.docker_engine import _unavailable, base_image, docker_host, engine_config
from worker.cli import main

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

PODMAN_DIR = Path(os.environ.get("ACPW_PODMAN_DIR", "/var/tmp/acpw-podman"))
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(check: Any, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(100):
        if proc.poll() is not None:
            pytest.fail(f"{what} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=10)
    pytest.fail(f"{what} did not answer within 10 s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a private registry (storage in a temp dir)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        _unavailable("docker-registry not installed (apt-get install docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    address = f"127.0.0.1:{_free_port()}"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: {address}, secret: acpw-test-only}}\n"
    )
    log = root / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=out)
    _wait(lambda: _manifest_api_answers(address), "registry", proc, log)
    yield address
    _stop(proc)


def _manifest_api_answers(address: str) -> bool:
    with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as response:
        return bool(response.status == 200)


@pytest.fixture(scope="module")
def registry_engine(
    registry: str, docker_host: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A second Podman API service over the shared store that may use ``registry``."""
    root = tmp_path_factory.mktemp("podman-registry")
    (root / "registries.conf").write_text(
        f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n'
    )
    sock = root / "podman.sock"
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(PODMAN_DIR / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(PODMAN_DIR / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
        "TMPDIR": str(PODMAN_DIR / "tmp"),
    }
    log = root / "service.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{sock}"],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    _wait(lambda: _pings(sock), "podman service", proc, log)
    yield f"unix://{sock}"
    _stop(proc)


def _pings(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(2)
        conn.connect(str(sock))
        conn.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        return conn.recv(64).split(b" ")[1:2] == [b"200"]


@pytest.fixture
def client(registry_engine: str) -> Iterator[docker.DockerClient]:
    made = docker.DockerClient(base_url=registry_engine, timeout=120)
    yield made
    made.close()


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    """A pack whose closure exists nowhere else: random bytes, so a new identity."""
    pack_dir = tmp_path / "packs" / "pushed"
    (pack_dir / "dist").mkdir(parents=True)
    manifest = {
        "schema": 1,
        "name": "pushed",
        "version": "1.0.0",
        "provider": "cursor",
        "dialect": "acp",  # a toy agent, not under the cursor launch contract
        "launch": {"argv": ["{pack}/agent"]},
    }
    (pack_dir / "pack.json").write_text(json.dumps(manifest))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(50_000)
        info = tarfile.TarInfo("agent")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    (pack_dir / "dist" / "agent.tar").write_bytes(buf.getvalue())
    archive = str(pack_dir / "dist" / "agent.tar")
    assert main(["pack", "lock", archive, "--pack", str(pack_dir), "--platform", "any"]) == 0
    return pack_dir


@pytest.fixture
def worker_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, registry: str, registry_engine: str
) -> None:
    """What a worker configured with the registry has (``Settings`` reads ACPW_*)."""
    monkeypatch.setenv("ACPW_DOCKER_HOST", registry_engine)
    monkeypatch.setenv("ACPW_IMAGE_REGISTRY", registry)
    monkeypatch.setenv("ACPW_IMAGES_DIR", str(tmp_path / "images"))
    monkeypatch.setenv("ACPW_CACHE_DIR", str(tmp_path / "cache"))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out if code == 0 else captured.err)
    return code, report


def _manifest(registry: str, name: str, reference: str) -> tuple[str, bytes]:
    request = urllib.request.Request(
        f"http://{registry}/v2/{name}/manifests/{reference}",
        headers={"Accept": ", ".join(MANIFEST_TYPES)},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"]), response.read()


@pytest.fixture
def built(
    worker_env: None,
    pack: Path,
    client: docker.DockerClient,
    registry: str,
    capsys: pytest.CaptureFixture[str],
) -> Iterator[dict[str, Any]]:
    """``image build PACK`` with the registry configured; its report. Afterwards, every
    local tag naming the registry is dropped and the pack image removed."""
    code, report = _cli(capsys, "image", "build", str(pack))
    assert code == 0, report
    yield report
    for image in client.images.list():
        for tag in image.tags:
            if tag.startswith(f"{registry}/"):
                client.api.remove_image(tag)  # untags; deletes only an image of ours
    if any(i.id == report["image_id"] for i in client.images.list()):
        client.api.remove_image(report["image_id"], force=True)


def _push_base_as(client: docker.DockerClient, base_id: str, repository: str, tag: str) -> None:
    assert client.images.get(base_id).tag(repository, tag)
    out = client.images.push(repository, tag=tag)
    assert "errorDetail" not in out, out


@pytest.mark.usefixtures("base_image")
def test_build_pushes_and_the_registry_holds_exactly_the_pinned_image(
    built: dict[str, Any], registry: str, client: docker.DockerClient
) -> None:
    pushed = built["pushed"]
    assert pushed["repository"] == f"{registry}/acpw-pack"
    assert pushed["tag"] == built["identity"].removeprefix("sha256:")
    assert pushed["reference"] == f"{registry}/acpw-pack@{pushed['digest']}"

    digest, body = _manifest(registry, "acpw-pack", pushed["tag"])
    assert digest == pushed["digest"]
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    manifest = json.loads(body)
    assert manifest["config"]["digest"] == built["image_id"]  # the image id is the pin
    base_layers = client.api.inspect_image(built["base_id"])["RootFS"]["Layers"]
    assert len(manifest["layers"]) == len(base_layers) + 1
    assert _manifest(registry, "acpw-pack", digest) == (digest, body)  # by digest too


@pytest.mark.usefixtures("base_image")
def test_resolve_on_an_engine_without_the_image_pulls_it_back_by_digest(
    built: dict[str, Any],
    pack: Path,
    registry: str,
    client: docker.DockerClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Another image under the pushed tag: only a pull by digest still gets the pin.
    _push_base_as(client, built["base_id"], built["pushed"]["repository"], built["pushed"]["tag"])
    client.api.remove_image(f"{built['pushed']['repository']}:{built['pushed']['tag']}")
    client.api.remove_image(built["image_id"], force=True)  # the engine forgets it
    with pytest.raises(docker.errors.ImageNotFound):
        client.api.inspect_image(built["tag"])

    code, report = _cli(capsys, "image", "resolve", str(pack))

    assert code == 0, report
    assert report["image_id"] == built["image_id"]
    assert report["pushed"] == built["pushed"]
    pulled = client.api.inspect_image(built["tag"])
    assert pulled["Id"] == built["image_id"]
    assert pulled["Config"]["Labels"]["acpw.image.identity"] == built["identity"]


@pytest.mark.usefixtures("base_image")
def test_without_a_recorded_digest_a_retagged_image_is_refused(
    built: dict[str, Any],
    pack: Path,
    registry: str,
    client: docker.DockerClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    repository, tag = built["pushed"]["repository"], built["pushed"]["tag"]
    _push_base_as(client, built["base_id"], repository, tag)  # the tag now names the base
    client.api.remove_image(f"{repository}:{tag}")
    client.api.remove_image(built["image_id"], force=True)
    monkeypatch.setenv("ACPW_IMAGES_DIR", str(tmp_path / "fresh-images"))  # no pins

    code, report = _cli(capsys, "image", "resolve", str(pack))

    assert code == 3
    assert report["error"]["code"] == "image_mismatch"
    with pytest.raises(docker.errors.ImageNotFound):
        client.api.inspect_image(built["tag"])  # never tagged as the identity
