"""The cost of ``WAIT`` (``ACPW_REDIS_WAIT_REPLICAS`` / ``ACPW_REDIS_WAIT_MS``) on the hello
job run against Redis as ``acp-worker run --redis`` runs it: the lease acquired and
renewed, every event through the fenced sink, the terminal event settling the state, the
lease released.

A primary and its replica (real ``redis-server`` processes on loopback ports, started
here), the emulator's hello job (``examples/hello.json``, a fresh job id each run, warm
pack cache) with ``WAIT 1`` on its writes that use it, against the same job with WAIT off
(the baseline), interleaved round by round in alternating order. Printed: both medians,
the ratio (target ≤ 1.10x), and the ``WAIT`` calls per job the primary counted.

    PYTHONPATH=. .venv/bin/python benchmarks/redis_wait.py
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from _bench import dry_run, size, summary

from tests.redis_servers import ADMIN_PASSWORD, Server, start_redis, wait_replica_online
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox import backend_config, get_backend
from worker.service.ownership import Claim, owning
from worker.settings import Settings
from worker.store.lease import redis_client

REPO = Path(__file__).resolve().parents[1]
TARGET = "hello job with WAIT ≤ 1.10x without"
ROUNDS = size(15, 1)


async def one_job(url: str, settings: Settings, job_id: str) -> float:
    """Milliseconds from asking for the lease to the lease released, as ``run --redis``."""
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = job_id
    spec = parse_job(data)
    cancel = asyncio.Event()
    start = time.perf_counter()
    async with AsyncExitStack() as stack:
        client = redis_client(url, settings)
        stack.push_async_callback(client.aclose)
        owned = await stack.enter_async_context(
            owning(
                client,
                Claim(job_id, spec.model_dump_json()),
                settings=settings,
                cancel=cancel,
                raise_when_broken=True,
            )
        )
        outcome = await run_job(
            spec,
            settings=settings,
            backend=get_backend(backend_config(settings, "local")),
            sinks=[owned.sink],
            environ={},
            base_dir=REPO / "examples",
            attempt=owned.lease.attempt,
            cancel=cancel,
            labels=owned.labels,
            control=client,
            lease_gone=owned.lease_gone,
            lease_deadline=owned.deadline,
        )
    assert outcome.status == "succeeded", outcome
    return (time.perf_counter() - start) * 1000


def _waits(primary: Server) -> int:
    admin = primary.admin()
    try:
        stats: Any = admin.info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))
    finally:
        admin.close()


async def main() -> None:
    dry_run(TARGET)
    where = Path(tempfile.mkdtemp(prefix="acpw-bench-wait-"))
    primary = start_redis(where / "primary", extra=[f"masterauth {ADMIN_PASSWORD}"])
    replica = start_redis(
        where / "replica",
        extra=[f"masterauth {ADMIN_PASSWORD}", f"replicaof 127.0.0.1 {primary.port}"],
    )
    try:
        wait_replica_online(primary)
        url = f"redis://:{ADMIN_PASSWORD}@127.0.0.1:{primary.port}/0"
        base = {
            "cache_dir": where / "cache",
            "work_dir": where / "work",
            "secrets_dir": REPO / "examples" / "secrets",
            "redis_wait_ms": 1000,
        }
        on = Settings(**base, redis_wait_replicas=1)
        off = Settings(**base, redis_wait_replicas=0)
        await one_job(url, off, "warm-0")  # the pack cache
        times: dict[str, list[float]] = {"on": [], "off": []}
        waits = 0
        for i in range(ROUNDS):
            order = [("off", off), ("on", on)] if i % 2 == 0 else [("on", on), ("off", off)]
            for name, settings in order:
                before = _waits(primary)
                times[name].append(await one_job(url, settings, f"wait-{name}-{i}"))
                if name == "on":
                    waits += _waits(primary) - before
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["on"] / med["off"]
        report = {
            "rounds": ROUNDS,
            "median_ms": {k: round(v, 1) for k, v in med.items()},
            "range_ms": {k: [round(min(v), 1), round(max(v), 1)] for k, v in times.items()},
            "ratio": round(ratio, 3),
            "waits_per_job": round(waits / ROUNDS, 1),
        }
        print(json.dumps(report, indent=2))
        summary(
            f"hello job {med['on']:.0f} ms with WAIT 1, {med['off']:.0f} ms without: "
            f"{ratio:.2f}x ({waits / ROUNDS:.0f} WAITs a job)",
            TARGET,
            ratio <= 1.10,
        )
    finally:
        replica.stop()
        primary.stop()
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
