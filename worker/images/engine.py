"""The container engine connection and its error seam.

Everything that talks to a Docker-API engine (Docker, or Podman's compatible service)
goes through :func:`connect` and :func:`translate`: docker SDK and transport exceptions
become :class:`~worker.errors.SandboxError` here, with the action that failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from worker.errors import SandboxError, WorkerError

if TYPE_CHECKING:
    import docker

APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


def host_apt_mirror(sources: tuple[Path, ...] = APT_SOURCES) -> str:
    """The first Debian mirror this host's apt is configured with (deb822 or one-line).

    Raises:
        SandboxError: no apt source is configured (set ``ACPW_APT_MIRROR``).
    """
    for path in sources:
        files = sorted(path.glob("*.sources")) if path.is_dir() else [path]
        for file in files:
            mirror = _first_uri(file)
            if mirror:
                return mirror
    raise SandboxError("no apt mirror configured on this host; set ACPW_APT_MIRROR")


def _first_uri(file: Path) -> str | None:
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        if not words or words[0] not in ("URIs:", "deb"):
            continue
        uri = next((w for w in words[1:] if "://" in w), None)
        if uri and "security" not in uri:
            return uri
    return None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Container engine and image settings (from the docker backend's config,
    ``worker.sandbox.config.DockerConfig.engine``).

    ``docker_host``: the engine's URL; None means the SDK's default (``DOCKER_HOST``).
    ``images_dir``: where base-image rootfs tarballs and image pins are cached.
    ``apt_mirror`` / ``suite``: where ``mmdebstrap`` fetches the base rootfs from.
    ``registry``: push pack images there (``image build``) and pull missing ones back
    from there (``resolve``); None: neither. Whether it is reached over TLS is the
    engine's configuration.
    """

    docker_host: str | None
    images_dir: Path
    apt_mirror: str = field(default_factory=host_apt_mirror)
    suite: str = "bookworm"
    registry: str | None = None


def connect(config: EngineConfig) -> docker.DockerClient:
    """A client for the configured engine, checked with one ping.

    Raises:
        SandboxError: the docker SDK is missing or the engine does not answer.
    """
    try:
        import docker
    except ImportError as exc:
        raise SandboxError(
            "the docker backend needs the `docker` extra (pip install 'acp-worker[docker]')"
        ) from exc
    with translate("connect"):
        if config.docker_host:
            client = docker.DockerClient(base_url=config.docker_host, timeout=120)
        else:
            client = docker.from_env(timeout=120)
        client.ping()
    return client


@contextlib.contextmanager
def translate(action: str, **context: object) -> Iterator[None]:
    """docker SDK, HTTP and socket errors become SandboxError naming ``action``."""
    import docker.errors
    import requests

    try:
        yield
    except WorkerError:
        raise
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"container engine: {action} failed: {_explain(exc)}", action=action, **context
        ) from exc
    except (requests.RequestException, OSError) as exc:
        raise SandboxError(
            f"container engine: {action} failed: {exc}", action=action, **context
        ) from exc


def _explain(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc)
