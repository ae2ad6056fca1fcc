"""Events/s through the fenced sink over TLS against plain TCP, and the cost of ``WAIT``.

Starts its own redis-servers on loopback ports: one plain, one TLS-only (a CA made here),
and a primary with a replica for ``WAIT``; runs ``event_throughput.py`` against each,
interleaved for ``--rounds`` rounds (load on a shared machine hits both alike), and
prints the medians. ``WAIT`` matters only where the worker uses it (lease acquire and
renewal, terminal events): that figure is the time of a lease acquire and release, with
and without the acquire's ``WAIT`` for a replica.

    PYTHONPATH=. .venv/bin/python benchmarks/redis_tls_throughput.py --events 20000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import dry_run, size, summary

from tests.redis_servers import ADMIN_PASSWORD, make_certs, start_redis
from worker.settings import Settings
from worker.store import connect
from worker.store import lease as leases

HERE = Path(__file__).resolve().parent
TARGET = "events/s over TLS within 10 % of plain"


def _rate(url: str, events: int) -> float:
    out = subprocess.run(
        [sys.executable, str(HERE / "event_throughput.py"), "--events", str(events)],
        env={"ACPW_BENCH_REDIS_URL": url, "PYTHONPATH": str(HERE.parent), "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"ours \(normalizer\+emitter\+fenced sink\): ([\d,]+)", out.stdout)
    assert found, out.stdout + out.stderr
    return float(found.group(1).replace(",", ""))


async def _acquire_and_settle_ms(url: str, replicas: int, n: int) -> float:
    settings = Settings(redis_wait_replicas=replicas)
    client = connect.async_client(connect.target(url, settings), settings)
    start = time.perf_counter()
    for i in range(n):
        lease = await leases.acquire(client, f"wait-{replicas}-{i}", worker_id="b", ttl=30)
        assert isinstance(lease, leases.Lease)
        await leases.release(client, lease)
    await client.aclose()
    return (time.perf_counter() - start) * 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=size(20_000, 2_000))
    parser.add_argument("--rounds", type=int, default=size(3, 1))
    args = parser.parse_args()
    dry_run(TARGET)
    where = Path(tempfile.mkdtemp(prefix="acpw-bench-tls-"))
    certs = make_certs(where / "certs")
    plain = start_redis(where / "plain")
    tls = start_redis(where / "tls", certs=certs)
    replica = start_redis(
        where / "replica",
        extra=[f"masterauth {ADMIN_PASSWORD}", f"replicaof 127.0.0.1 {plain.port}"],
    )
    try:
        plain_url = f"redis://:{ADMIN_PASSWORD}@127.0.0.1:{plain.port}/0"
        tls_url = f"rediss://:{ADMIN_PASSWORD}@localhost:{tls.port}/0?ssl_ca_certs={certs.ca}"
        rates: dict[str, list[float]] = {"plain": [], "tls": []}
        for i in range(args.rounds):
            order = [("plain", plain_url), ("tls", tls_url)]
            for name, url in order if i % 2 == 0 else reversed(order):
                rates[name].append(_rate(url, args.events))
        wait = {n: asyncio.run(_acquire_and_settle_ms(plain_url, n, 200)) for n in (0, 1)}
        plain_rate, tls_rate = (statistics.median(rates[k]) for k in ("plain", "tls"))
        print(f"fenced sink, plain TCP: {plain_rate:,.0f} events/s (rounds {rates['plain']})")
        print(f"fenced sink, TLS:       {tls_rate:,.0f} events/s (rounds {rates['tls']})")
        print(f"TLS/plain: {tls_rate / plain_rate:.2f}")
        print(
            f"lease acquire + release: {wait[0]:.2f} ms, {wait[1]:.2f} ms with the acquire "
            "WAITing for a replica"
        )
        ratio = tls_rate / plain_rate
        figure = f"TLS {ratio:.2f}x plain; WAIT +{wait[1] - wait[0]:.2f} ms an acquire"
        summary(figure, TARGET, ratio >= 0.9)
    finally:
        for server in (replica, tls, plain):
            server.stop()
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
