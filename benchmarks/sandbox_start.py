"""Spawn-to-first-byte of `/bin/echo x`: local sandbox vs a bare asyncio subprocess.

Both are measured in the same run, interleaved, so machine noise hits them alike.
Sandbox creation (cgroups, record) happens once, outside the timing: it is per job,
while spawn is what an agent launch pays. Target: <= 10 ms added at the median.

``--idle MS`` sleeps that long before every measured spawn, as a job's first spawn
follows preparation: on kernels where a cgroup migration after an idle spell waits out
an RCU grace period, that is the figure a job sees (the default, 0, measures back to back).

    .venv/bin/python benchmarks/sandbox_start.py [--runs 50] [--idle 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _bench import dry_run, size, summary

from tests.sandbox_owner import chown_to_sandbox
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend, LocalSandbox

ARGV = ["/bin/echo", "x"]
ENV = {"PATH": "/usr/bin:/bin"}


async def bare() -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *ARGV, stdout=asyncio.subprocess.PIPE, env=ENV, start_new_session=True
    )
    assert proc.stdout is not None
    first = await proc.stdout.read(1)
    elapsed = time.perf_counter() - start
    assert first == b"x"
    await proc.wait()
    return elapsed


def sandboxed(box: LocalSandbox) -> Callable[[], Awaitable[float]]:
    async def run() -> float:
        start = time.perf_counter()
        proc = await box.spawn(ARGV, env=ENV)
        first = await proc.stdout.read(1)
        elapsed = time.perf_counter() - start
        assert first == b"x", await proc.stderr.read()
        await proc.wait()
        return elapsed

    return run


async def main(runs: int, idle_s: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        (root / "pack").mkdir()
        config = LocalConfig(cgroup_parent="acpw-bench")
        chown_to_sandbox(root / "ws", config)  # a root worker's sandbox writes as that uid
        backend = LocalBackend(config, state_dir=root / "state")
        spec = SandboxSpec(
            job_id="bench",
            attempt=1,
            workspace=root / "ws",
            pack_closure=root / "pack",
            limits=ResourceLimits(memory_bytes=512 << 20, cpus=1.0, pids=128),
            labels={},
        )
        box = await backend.create(spec)
        try:
            local = sandboxed(box)
            await local()  # warm-up: seccomp compile, host layout, page cache
            await bare()
            bare_ms, local_ms = [], []
            for _ in range(runs):
                await asyncio.sleep(idle_s)
                bare_ms.append(await bare() * 1000)
                await asyncio.sleep(idle_s)
                local_ms.append(await local() * 1000)
        finally:
            await backend.destroy(box.sandbox_id)
    b, s = statistics.median(bare_ms), statistics.median(local_ms)
    print(f"runs: {runs} each, interleaved, {idle_s * 1000:.0f} ms idle before each")
    print(f"bare asyncio subprocess  median {b:7.2f} ms")
    print(f"local sandbox (bwrap)    median {s:7.2f} ms")
    print(f"added by the sandbox     median {s - b:7.2f} ms (target <= 10 ms)")
    summary(f"spawn to first byte +{s - b:.1f} ms over a bare subprocess", "≤ 10 ms", s - b <= 10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=size(50, 3))
    parser.add_argument("--idle", type=float, default=0.0, metavar="MS")
    args = parser.parse_args()
    dry_run("≤ 10 ms added")
    asyncio.run(main(args.runs, args.idle / 1000))
