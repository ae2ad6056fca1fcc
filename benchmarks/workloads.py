"""Fixed workloads for counting instructions (``compare_revisions.py --instructions``).

    python benchmarks/workloads.py events N   # N agent_message_chunk updates through
                                              # normalizer, emitter and fenced Redis sink
    python benchmarks/workloads.py hello N    # a warm-up hello job, then N more

Each does the same work whatever revision of the worker is on ``PYTHONPATH`` (only
interfaces that every revision since the reshaping has), so the instructions it executes
under ``valgrind --tool=callgrind``, which counts them exactly whatever else the machine
does, compare revisions where wall time on a noisy machine cannot. Run with N and with
0: the difference is the cost of the N events or jobs, without the interpreter's start.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


async def events(n: int) -> None:
    import redis.asyncio as aioredis

    from worker.events.emitter import EventEmitter
    from worker.events.normalizer import Normalizer
    from worker.store import lease as leases
    from worker.store.fenced import FencedStreamSink, SinkPolicy

    client = aioredis.Redis.from_url(URL)
    job_id = f"bench-ir-{os.getpid()}"
    lease = await leases.acquire(client, job_id, worker_id="bench", ttl=300)
    policy = SinkPolicy(maxlen=n * 2 + 10, buffer_events=n + 1)
    sink = FencedStreamSink(client, lease, policy=policy)  # type: ignore[arg-type]
    emitter = EventEmitter(job_id=job_id, attempt=1, sinks=[sink])
    normalizer = Normalizer(workspace_root="/workspace")
    for i in range(n):
        chunk = {"type": "text", "text": f"token {i} of a long streamed answer "}
        update = {"sessionUpdate": "agent_message_chunk", "content": chunk}
        for event in normalizer.session_update({"sessionId": "s", "update": update}):
            await emitter.emit(event)
    await emitter.close()
    await client.delete(*(await client.keys(f"*{job_id}*")) or [job_id])
    await client.aclose()


async def hello(n: int) -> None:
    from worker.events.sinks import MemorySink
    from worker.job import run_job
    from worker.jobs.spec import parse_job
    from worker.sandbox import backend_config, get_backend
    from worker.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            cache_dir=Path(tmp) / "cache",
            work_dir=Path(tmp) / "work",
            secrets_dir=REPO / "examples" / "secrets",
        )
        for _ in range(n + 1):  # the first one warms the pack cache
            spec = parse_job((REPO / "examples" / "hello.json").read_bytes())
            outcome = await run_job(
                spec,
                settings=settings,
                backend=get_backend(backend_config(settings, "local")),
                sinks=[MemorySink()],
                environ={},
                base_dir=REPO / "examples",
            )
            assert outcome.status == "succeeded", outcome


if __name__ == "__main__":
    workload, count = sys.argv[1], int(sys.argv[2])
    asyncio.run({"events": events, "hello": hello}[workload](count))
