"""The hello job's wall time, split by phase, on a warm pack cache.

Baseline, measured in the same run: the same ACP exchange (initialize, session/new, the
`hello` scenario) with the emulator started as a bare subprocess — no pack verification,
no sandbox, no event pipeline. Targets: hello job ≤ 400 ms total on a warm cache, pack
re-verification ≤ 20 % of it.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _bench import dry_run, size, summary

from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.rpc.connection import Connection
from worker.sandbox import backend_config, get_backend
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[1]

RUNS = int(os.environ.get("RUNS", str(size(15, 1))))
EMULATOR = REPO / "provider_packs" / "cursor-emulator" / "src" / "cursor_emulator.py"


async def one_job(settings: Settings) -> dict[str, float]:
    spec = parse_job((REPO / "examples" / "hello.json").read_bytes())
    sink = MemorySink()
    start = time.perf_counter()
    outcome = await run_job(
        spec,
        settings=settings,
        backend=get_backend(backend_config(settings, "local")),
        sinks=[sink],
        environ={},
        base_dir=REPO / "examples",
    )
    wall = (time.perf_counter() - start) * 1000
    assert outcome.status == "succeeded", outcome
    timings = dict(sink.events[-1]["data"]["timings_ms"])
    first = next(e for e in sink.events if e["type"] == "message.delta")
    timings["first_event_ms"] = _ms_since(sink.events[0]["ts"], first["ts"])
    timings["total"] = wall
    return timings


def _ms_since(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds() * 1000


async def bare_exchange() -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/python3",
        str(EMULATOR),
        "--disable-project-configs",
        "--disable-auto-update",
        "acp",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={"CURSOR_API_KEY": "k", "PATH": "/usr/bin", "HOME": tempfile.mkdtemp()},
        cwd=REPO / "examples" / "hello-workspace",
    )
    assert proc.stdin is not None
    assert proc.stdout is not None

    async def ignore(method: str, params: object) -> None:
        return None

    conn = Connection(proc.stdout, proc.stdin, on_notification=ignore)
    conn.start()
    await conn.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    session = await conn.request("session/new", {"cwd": str(REPO / "examples"), "mcpServers": []})
    await conn.request(
        "session/prompt",
        {
            "sessionId": session["sessionId"],
            "prompt": [{"type": "text", "text": "scenario: hello"}],
        },
    )
    proc.stdin.close()
    await proc.wait()
    await conn.aclose()
    return (time.perf_counter() - start) * 1000


async def main() -> None:
    dry_run("≤ 400 ms, pack re-verification ≤ 20 %")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            cache_dir=Path(tmp) / "cache",
            work_dir=Path(tmp) / "work",
            secrets_dir=REPO / "examples" / "secrets",
        )
        await one_job(settings)  # warm the pack cache
        jobs = [await one_job(settings) for _ in range(RUNS)]
    bare = [await bare_exchange() for _ in range(RUNS)]
    med = {k: statistics.median(j.get(k, 0.0) for j in jobs) for k in jobs[0]}
    total = med.pop("total")
    first = med.pop("first_event_ms")
    print(f"hello job, warm cache, median of {RUNS} (ms):")
    for phase, value in med.items():
        print(f"  {phase:<15} {value:8.1f}")
    print(f"  {'first delta':<15} {first:8.1f}  (from job.accepted)")
    print(f"  {'TOTAL':<15} {total:8.1f}   target <= 400  -> {'OK' if total <= 400 else 'MISSED'}")
    share = med.get("pack_verify", 0.0) / total
    verdict = "OK" if share <= 0.2 else "MISSED"
    print(f"pack re-verification share: {share:.1%}   target <= 20% -> {verdict}")
    bare_med = statistics.median(bare)
    print(f"baseline bare emulator exchange: {bare_med:.1f} ms")
    print(
        f"hello job = {total / bare_med:.2f}x baseline (+{total - bare_med:.1f} ms for pack "
        "verify, staging, sandbox, events, teardown)"
    )
    summary(
        f"hello job {total:.0f} ms ({total / bare_med:.2f}x the bare exchange), "
        f"pack re-verification {share:.0%}",
        "≤ 400 ms, ≤ 20 %",
        total <= 400 and share <= 0.2,
    )


if __name__ == "__main__":
    asyncio.run(main())
