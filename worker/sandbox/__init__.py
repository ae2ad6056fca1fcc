"""Sandbox backends behind one small async seam (``base.SandboxBackend``).

Each backend has a typed config (``config``), is registered by name (``registry``) and
is built from its config by ``get_backend``; backends are imported lazily: their SDKs
are optional extras.
"""

from __future__ import annotations

from worker.sandbox.config import (
    BackendConfig,
    DaytonaConfig,
    DockerConfig,
    FakeConfig,
    LocalConfig,
)
from worker.sandbox.registry import BACKENDS, backend_config, get_backend

__all__ = [
    "BACKENDS",
    "BackendConfig",
    "DaytonaConfig",
    "DockerConfig",
    "FakeConfig",
    "LocalConfig",
    "backend_config",
    "get_backend",
]
