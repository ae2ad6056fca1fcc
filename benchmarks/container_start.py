"""Docker backend create + start + first agent byte, median of 20, vs the local backend.

Needs the Podman service (scripts/podman-service.sh start) and the base image.
Target: docker median <= 250 ms.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _bench import dry_run, size, summary

from tests.sandbox_owner import chown_to_sandbox
from worker.images.engine import EngineConfig
from worker.sandbox.base import ResourceLimits, SandboxBackend, SandboxSpec
from worker.sandbox.config import DockerConfig, LocalConfig
from worker.sandbox.docker import DockerBackend
from worker.sandbox.local import LocalBackend

RUNS = size(20, 2)
ARGV = ["/bin/sh", "-c", "echo x; exec cat"]


async def once(backend: SandboxBackend, root: Path) -> float:
    spec = SandboxSpec(
        job_id="bench", attempt=1, workspace=root / "ws", pack_closure=root / "pack",
        limits=ResourceLimits(256 << 20, 1.0, 64), labels={}, mask_config=False,
    )  # fmt: skip
    start = time.perf_counter()
    box = await backend.create(spec)
    proc = await box.spawn(ARGV, env={"PATH": "/usr/bin:/bin"})
    await proc.stdout.readexactly(1)
    elapsed = time.perf_counter() - start
    await backend.destroy(box.sandbox_id)
    return elapsed * 1000


async def median(backend: SandboxBackend, root: Path) -> float:
    await once(backend, root)  # warm-up (connections, /etc, image lookups)
    return statistics.median([await once(backend, root) for _ in range(RUNS)])


async def main() -> int:
    dry_run("docker create+start+first byte ≤ 250 ms")
    root = Path(tempfile.mkdtemp())
    (root / "ws").mkdir()
    (root / "pack").mkdir()
    chown_to_sandbox(root / "ws", LocalConfig())
    images = Path(os.environ.get("ACPW_TEST_IMAGES_DIR", "/var/tmp/acpw-test-images"))
    config = EngineConfig(docker_host=os.environ.get("DOCKER_HOST"), images_dir=images)
    local = LocalBackend(LocalConfig(cgroup_parent="acpw-bench"), state_dir=root / "state")
    docker = DockerBackend(DockerConfig(), engine_config=config)
    local_ms = await median(local, root)
    docker_ms = await median(docker, root)
    print(f"local  create+start+first byte: median {local_ms:7.1f} ms (n={RUNS})")
    print(f"docker create+start+first byte: median {docker_ms:7.1f} ms (n={RUNS})")
    print(f"docker/local ratio {docker_ms / local_ms:.1f}x; target docker <= 250 ms: "
          f"{'met' if docker_ms <= 250 else 'MISSED'}")  # fmt: skip
    summary(
        f"docker create+start+first byte {docker_ms:.0f} ms (local {local_ms:.0f} ms)",
        "≤ 250 ms",
        docker_ms <= 250,
    )
    return 0 if docker_ms <= 250 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
