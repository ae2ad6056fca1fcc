"""The ``daytona`` SDK, imported off the event loop.

Importing it (aiohttp, socket.io, OpenTelemetry, two generated API clients) takes 2 to 4 s
of CPU on the machines this is tested on. ``get_backend`` is called inside a running job
service, next to the lease heartbeat: an import there would stall the loop past a short
lease. So the backend's modules only name the SDK for the type checker, and the first
operation awaits :func:`load`, which imports it in a thread (the loop keeps running
between the import's GIL slices); :func:`module` returns it after.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from types import ModuleType
from typing import Any

_loaded: ModuleType | None = None


def check_installed() -> None:
    """Raise ``ImportError`` (what ``get_backend`` translates into the extra to install)
    when the SDK is not installed, without importing it."""
    if importlib.util.find_spec("daytona") is None:
        raise ImportError("the daytona SDK is not installed", name="daytona")


async def load() -> None:
    """Import the SDK in a thread, once."""
    global _loaded  # noqa: PLW0603 - one import per process
    if _loaded is None:
        _loaded = await asyncio.to_thread(importlib.import_module, "daytona")


def module() -> Any:
    """The SDK (after :func:`load`).

    Raises:
        RuntimeError: it was not loaded yet (a bug: every operation loads it first).
    """
    if _loaded is None:
        raise RuntimeError("the daytona SDK is used before load()")
    return _loaded


def loaded() -> bool:
    return _loaded is not None


def api_models() -> Any:
    """The SDK's generated async API client (``daytona_api_client_async``), which the
    SDK imports with itself: the calls the SDK has no service for (registries)."""
    module()
    return importlib.import_module("daytona_api_client_async")
