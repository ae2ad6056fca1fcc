"""The backends this worker knows, by name: which config class and which backend class.

Backend modules are imported only when one is built (``get_backend``): their SDKs are
optional extras. ``BACKENDS`` (what settings and ``run --backend`` may name) leaves the
``fake`` test double out, so a deployment cannot select it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from worker.errors import InvalidInput, SandboxError
from worker.sandbox.config import (
    AnyBackendConfig,
    DaytonaConfig,
    DockerConfig,
    FakeConfig,
    KubernetesConfig,
    LocalConfig,
)

if TYPE_CHECKING:
    from worker.sandbox.base import SandboxBackend
    from worker.sandbox.config import BackendConfig
    from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """One backend: its config class and where its backend class lives
    (``module:Class``, constructed as ``Class(config)``)."""

    config: type[AnyBackendConfig]
    backend: str
    selectable: bool = True


REGISTRY: dict[str, BackendEntry] = {
    "local": BackendEntry(LocalConfig, "worker.sandbox.local:LocalBackend"),
    "docker": BackendEntry(DockerConfig, "worker.sandbox.docker:DockerBackend"),
    "kubernetes": BackendEntry(
        KubernetesConfig, "worker.sandbox.kubernetes.backend:KubernetesBackend"
    ),
    "daytona": BackendEntry(DaytonaConfig, "worker.sandbox.daytona:DaytonaBackend"),
    "fake": BackendEntry(FakeConfig, "worker.sandbox.fake:FakeBackend", selectable=False),
}

#: The names settings (``ACPW_BACKEND``, ``ACPW_REAP_BACKENDS``) and ``run --backend`` accept.
BACKENDS: tuple[str, ...] = tuple(name for name, entry in REGISTRY.items() if entry.selectable)


def backend_config(settings: Settings, name: str | None = None) -> BackendConfig:
    """The config of backend ``name`` (default: ``settings.backend``), its own values from
    the ``ACPW_*`` environment and the worker's identity from ``settings``.

    Raises:
        InvalidInput: no selectable backend has that name.
    """
    chosen = settings.backend if name is None else name
    entry = REGISTRY.get(chosen)
    if entry is None or not entry.selectable:
        raise InvalidInput(f"unknown sandbox backend {chosen!r}", available=list(BACKENDS))
    return entry.config.from_settings(settings)


def get_backend(config: BackendConfig) -> SandboxBackend:
    """The backend ``config`` describes (its module imported now, not before).

    Raises:
        SandboxError: the backend's module (or the SDK it needs) is not installed.
    """
    module, _, name = REGISTRY[config.type].backend.partition(":")
    try:
        backend_class = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise SandboxError(
            f"the {config.type} backend is not installed here ({exc.name} is missing): "
            f"install acp-worker with its extra, e.g. pip install 'acp-worker[{config.type}]'",
            backend=config.type,
            missing=exc.name,
        ) from exc
    return cast("SandboxBackend", backend_class(config))
