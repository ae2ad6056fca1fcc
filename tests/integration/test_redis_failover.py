"""A Redis failover, as Sentinel makes one: real ``redis-server`` processes (a primary
and its replica) and three ``redis-sentinel``s on loopback ports, started and stopped
here. The primary is killed while a job runs: the worker follows the sentinels to the
promoted replica without a restart, the job settles exactly once and its events stay
contiguous. The fenced sink's answer to lines a failover lost is first checked alone,
deterministically, against the suite's Redis (the loss made by hand)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.conftest import REPO
from tests.integration.test_redis_tls import ACP_WORKER, operators_acl
from tests.integration.test_run_job import _check_stream, _env, _job
from tests.procs import finish
from tests.redis_servers import (
    ADMIN_PASSWORD,
    MASTER,
    SENTINEL_PASSWORD,
    Certs,
    Server,
    start_redis,
    start_sentinel,
    wait_replica_online,
)
from worker.errors import LeaseLost
from worker.events.emitter import EventEmitter
from worker.events.models import Notice
from worker.metrics import readiness
from worker.settings import Settings
from worker.store import fields, keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy
from worker.store.lease import Lease

pytestmark = pytest.mark.integration

PASSWORD = "acl-pw-9b27f3e1c5"


# --- the sink alone: lines a failover lost ------------------------------------------------


async def _lose_after(client: aioredis.Redis, job_id: str, keep: int) -> None:
    """What a failover to a replica that lagged does: the stream and ``ev_seq`` as they
    were after line ``keep``."""
    entries = await client.xrange(keys.events(job_id))
    await client.xdel(keys.events(job_id), *[eid for eid, _ in entries[keep:]])
    await client.hset(keys.state(job_id), fields.EV_SEQ, keep)


async def _seqs(client: aioredis.Redis, job_id: str) -> list[int]:
    return [json.loads(f[b"event"])["seq"] for _, f in await client.xrange(keys.events(job_id))]


@pytest.mark.parametrize(
    ("window", "stored", "gap"), [(100, [1, 2, 3, 4, 5, 6], None), (2, [1, 2, 4, 5, 6], "3-3")]
)
async def test_lines_a_failover_lost_are_written_again_or_the_gap_is_recorded(
    aredis: aioredis.Redis, window: int, stored: list[int], gap: str | None
) -> None:
    """Lines 3-5 were acknowledged, then lost: the sink writes again those it still keeps
    (its window of written lines), and records the seqs it no longer has in the state's
    ``ev_gap``: never a silent hole in the stream."""
    job_id = f"failover-sink-{window}"
    got = await leases.acquire(aredis, job_id, worker_id="w1", ttl=30)
    assert isinstance(got, Lease)
    sink = FencedStreamSink(aredis, got, policy=SinkPolicy(buffer_events=window))
    emitter = EventEmitter(job_id=job_id, attempt=got.attempt, sinks=[sink])
    for i in range(5):
        await emitter.emit(Notice(level="info", code="t", message=str(i)))
    while len(await _seqs(aredis, job_id)) < 5:
        await asyncio.sleep(0.01)
    await _lose_after(aredis, job_id, keep=2)
    await emitter.emit(Notice(level="info", code="t", message="after the failover"))
    await sink.close()
    assert await _seqs(aredis, job_id) == stored
    state = await aredis.hget(keys.state(job_id), fields.EV_GAP)
    assert (state.decode() if state else None) == gap


async def test_an_acquire_a_failover_lost_cannot_let_two_owners_write(
    aredis: aioredis.Redis,
) -> None:
    """Worker A's acquire is lost (the replica never had it: counter, lease and status as
    before), so worker B is granted the same token again. The fence compares the
    lease's own value, token and nonce: A can neither write, renew nor release."""
    job_id = "failover-lost-acquire"
    a = await leases.acquire(aredis, job_id, worker_id="a", ttl=30)
    assert isinstance(a, Lease)
    await aredis.delete(keys.lease(job_id))  # the failover: as before A's acquire
    await aredis.hset(keys.state(job_id), mapping={fields.FENCE: 0, fields.STATUS: "queued"})
    b = await leases.acquire(aredis, job_id, worker_id="b", ttl=30)
    assert isinstance(b, Lease)
    assert b.token == a.token  # the counter came back: the same token
    stale = FencedStreamSink(aredis, a, policy=SinkPolicy())
    emitter = EventEmitter(job_id=job_id, attempt=a.attempt, sinks=[stale])
    await emitter.emit(Notice(level="info", code="t", message="from A"))
    with pytest.raises(LeaseLost):
        await stale.close()
    assert await _seqs(aredis, job_id) == []
    assert not await leases.renew(aredis, a, ttl=30)
    assert not await leases.release(aredis, a)
    assert await leases.held(aredis, b)


async def test_a_lease_asked_for_during_a_failover_is_asked_again(
    aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery taken as the primary dies: its lease acquire meets a refused connection
    (here twice) and is sent again until Redis answers, within ``ACPW_SINK_RETRY_S``;
    failing at once would acknowledge the message and never run the job."""
    import redis.exceptions

    from worker.service.ownership import Claim, claim_lease

    real = leases.acquire
    left = {"refusals": 2}

    async def refusing(*args: Any, **kwargs: Any) -> Any:
        if left["refusals"] > 0:
            left["refusals"] -= 1
            raise redis.exceptions.ConnectionError("Error 111 connecting to the old master")
        return await real(*args, **kwargs)

    monkeypatch.setattr(leases, "acquire", refusing)
    before = time.monotonic()
    lease, asked = await claim_lease(
        aredis, Claim("failover-acquire"), settings=Settings(sink_retry_s=30)
    )
    assert left["refusals"] == 0
    assert lease.token == 1
    assert before < asked <= time.monotonic()  # the acquire that got it, not the first
    left["refusals"] = 1
    with pytest.raises(redis.exceptions.ConnectionError):
        await claim_lease(aredis, Claim("failover-acquire-2"), settings=Settings(sink_retry_s=0.01))


# --- a real failover ----------------------------------------------------------------------


class Ha:
    """A primary, its replica and three sentinels, each with the operator's ACL user; with
    ``certs``, every one of them over TLS only (servers, replication, sentinels)."""

    def __init__(self, where: Path, certs: Certs | None = None) -> None:
        self.certs = certs
        acl = [operators_acl()]
        auth = [f"masterauth {ADMIN_PASSWORD}"]
        self.primary = start_redis(where / "primary", users=acl, extra=auth, certs=certs)
        self.replica = start_redis(
            where / "replica",
            users=acl,
            extra=[*auth, f"replicaof 127.0.0.1 {self.primary.port}"],
            certs=certs,
        )
        self.sentinels: list[Server] = []
        try:
            self.sentinels = [
                start_sentinel(where / f"sentinel-{i}", self.primary.port, certs=certs)
                for i in range(3)
            ]
            wait_replica_online(self.primary)
            self._settle()
        except BaseException:
            self.stop()
            raise

    def _settle(self, timeout: float = 30) -> None:
        """Until every sentinel knows the replica and the two other sentinels."""
        deadline = time.monotonic() + timeout
        for sentinel in self.sentinels:
            client = sentinel.sentinel()
            try:
                while True:
                    info = client.sentinel_master(MASTER)
                    if int(info["num-slaves"]) >= 1 and int(info["num-other-sentinels"]) >= 2:
                        break
                    assert time.monotonic() < deadline, info
                    time.sleep(0.1)
            finally:
                client.close()

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels) + "/0"

    def env(self, tmp_path: Path, **extra: str) -> dict[str, str]:
        if self.certs is not None:
            extra = {
                "ACPW_REDIS_TLS": "true",
                "ACPW_REDIS_SENTINEL_TLS": "true",
                "ACPW_REDIS_TLS_CA": str(self.certs.ca),
                **extra,
            }
        return _env(
            tmp_path,
            ACPW_REDIS_SENTINEL_MASTER=MASTER,
            ACPW_REDIS_SENTINEL_PASSWORD="env:ACPW_TEST_SENTINEL_PW",
            ACPW_TEST_SENTINEL_PW=SENTINEL_PASSWORD,
            ACPW_REDIS_USERNAME="acpw",
            ACPW_REDIS_PASSWORD="env:ACPW_TEST_REDIS_PW",
            ACPW_TEST_REDIS_PW=PASSWORD,
            **extra,
        )

    def served_env(self, tmp_path: Path, **extra: str) -> dict[str, str]:
        """``env`` for ``acp-worker serve`` and its clients on this pair: the job service
        on database 0, the broker on 1, the examples' secrets, a 15 s lease renewed
        every second (a failover takes seconds: the lease outlives it); ``extra`` last."""
        base = self.url.rsplit("/", 1)[0]
        return self.env(
            tmp_path,
            ACPW_REDIS_URL=f"{base}/0",
            ACPW_BROKER_URL=f"{base}/1",
            ACPW_SECRETS_DIR=str(REPO / "examples" / "secrets"),
            ACPW_LEASE_TTL="15",
            ACPW_LEASE_RENEW="1",
            **extra,
        )

    def promoted(self, timeout: float = 60) -> float:
        """Seconds until the sentinels name the replica as the master."""
        start = time.monotonic()
        client = self.sentinels[0].sentinel()
        try:
            while client.sentinel_get_master_addr_by_name(MASTER)[1] != self.replica.port:
                assert time.monotonic() - start < timeout, "no failover"
                time.sleep(0.05)
        finally:
            client.close()
        return time.monotonic() - start

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.stop()


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[Ha]:
    servers = Ha(tmp_path / "ha")
    yield servers
    servers.stop()


def _ticks(count: int, pause: float = 0.1) -> str:
    return "#!scenario\n" + "\n".join(f"say tick-{i:03d}\nsleep {pause}" for i in range(count))


def test_ready_names_the_sentinel_master(ha: Ha) -> None:
    settings = Settings(
        redis_sentinel_master=MASTER,
        redis_sentinel_password="env:ACPW_TEST_SENTINEL_PW",
        redis_username="acpw",
        redis_password="env:ACPW_TEST_REDIS_PW",
    )
    os.environ.update(ACPW_TEST_SENTINEL_PW=SENTINEL_PASSWORD, ACPW_TEST_REDIS_PW=PASSWORD)
    report = readiness(ha.url, lambda: None, settings)
    assert report["redis"] == "ok", report
    assert report["redis_at"]["sentinel_master"] == MASTER
    assert report["redis_at"]["master_address"] == f"127.0.0.1:{ha.primary.port}"
    assert PASSWORD not in json.dumps(report)
    assert SENTINEL_PASSWORD not in json.dumps(report)


def test_a_running_job_follows_a_failover_and_settles_once(tmp_path: Path, ha: Ha) -> None:
    """``run --redis sentinel://…``: the primary is SIGKILLed mid-turn; the job goes on
    against the promoted replica and settles once, with every event, in order."""
    job = _job(tmp_path, _ticks(60))
    env = ha.env(tmp_path, ACPW_LEASE_TTL="15", ACPW_LEASE_RENEW="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "run",
            str(job),
            "--json",
            "--quiet",
            "--redis",
            ha.url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "tick-010" in line:
            ha.primary.stop()
            break
    failover_s = ha.promoted()
    out, err = finish(proc, timeout=120)
    events = [json.loads(x) for x in [*seen, *out.splitlines()] if x.strip()]
    assert proc.returncode == 0, err[-3000:]
    assert _check_stream(events)["status"] == "succeeded"  # contiguous, one job.completed
    admin = ha.replica.admin()
    try:
        stored = [
            json.loads(f[b"event"]) for _, f in admin.xrange(keys.events(events[0]["job_id"]))
        ]
        state = {
            k.decode(): v.decode()
            for k, v in admin.hgetall(keys.state(events[0]["job_id"])).items()
        }
        denied = admin.execute_command("ACL", "LOG")
    finally:
        admin.close()
    assert stored == events  # nothing lost, nothing twice, in order
    assert state["status"] == "succeeded"
    assert fields.EV_GAP not in state
    assert denied == []
    print(f"failover: primary killed -> replica promoted in {failover_s:.1f} s")


def test_a_served_worker_follows_a_failover_for_its_broker_and_store(
    tmp_path: Path, ha: Ha
) -> None:
    """``serve`` with ``sentinel://`` store and broker: a job running when the primary is
    SIGKILLed settles once, and a job submitted after it is taken from the new master by
    the same worker process (kombu's sentinel transport reconnects), both succeeded."""
    served_through_a_failover(tmp_path, ha)


def served_through_a_failover(tmp_path: Path, ha: Ha) -> None:
    """The served failover above, against ``ha`` as it is set up (plain or TLS)."""
    env = ha.served_env(tmp_path)
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        serve = subprocess.Popen(
            [ACP_WORKER, "serve", "--concurrency", "1", "--loglevel", "INFO", "--no-reaper"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _until(lambda: " ready." in log.read_text(), serve, log)
        first = _submit(tmp_path, env, "failover-served-1", _ticks(40), follow=False)
        _, submit_err = finish(first, timeout=60)
        assert first.returncode == 0, submit_err
        admin = ha.primary.admin()
        try:
            _until(lambda: _said(admin, "failover-served-1", "tick-005"), serve, log)
        finally:
            admin.close()
        ha.primary.stop()
        ha.promoted()
        new = ha.replica.admin()
        try:
            _until(lambda: _said(new, "failover-served-1", "job.completed"), serve, log, 120)
        finally:
            new.close()
        second = _submit(tmp_path, env, "failover-served-2", "scenario: hello")
        out2, err2 = finish(second, timeout=120)
        assert second.returncode == 0, err2[-3000:] + log.read_text()[-3000:]
        assert serve.poll() is None  # the same worker process, never restarted
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
    new = ha.replica.admin()
    try:
        for job_id in ("failover-served-1", "failover-served-2"):
            events = [json.loads(f[b"event"]) for _, f in new.xrange(keys.events(job_id))]
            assert _check_stream(events)["status"] == "succeeded", job_id
            assert new.hget(keys.state(job_id), fields.EV_GAP) is None
    finally:
        new.close()
    for text in (out2, err2, log.read_text()):
        assert PASSWORD not in text
        assert SENTINEL_PASSWORD not in text


def _until(check: Any, serve: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert serve.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def _said(client: Any, job_id: str, what: str) -> bool:
    return what.encode() in b"".join(f[b"event"] for _, f in client.xrange(keys.events(job_id)))


def _submit(
    tmp_path: Path, env: dict[str, str], job_id: str, prompt: str, *, follow: bool = True
) -> subprocess.Popen[str]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data.update(job_id=job_id, prompt=prompt)
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    spec = tmp_path / f"{job_id}.json"
    spec.write_text(json.dumps(data))
    return subprocess.Popen(
        [ACP_WORKER, "submit", str(spec), "--json", *(["--follow"] if follow else [])],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
