"""The Daytona double for tests that run ``acp-worker run`` as a subprocess: served from
a thread of its own (the test itself is synchronous), its "registry" holding every
pack-cache closure as the pack image ``acp-worker image build --push`` would push.

Daytona's hosted service cannot run on these machines; see ``tests/daytona_double``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.daytona_double import DaytonaDouble
from worker.images.identity import ImageIdentity

REGISTRY = "registry.test/acpw"
BASE_ID = "sha256:" + "b" * 64


def closure_resolver(cache_dir: Path) -> Callable[[str], Path | None]:
    """The double's registry: the closure of ``cache_dir`` an image reference names."""

    def resolve(ref: str) -> Path | None:
        for closure in (cache_dir / "closures").glob("*"):
            identity = ImageIdentity(BASE_ID, f"sha256:{closure.name}")
            if ref == f"{REGISTRY}/acpw-pack:{identity.digest.removeprefix('sha256:')}":
                return closure
        return None

    return resolve


@contextmanager
def double_in_thread(state_dir: Path, cache_dir: Path) -> Iterator[dict[str, str]]:
    """A running double; yields the settings (environment) that point the daytona
    backend at it. Stopped, its sandboxes killed, on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="daytona-double", daemon=True)
    thread.start()
    double = DaytonaDouble(state_dir)
    double.resolve_image = closure_resolver(cache_dir)
    try:
        asyncio.run_coroutine_threadsafe(double.start(), loop).result(30)
        yield {
            "ACPW_BACKEND": "daytona",
            "ACPW_DAYTONA_API_URL": double.api_url,
            "ACPW_DAYTONA_API_KEY": double.api_key,
            "ACPW_DAYTONA_IMAGE_REGISTRY": REGISTRY,
            "ACPW_DAYTONA_BASE_IMAGE_ID": BASE_ID,
        }
    finally:
        asyncio.run_coroutine_threadsafe(double.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
