"""Resolve of an already-built pack image (target <= 50 ms) vs a full pack-layer build.

Needs the Podman service and the base image; builds a fresh pack image from a random
closure each run (the "full build"), then resolves it 20 times.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _bench import dry_run, size, summary

from worker.images.build import PackImages
from worker.images.engine import EngineConfig, connect
from worker.images.identity import ImageIdentity

RUNS = size(20, 2)


def main() -> int:
    dry_run("resolve of a built pack image ≤ 50 ms")
    images_dir = Path(os.environ.get("ACPW_TEST_IMAGES_DIR", "/var/tmp/acpw-test-images"))
    config = EngineConfig(docker_host=os.environ.get("DOCKER_HOST"), images_dir=images_dir)
    images = PackImages(connect(config), config)
    closure = Path(tempfile.mkdtemp())
    (closure / "agent.js").write_bytes(os.urandom(1 << 20))
    identity = ImageIdentity(images.base_id(), "sha256:" + os.urandom(32).hex())
    start = time.perf_counter()
    pin = images.build(closure, identity)
    build_ms = (time.perf_counter() - start) * 1000
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        found = images.resolve(ImageIdentity(images.base_id(), identity.closure_digest))
        samples.append((time.perf_counter() - start) * 1000)
        assert found == pin
    resolve_ms = statistics.median(samples)
    images.client.api.remove_image(pin.image_id, force=True)
    images.pins.forget(identity)
    print(f"full pack-layer build: {build_ms:8.1f} ms")
    print(f"resolve (base lookup + tag + labels + layers + pin): median {resolve_ms:6.1f} ms "
          f"(n={RUNS}); {build_ms / resolve_ms:.0f}x faster; target <= 50 ms: "
          f"{'met' if resolve_ms <= 50 else 'MISSED'}")  # fmt: skip
    summary(
        f"resolve {resolve_ms:.1f} ms vs full build {build_ms:.0f} ms", "≤ 50 ms", resolve_ms <= 50
    )
    return 0 if resolve_ms <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
