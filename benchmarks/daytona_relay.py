"""What the Daytona relay costs an agent's stdio, against the local double of Daytona's
API with an injected round-trip time (default 50 ms per HTTP call, half of it before each
log-stream message), and the same figures for the same echo program run as a plain local
subprocess in the same run (the baseline).

An echo program (each line read is written back) runs once through the relay (input
calls, the log stream) and once as a local subprocess:

- latency: one JSON-RPC-sized message written, its echo read, ``--pings`` times; the
  median, and the relay's added latency (relay median - baseline median);
- throughput: ``--burst`` messages written at once, all echoes read: messages/s, and
  how many input calls carried them (batched: what is written while a call is out goes
  in the next one).

Not a test: figures depend on the machine. Run:

    .venv/bin/python -m benchmarks.daytona_relay [--rtt-ms 50] [--burst 500] [--pings 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import dry_run, size, summary

from tests.daytona_double import DaytonaDouble
from tests.integration.daytona_thread import BASE_ID, REGISTRY, closure_resolver
from worker.sandbox.base import LABEL_JOB, ResourceLimits, SandboxSpec
from worker.sandbox.config import DaytonaConfig
from worker.sandbox.daytona import DaytonaBackend

ECHO = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n    sys.stdout.flush()\n"


def _message(i: int) -> bytes:
    body = {"jsonrpc": "2.0", "id": i, "method": "session/prompt", "params": {"x": "y" * 200}}
    return json.dumps(body).encode() + b"\n"


async def _measure(stdin: Any, stdout: asyncio.StreamReader, pings: int, burst: int) -> dict:
    latencies = []
    for i in range(pings):
        started = time.perf_counter()
        stdin.write(_message(i))
        await stdin.drain()
        await stdout.readline()
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    for i in range(burst):
        stdin.write(_message(i))
    await stdin.drain()
    for _ in range(burst):
        await stdout.readline()
    elapsed = time.perf_counter() - started
    return {"latency_s": statistics.median(latencies), "messages_per_s": burst / elapsed}


async def _baseline(pings: int, burst: int) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ECHO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    figures = await _measure(proc.stdin, proc.stdout, pings, burst)
    proc.stdin.close()
    await proc.wait()
    return figures


async def _relay(tmp: Path, rtt_s: float, pings: int, burst: int) -> dict:
    closure = tmp / "cache" / "closures" / ("c" * 64)
    closure.mkdir(parents=True)
    (tmp / "ws").mkdir()
    double = DaytonaDouble(tmp / "daytona")
    double.resolve_image = closure_resolver(tmp / "cache")
    await double.start()
    config = DaytonaConfig(
        worker_id="bench", cache_dir=tmp / "cache", daytona_api_url=double.api_url,
        daytona_api_key=double.api_key, daytona_image_registry=REGISTRY,
        daytona_base_image_id=BASE_ID,
    )  # type: ignore[arg-type]  # fmt: skip
    backend = DaytonaBackend(config)
    spec = SandboxSpec(
        job_id="bench", attempt=1, workspace=tmp / "ws", pack_closure=closure,
        limits=ResourceLimits(memory_bytes=512 * 1024**2, cpus=1.0, pids=128),
        labels={LABEL_JOB: "bench"},
    )  # fmt: skip
    try:
        sandbox = await backend.create(spec)
        double.rtt_s = rtt_s  # set up at full speed; the stdio is what is measured
        proc = await sandbox.spawn(["/usr/bin/python3", "-c", ECHO], env={})
        before = sum(1 for m, p in double.requests if m == "POST" and p.endswith("/input"))
        figures = await _measure(proc.stdin, proc.stdout, pings, burst)
        calls = sum(1 for m, p in double.requests if m == "POST" and p.endswith("/input"))
        figures["input_calls"] = calls - before
        double.rtt_s = 0.0
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 60)
        await backend.destroy(sandbox.sandbox_id)
    finally:
        await backend.aclose()
        await double.stop()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--burst", type=int, default=size(500, 50))
    parser.add_argument("--pings", type=int, default=size(20, 3))
    args = parser.parse_args()
    dry_run("messages/s and added latency through the relay (50 ms per HTTP call)")
    base = await _baseline(args.pings, args.burst)
    with tempfile.TemporaryDirectory(prefix="acpw-bench-daytona-") as tmp:
        relay = await _relay(Path(tmp), args.rtt_ms / 1000, args.pings, args.burst)
    print(f"injected round trip     {args.rtt_ms:.0f} ms per HTTP call")
    print(f"baseline (local pipe)   {base['messages_per_s']:10.0f} messages/s   "
          f"latency {base['latency_s'] * 1000:7.2f} ms")  # fmt: skip
    print(f"daytona relay (double)  {relay['messages_per_s']:10.0f} messages/s   "
          f"latency {relay['latency_s'] * 1000:7.2f} ms")  # fmt: skip
    added = (relay["latency_s"] - base["latency_s"]) * 1000
    print(f"added latency           {added:.2f} ms per message (median of {args.pings})")
    print(
        f"input calls             {relay['input_calls']} for {args.pings} pings and a burst of "
        f"{args.burst} messages (batched)"
    )
    figure = f"{relay['messages_per_s']:.0f} messages/s, +{added:.1f} ms a message"
    summary(figure, "messages/s and added latency through the relay (50 ms per HTTP call)", None)


if __name__ == "__main__":
    asyncio.run(main())
