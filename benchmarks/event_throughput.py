"""Events/s through normalizer → emitter → fenced Redis sink, against raw pipelined XADD.

Both run in this one process against the same Redis (db 12 by default, flushed), with the
same payloads. Then a paced run at 1 000 events/s measures the lag a ``Client`` following
the stream observes (p50/p99). Targets (issue 3): ≥ 20 000 events/s and ≥ 50 % of raw;
p99 lag ≤ 20 ms at 1 000 events/s.

    .venv/bin/python benchmarks/event_throughput.py [--events 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from _bench import dry_run, size, summary

from worker.client import Client
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import Notice
from worker.events.normalizer import Normalizer
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Lease

URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


def update(i: int) -> dict[str, Any]:
    chunk = {"type": "text", "text": f"token {i} of a long streamed answer "}
    return {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": chunk}}


async def _lease(client: aioredis.Redis, job_id: str) -> Lease:
    got = await leases.acquire(client, job_id, worker_id="bench", ttl=300)
    assert isinstance(got, Lease), got
    return got


async def pipeline_rate(client: aioredis.Redis, n: int) -> float:
    """Our path: normalize each update, emit (number, serialize), fenced sink."""
    lease = await _lease(client, "bench-ours")
    sink = FencedStreamSink(client, lease, policy=SinkPolicy(maxlen=n * 2, buffer_events=n))
    emitter = EventEmitter(job_id="bench-ours", attempt=1, sinks=[sink])
    normalizer = Normalizer(workspace_root="/workspace")
    start = time.perf_counter()
    for i in range(n):
        for event in normalizer.session_update(update(i)):
            await emitter.emit(event)
    await emitter.close()
    return n / (time.perf_counter() - start)


async def raw_rate(client: aioredis.Redis, n: int, batch: int = 512) -> float:
    """Baseline: the same lines, pipelined XADD in batches, nothing else."""
    lines = [json.dumps({"seq": i, "type": "message.delta", "data": update(i)}) for i in range(n)]
    key = keys.events("bench-raw")
    start = time.perf_counter()
    for at in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for line in lines[at : at + batch]:
            pipe.xadd(key, {"event": line}, maxlen=n * 2, approximate=True)
        await pipe.execute()
    return n / (time.perf_counter() - start)


async def paced(client: aioredis.Redis, lease: Lease, n: int, rate: float) -> None:
    sink = FencedStreamSink(client, lease, policy=SinkPolicy())
    emitter = EventEmitter(job_id="bench-lag", attempt=1, sinks=[sink])
    start = time.perf_counter()
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        await emitter.emit(Notice(level="info", code="t", message=repr(time.time())))
    await emitter.emit(
        job_completed(status="succeeded", stop_reason="end_turn", error=None, duration_ms=0.0)
    )
    await emitter.close()


def follow_lags(out: list[float], ready: threading.Event) -> None:
    with Client(URL) as client:
        ready.set()
        out.extend(
            (time.time() - float(item.event["data"]["message"])) * 1000
            for item in client.events("bench-lag", follow=True)
            if item.event["type"] == "notice"
        )


async def lag_run(client: aioredis.Redis, n: int, rate: float) -> list[float]:
    lease = await _lease(client, "bench-lag")  # the state the follower reads exists now
    lags: list[float] = []
    ready = threading.Event()
    reader = threading.Thread(target=follow_lags, args=(lags, ready))
    reader.start()
    ready.wait()
    await paced(client, lease, n, rate)
    await asyncio.to_thread(reader.join)
    return lags


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


async def main(n: int) -> None:
    dry_run("≥ 20 000/s, ≥ 50 % of raw XADD, p99 lag ≤ 20 ms")
    redis.Redis.from_url(URL).flushdb()
    client = aioredis.Redis.from_url(URL)
    ours = await pipeline_rate(client, n)
    raw = await raw_rate(client, n)
    lags = await lag_run(client, size(3000, 200), 1000.0)
    await client.aclose()
    redis.Redis.from_url(URL).flushdb()
    print(f"events: {n}")
    print(f"ours (normalizer+emitter+fenced sink): {ours:,.0f} events/s")
    print(f"raw pipelined XADD:                    {raw:,.0f} events/s")
    print(f"ratio ours/raw: {ours / raw:.2f}  (target >= 0.50; absolute target >= 20,000/s)")
    print(
        f"client lag at 1,000 events/s: p50 {pct(lags, 50):.2f} ms, p99 {pct(lags, 99):.2f} ms"
        " (target p99 <= 20 ms)"
    )
    p99 = pct(lags, 99)
    summary(
        f"{ours:,.0f} events/s = {ours / raw:.2f}x raw XADD; lag p99 {p99:.1f} ms",
        "≥ 20 000/s, ≥ 50 %, p99 ≤ 20 ms",
        ours >= 20_000 and ours / raw >= 0.5 and p99 <= 20,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=size(50_000, 500))
    asyncio.run(main(parser.parse_args().events))
