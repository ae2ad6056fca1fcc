"""A Sentinel failover under a served workload: how long until the workers write again,
and how many jobs it costs.

A primary, its replica and three sentinels (real processes on loopback ports, the
operator's ACL user of docs/durability.md), one ``acp-worker serve`` whose store and
broker are ``sentinel://`` URLs, N jobs submitted (each talks for about two seconds).
Once some have settled and others run, the primary is SIGKILLed. Printed: seconds from
the kill to the sentinels' promotion and to the first event written on the new master,
and, per job, whether it settled ``succeeded`` exactly once with contiguous events (a
job that did not is lost). A job whose message the failover took mid-delivery is left to
serve's own reaper, which requeues it (``requeued_by_reaper``); nothing is requeued by
hand.

    PYTHONPATH=. .venv/bin/python benchmarks/redis_failover.py --jobs 24
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import dry_run, size, summary

from tests.integration.test_redis_failover import Ha
from worker.client import Client
from worker.settings import Settings
from worker.store import fields, keys

REPO = Path(__file__).resolve().parent.parent
TARGET = "no job lost or run twice through a failover, events contiguous"
STRANDED_AFTER_S = 10
ACP_WORKER = str(Path(sys.executable).with_name("acp-worker"))


def _job(job_id: str) -> dict[str, Any]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = job_id
    data["prompt"] = "#!scenario\n" + "\n".join(f"say t{i}\nsleep 0.1" for i in range(20))
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    data["limits"]["timeout_s"] = 120
    return data


def _status(admin: Any, job_id: str) -> str:
    raw = admin.hget(keys.state(job_id), fields.STATUS)
    return raw.decode() if raw else "missing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=size(24, 4))
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    dry_run(TARGET)
    where = Path(tempfile.mkdtemp(prefix="acpw-bench-failover-"))
    ha = Ha(where / "ha")
    env = ha.served_env(
        where,
        # A job whose message the failover took mid-delivery is requeued by serve's own
        # reaper (docs/durability.md): within these, not the defaults' 120 s and 15 s.
        ACPW_REQUEUE_STRANDED_AFTER_S=str(STRANDED_AFTER_S),
        ACPW_REAPER_INTERVAL="2",
    )
    os.environ.update({k: v for k, v in env.items() if k.startswith("ACPW_TEST_")})
    settings = Settings(
        **{k.removeprefix("ACPW_").lower(): v for k, v in env.items() if k in _SETTINGS}
    )
    log = where / "serve.log"
    with log.open("w") as sink:
        serve = subprocess.Popen(
            [ACP_WORKER, "serve", "--concurrency", str(args.concurrency)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while " ready." not in log.read_text():
            if serve.poll() is not None:
                raise SystemExit(log.read_text()[-3000:])
            time.sleep(0.2)
        ids = [f"bench-failover-{i:03d}" for i in range(args.jobs)]
        with Client(settings.redis_url or "", settings=settings) as client:
            for job_id in ids:
                client.submit(_job(job_id))
        admin = ha.primary.admin()
        while sum(_status(admin, j) == "succeeded" for j in ids) < args.jobs // 4 or not any(
            _status(admin, j) == "running" for j in ids
        ):
            time.sleep(0.05)
        admin.close()
        ha.primary.stop()
        killed = time.monotonic()
        new = ha.replica.admin()
        before = sum(int(new.xlen(keys.events(j))) for j in ids)
        ha.promoted()
        promoted = time.monotonic() - killed
        while sum(int(new.xlen(keys.events(j))) for j in ids) == before:
            time.sleep(0.02)
        writing_again = time.monotonic() - killed
        _settle(new, ids)
        report = _judge(new, ids)
        requeued = _requeued_by_reaper(log.read_text(), ids)
        report.update(
            promoted_after_s=round(promoted, 2),
            writing_again_s=round(writing_again, 2),
            requeued_by_reaper=requeued,
        )
        print(json.dumps(report, indent=2))
        figure = f"{len(report['lost'])} of {len(ids)} lost, writing again {writing_again:.1f} s"
        if requeued:
            figure += f" ({len(requeued)} requeued by the reaper)"
        summary(figure, TARGET, not report["lost"] and not report["not_contiguous"])
        new.close()
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        ha.stop()
        shutil.rmtree(where, ignore_errors=True)


_SETTINGS = {
    "ACPW_REDIS_URL",
    "ACPW_BROKER_URL",
    "ACPW_REDIS_SENTINEL_MASTER",
    "ACPW_REDIS_SENTINEL_PASSWORD",
    "ACPW_REDIS_USERNAME",
    "ACPW_REDIS_PASSWORD",
}


def _requeued_by_reaper(log_text: str, ids: list[str]) -> list[str]:
    """The jobs the reaper's stranded-job sweep requeued (its log line): a job whose
    message was popped from the old master as it died, and which then ran from the new
    message (or is counted lost above)."""
    return [j for j in ids if f"job {j} stayed queued without a broker message" in log_text]


def _settle(admin: Any, ids: list[str], *, quiet_s: float = 60, limit_s: float = 600) -> None:
    """Until every job is settled, or nothing changed for ``quiet_s`` (bounded)."""
    deadline = time.monotonic() + limit_s
    last, changed = None, time.monotonic()
    while time.monotonic() < deadline:
        now = [_status(admin, j) for j in ids]
        if all(s in fields.TERMINAL_STATUSES for s in now):
            return
        if now != last:
            last, changed = now, time.monotonic()
        elif time.monotonic() - changed > quiet_s:
            return
        time.sleep(0.2)


def _judge(admin: Any, ids: list[str]) -> dict[str, Any]:
    lost, gaps, statuses = [], [], {}
    for job_id in ids:
        status = _status(admin, job_id)
        statuses[status] = statuses.get(status, 0) + 1
        events = [json.loads(f[b"event"]) for _, f in admin.xrange(keys.events(job_id))]
        last = [e for e in events if e["attempt"] == max((x["attempt"] for x in events), default=1)]
        seqs = [e["seq"] for e in last]
        completed = [e for e in last if e["type"] == "job.completed"]
        if status != "succeeded" or len(completed) != 1:
            lost.append(job_id)
        if seqs != list(range(1, len(seqs) + 1)):
            gaps.append(job_id)
    return {"jobs": len(ids), "statuses": statuses, "lost": lost, "not_contiguous": gaps}


if __name__ == "__main__":
    main()
