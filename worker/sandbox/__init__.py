"""Sandbox backends behind one small async seam (``base.SandboxBackend``).

Backends are imported lazily: their SDKs are optional extras.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.errors import InvalidInput

if TYPE_CHECKING:
    from worker.sandbox.base import SandboxBackend
    from worker.settings import Settings

BACKENDS = ("local", "docker")


def get_backend(name: str, settings: Settings) -> SandboxBackend:
    """The backend called ``name``, configured from ``settings``.

    Raises:
        InvalidInput: no such backend.
    """
    if name == "local":
        from worker.sandbox.local import LocalBackend

        return LocalBackend(settings)
    if name == "docker":
        from worker.sandbox.docker import DockerBackend

        return DockerBackend(settings)
    raise InvalidInput(f"unknown sandbox backend {name!r}", available=list(BACKENDS))
