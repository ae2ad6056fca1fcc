"""Warm pools, in process: real Redis, real bubblewrap (the local backend) or a real
container engine (the docker backend: Podman's Docker API), the Cursor emulator pack,
jobs delivered as the service delivers them (``run_delivery``).

The first job of a launch identity is cold and leaves a slot of its identity behind; the
next one of the same identity claims it (``sandbox.ready`` says ``warm``), a job with
other credentials misses it; a slot serves one job and is replaced; two claims of one
slot on Redis have exactly one winner; a slot whose record lapsed is reaped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tests.conftest import REDIS_URL
from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.job_settings import job_settings
from tests.sandbox_owner import chown_to_sandbox
from worker.client import Client
from worker.client.client import spec_digest
from worker.images.engine import EngineConfig
from worker.job import warm as warm_module
from worker.job.prepare import sandbox_labels
from worker.job.warm import WarmPool
from worker.jobs.spec import JobSpec, parse_job
from worker.sandbox import backend_config, get_backend
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SLOT,
    LABEL_TOKEN,
    ResourceLimits,
    SandboxSpec,
    SlotHost,
)
from worker.sandbox.docker import DockerBackend
from worker.service.guarded import Delivery, GuardedResult, run_delivery
from worker.service.reaper import ReapReport, reap_once
from worker.settings import Settings
from worker.store import jobs as store_jobs
from worker.store import keys
from worker.store import lease as leases
from worker.store import warm as records
from worker.store.owner import owner_labels
from worker.workspace import disk

pytestmark = pytest.mark.integration

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

Event = Mapping[str, Any]
PACK = "cursor-emulator"


def _settings(tmp_path: Path, backend: str = "local", **overrides: Any) -> Settings:
    # Unique per test: a sandbox another run on this host left (or is making) under a shared
    # id would be counted as this pool's leftover.
    worker_id = f"it-warm-{backend}-{uuid.uuid4().hex[:8]}"
    overrides.setdefault("warm_pools", {PACK: 1})
    return job_settings(tmp_path, worker_id, backend=backend, lease_renew=0.5, **overrides)


def _job(tmp_path: Path, key: str) -> dict[str, Any]:
    job_id = f"warm-{uuid.uuid4().hex[:10]}"
    workspace = tmp_path / job_id
    workspace.mkdir()
    (workspace / "README.md").write_text("# hello\n")
    (workspace / ".cursor").mkdir()
    (workspace / ".cursor" / "rules").mkdir()
    (workspace / ".cursor" / "rules" / "style.mdc").write_text("be brief\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / key).write_text(f"{key}-secret-value\n")
    return {
        "v": 1,
        "job_id": job_id,
        "pack": {"name": PACK},
        "workspace": {"kind": "local", "path": str(workspace)},
        "prompt": "scenario: hello",
        "credentials": {"CURSOR_API_KEY": f"file:{key}"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
    }


_running: list[str] = []  # the jobs ``_deliver`` ran, the last one last


def _submit(redis_url: str, spec: JobSpec) -> None:
    """Submitted as a control plane does (its state and its spec in Redis)."""
    with redis.Redis.from_url(redis_url) as sync:
        store_jobs.submit(
            sync,
            spec.job_id,
            job_json=spec.model_dump_json(),
            new_attempt=False,
            digest=spec_digest(spec),
        )


async def _claimed(
    client: aioredis.Redis, redis_url: str, settings: Settings, spec: JobSpec, slot_id: str
) -> tuple[leases.Lease, dict[str, str]]:
    """``spec`` submitted, its attempt's lease taken and ``slot_id`` claimed for it in
    Redis (as ``WarmPool.claim`` does): the lease, and the labels its sandbox is
    relabelled with."""
    _submit(redis_url, spec)
    lease = await leases.acquire(client, spec.job_id, worker_id="it", ttl=30)
    assert isinstance(lease, leases.Lease)
    assert await records.claim(
        client, slot_id, owner="it", job_id=spec.job_id, attempt=lease.attempt,
        token=str(lease.token), ttl_s=30,
    )  # fmt: skip
    labels = sandbox_labels(
        settings, job_id=spec.job_id, attempt=lease.attempt,
        labels={LABEL_TOKEN: str(lease.token)},
    )  # fmt: skip
    return lease, labels


async def _deliver(job: dict[str, Any], settings: Settings, pool: WarmPool) -> list[Event]:
    spec = parse_job(job)
    _running.append(spec.job_id)
    _submit(REDIS_URL, spec)
    result = await run_delivery(Delivery(job, attempt=1), settings=settings, environ={}, pool=pool)
    assert (result.outcome, result.status) == ("ran", "succeeded"), result
    with Client(REDIS_URL) as client:
        return [dict(item.event) for item in client.events(spec.job_id)]


def _ready(events: Sequence[Event]) -> dict[str, Any]:
    [ready] = [e["data"] for e in events if e["type"] == "sandbox.ready"]
    return dict(ready)


def _changed(events: Sequence[Event]) -> dict[str, Any]:
    [changed] = [e["data"] for e in events if e["type"] == "workspace.changed"]
    return {k: v for k, v in changed.items() if k not in ("patch", "base")}


async def _until_idle(pool: WarmPool, count: int) -> None:
    for _ in range(300):
        if len(pool.idle()) == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the pool never had {count} idle slots: {pool.idle()}")


@pytest.fixture(params=["local", "docker"])
def warm_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each backend with warm slots; docker on the engine and image store of
    ``docker_engine`` (the base image built first)."""
    if request.param == "docker":
        config: EngineConfig = request.getfixturevalue("engine_config")
        request.getfixturevalue("base_image")
        monkeypatch.setenv("ACPW_DOCKER_HOST", str(config.docker_host))
        monkeypatch.setenv("ACPW_IMAGES_DIR", str(config.images_dir))
    return str(request.param)


def test_warm_slots_serve_one_job_each_per_identity(
    tmp_path: Path, redis_url: str, warm_backend: str
) -> None:
    settings = _settings(tmp_path, warm_backend)
    config = backend_config(settings)
    pool = WarmPool(settings, get_backend(config), backend_config=config.model_dump_json())

    # What each job had written when it asked for its replacement: the slot is made only
    # once the job settled, never on its loop and CPU while it runs.
    asked: list[str] = []
    replenish = pool.replenish

    def replenish_after(recipe: Any) -> None:
        with Client(REDIS_URL) as client:
            asked.append([item.event["type"] for item in client.events(_running[-1])][-1])
        replenish(recipe)

    pool.replenish = replenish_after  # type: ignore[method-assign]

    # Once assigned (before the fill), the claimed slot is listed as the attempt's sandbox
    # and a reaper pass keeps it: it is judged by the attempt's live lease, as a cold one.
    assigned: list[tuple[dict[str, str], ReapReport]] = []
    backend = pool.backend
    assert isinstance(backend, SlotHost)
    fill = backend.fill

    async def fill_after_check(sandbox: Any, staged: Path) -> Path:
        [info] = await backend.list({LABEL_JOB: _running[-1]})
        assert info.sandbox_id == sandbox.sandbox_id
        assert await backend.list({LABEL_SLOT: info.labels.get(LABEL_SLOT, "-")}) == []
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            report = await reap_once(client, settings, {warm_backend: backend})
        finally:
            await client.aclose()
        assigned.append((dict(info.labels), report))
        if isinstance(backend, DockerBackend):  # its running agent's container is bounded
            assert backend.watchdogs.deadline_file(sandbox.sandbox_id).is_file()
        return await fill(sandbox, staged)

    backend.fill = fill_after_check  # type: ignore[method-assign]

    async def scenario() -> None:
        try:
            # Cold: nothing to claim; a slot of this job's identity is made behind it.
            first = await _deliver(_job(tmp_path, "alpha"), settings, pool)
            assert _ready(first).keys() == {"backend", "sandbox_id"}  # as before pools
            assert _ready(first)["backend"] == warm_backend
            await _until_idle(pool, 1)
            [slot] = pool.idle()
            assert "alpha-secret-value" in slot.recipe.plan.env.values()

            # Warm: the same identity claims it; its workspace is the job's.
            second = await _deliver(_job(tmp_path, "alpha"), settings, pool)
            ready = _ready(second)
            assert ready["warm"] is True
            assert ready["claim_ms"] >= 0
            assert ready["sandbox_id"] == slot.sandbox.sandbox_id
            [(labels, report)] = assigned
            assert LABEL_SLOT not in labels
            assert labels[LABEL_JOB] == _running[-1]
            assert labels[LABEL_TOKEN] not in ("", "0")  # the attempt's lease's fence
            assert slot.sandbox.sandbox_id not in report.destroyed
            types = [e["type"] for e in second]
            assert types.index("sandbox.ready") < types.index("agent.initialized")
            assert types.index("agent.initialized") < types.index("session.started")
            assert second[-1]["data"]["status"] == "succeeded"
            # The agent worked in the job's workspace: the same changes as the cold job's
            # (the staged .cursor/rules moved in under the mask anchor, not reported).
            assert _changed(second) == _changed(first)
            # One use: the slot is gone with its job, a new one replaces it.
            assert await pool.backend.list({LABEL_SLOT: slot.slot_id}) == []
            assert not slot.directory.exists()
            await _until_idle(pool, 1)
            [replacement] = pool.idle()
            assert replacement.slot_id != slot.slot_id

            # Another credential binding misses, and the slot made for it holds its
            # secret only (the pack's one slot went to the newer identity).
            third = await _deliver(_job(tmp_path, "beta"), settings, pool)
            assert "warm" not in _ready(third)
            await _until_idle(pool, 1)
            await asyncio.sleep(0.2)
            for idle in pool.idle():
                values = set(idle.recipe.plan.env.values())
                assert "beta-secret-value" in values
                assert "alpha-secret-value" not in values

            # A slot whose record lapsed (its worker died elsewhere) is reaped.
            [orphan] = pool.idle()
            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                await client.delete(keys.warm_slot(orphan.slot_id))
                report = await reap_once(client, settings, {warm_backend: pool.backend})
            finally:
                await client.aclose()
            assert orphan.sandbox.sandbox_id in report.destroyed
            assert not orphan.directory.exists()
            await pool.tend()  # its renewal fails: the pool lets it go
            assert pool.idle() == []
            assert asked == ["job.completed"] * 3
        finally:
            await pool.close()
        assert await pool.backend.list({"acpw.worker": settings.worker_id}) == []

    asyncio.run(scenario())


def test_a_settled_job_is_told_early_and_its_pool_fills_to_its_size(
    tmp_path: Path, redis_url: str
) -> None:
    """``run_delivery``'s ``settled`` hears the job's result once ``job.completed`` is
    written, while the lease is still held and before the job's directory is removed
    (what ``tasks`` returns to Celery, its next delivery starting meanwhile); the result
    returned at the end is the same. A pool of two made dry refills to two after one job,
    both slots of that job's identity."""
    settings = _settings(tmp_path, warm_pools={PACK: 2})
    config = backend_config(settings)
    pool = WarmPool(settings, get_backend(config), backend_config=config.model_dump_json())
    job = _job(tmp_path, "alpha")
    spec = parse_job(job)
    seen: list[tuple[GuardedResult, bool, str, list[str]]] = []

    def settled(result: GuardedResult) -> None:
        with redis.Redis.from_url(redis_url) as sync:
            lease = sync.exists(keys.lease(spec.job_id)) == 1
            status = (sync.hget(keys.state(spec.job_id), "status") or b"").decode()
        seen.append((result, lease, status, sorted(p.name for p in settings.work_dir.iterdir())))

    async def scenario() -> None:
        try:
            _submit(redis_url, spec)
            result = await run_delivery(
                Delivery(job, attempt=1), settings=settings, environ={}, pool=pool,
                settled=settled,
            )  # fmt: skip
            [(early, lease_held, status, work)] = seen
            assert early == result
            assert (result.outcome, result.status) == ("ran", "succeeded")
            assert lease_held
            assert status == "succeeded"
            assert any(spec.job_id in name for name in work)  # not removed yet
            with redis.Redis.from_url(redis_url) as sync:
                assert sync.exists(keys.lease(spec.job_id)) == 0  # given back at the end
            await _until_idle(pool, 2)
            assert len({s.recipe.identity for s in pool.idle()}) == 1
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_a_slot_cancelled_while_its_disk_mounts_leaves_nothing_mounted(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool closed while a slot is being made cancels it; a cancel that lands while
    the slot's disk is being mounted (on a thread) waits for the mount, so the slot's
    dismantling unmounts it: nothing stays mounted, no slot directory is left."""
    settings = _settings(tmp_path)
    config = backend_config(settings)
    pool = WarmPool(settings, get_backend(config), backend_config=config.model_dump_json())
    entered, release = threading.Event(), threading.Event()
    real_mount = warm_module.mount_bounded

    def slow_mount(job_dir: Path, **kwargs: Any) -> Any:
        if job_dir.name.startswith("warm-"):  # the slot's disk, not the job's
            entered.set()
            assert release.wait(10)
        return real_mount(job_dir, **kwargs)

    monkeypatch.setattr(warm_module, "mount_bounded", slow_mount)

    async def scenario() -> None:
        try:
            await _deliver(_job(tmp_path, "alpha"), settings, pool)  # its slot is made next
            assert await asyncio.to_thread(entered.wait, 30)
            closing = asyncio.ensure_future(pool.close())
            await asyncio.sleep(0.2)  # the cancel has landed; the mount goes on
            assert not closing.done()
            release.set()
            await closing
        finally:
            release.set()
            await pool.close()

    asyncio.run(scenario())
    assert disk.mounts_below(settings.work_dir) == []
    assert [p.name for p in settings.work_dir.glob("warm-*")] == []


def test_a_claimed_slot_is_judged_by_its_attempts_lease(
    tmp_path: Path, redis_url: str, warm_backend: str
) -> None:
    """Once assigned, a slot is the attempt's sandbox to any reaper: kept while the
    attempt's lease holds, even with its slot record gone (it lapses after the claim),
    destroyed once that lease is gone, as a cold sandbox."""
    settings = _settings(tmp_path, warm_backend)
    config = backend_config(settings)
    backend = get_backend(config)
    assert isinstance(backend, SlotHost)
    assert backend.capabilities.warm_slots
    slot_id = uuid.uuid4().hex[:16]
    workspace, closure = tmp_path / "slot-ws", tmp_path / "closure"
    workspace.mkdir()
    closure.mkdir()
    chown_to_sandbox(workspace, config)
    spec = parse_job(_job(tmp_path, "alpha"))

    async def reaped(client: aioredis.Redis) -> list[str]:
        return list((await reap_once(client, settings, {warm_backend: backend})).destroyed)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        sandbox = None
        try:
            assert await records.register(client, slot_id, owner="it", ttl_s=30)
            slot_labels = {
                LABEL_JOB: f"warm-{slot_id}",
                LABEL_ATTEMPT: "1",
                LABEL_TOKEN: "0",
                LABEL_SLOT: slot_id,
                **owner_labels(),
            }
            sandbox = await backend.create(
                SandboxSpec(
                    job_id=f"warm-{slot_id}",
                    attempt=1,
                    workspace=workspace,
                    pack_closure=closure,
                    limits=ResourceLimits(memory_bytes=200 << 20, cpus=0.5, pids=50),
                    labels=slot_labels,
                    mask_config=False,
                )
            )
            await sandbox.spawn(["/bin/sleep", "30"], env={"PATH": "/usr/bin:/bin"})
            assert sandbox.sandbox_id not in await reaped(client)  # its record is alive

            lease, labels = await _claimed(client, redis_url, settings, spec, slot_id)
            await backend.assign(sandbox, labels=labels, lease_deadline=None)
            await client.delete(keys.warm_slot(slot_id))  # the claimed record lapsed
            [info] = await backend.list({LABEL_JOB: spec.job_id})
            assert info.sandbox_id == sandbox.sandbox_id
            assert LABEL_SLOT not in info.labels
            assert sandbox.sandbox_id not in await reaped(client)  # the lease holds

            assert await leases.release(client, lease)
            assert sandbox.sandbox_id in await reaped(client)
            assert await backend.list({LABEL_JOB: spec.job_id}) == []
        finally:
            if sandbox is not None:
                await backend.destroy(sandbox.sandbox_id)
            await client.aclose()

    asyncio.run(scenario())


def test_two_claims_of_one_slot_have_one_winner(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            assert await records.register(client, "s1", owner="me", ttl_s=5)
            assert not await records.register(client, "s1", owner="me", ttl_s=5)
            claims = [
                records.claim(
                    client, "s1", owner="me", job_id=f"j{i}", attempt=1, token="7", ttl_s=5
                )
                for i in range(2)
            ]
            assert sorted(await asyncio.gather(*claims)) == [False, True]
            assert not await records.renew(client, "s1", owner="me", ttl_s=5)  # claimed
            assert not await records.retire(client, "s1", owner="me")
            assert await records.slot_recorded(client, "s1")
            # Another owner's slot, a retired one and a lapsed one cannot be claimed.
            assert await records.register(client, "s2", owner="me", ttl_s=5)
            assert not await records.claim(
                client, "s2", owner="other", job_id="j", attempt=1, token="1", ttl_s=5
            )
            assert await records.retire(client, "s2", owner="me")
            assert not await records.claim(
                client, "s2", owner="me", job_id="j", attempt=1, token="1", ttl_s=5
            )
            assert await records.register(client, "s3", owner="me", ttl_s=0.05)
            await asyncio.sleep(0.1)
            assert not await records.claim(
                client, "s3", owner="me", job_id="j", attempt=1, token="1", ttl_s=5
            )
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_served_job_claims_the_slot_its_predecessor_left(tmp_path: Path, redis_url: str) -> None:
    """``acp-worker serve`` with ``ACPW_WARM_POOLS``: the second job of an identity runs
    in the slot made after the first (on the pool process's long-lived loop); the slot
    of a killed pool process is reaped; on SIGTERM a slot is destroyed, not handed back."""
    from tests.integration.test_service import (
        BROKER_URL,
        Worker,
        _flush,
        _settings,
        job,
        sandboxes_left,
        wait_for,
    )

    _flush(BROKER_URL)
    pools = {"ACPW_WARM_POOLS": json.dumps({PACK: 1})}
    worker = Worker(tmp_path / "worker.log", worker_id="it-warm", concurrency=1, env=pools)
    idle = redis.Redis.from_url(redis_url)
    try:
        with Client(redis_url, settings=_settings()) as client:
            readies = []
            for made, job_id in enumerate(("warm-served-1", "warm-served-2"), start=1):
                client.submit(job(job_id))
                events = [e.event for e in client.events(job_id, follow=True, timeout=60)]
                assert events[-1]["data"]["status"] == "succeeded"
                readies.append(_ready(events))
                # Made once the job settled: recorded idle first, ready (logged) last.
                wait_for(lambda n=made: _slots_ready(worker.log) >= n, "a warm slot")
                assert _idle_slots(idle)
            assert "warm" not in readies[0]
            assert readies[1]["warm"] is True
            assert sandboxes_left("warm-served-2") == []
            # The pool process dies with its slot: serve's reaper destroys the slot.
            [slot] = _slots()
            os.kill(int(slot.labels["acpw.owner"].split(":")[2]), signal.SIGKILL)
            wait_for(lambda: not _slots(), "the reaper to destroy the dead process's slot")
            # Its replacement process starts cold and makes a slot again.
            client.submit(job("warm-served-3"))
            events = [e.event for e in client.events("warm-served-3", follow=True, timeout=60)]
            assert "warm" not in _ready(events)
            wait_for(lambda: _slots_ready(worker.log) >= 3 and _slots(), "a new warm slot")
    finally:
        worker.stop()
        idle.close()
    assert _slots() == []  # the drain destroyed it


def _slots() -> list[Any]:
    from tests.integration.test_service import _settings

    backend = get_backend(backend_config(_settings()))
    return [
        s for s in asyncio.run(backend.list({"acpw.worker": "it-warm"})) if LABEL_SLOT in s.labels
    ]


def _slots_ready(log: Path) -> int:
    """How many warm slots the served worker made (each is logged once ready)."""
    return log.read_text().count(" ready (made in ")


def _idle_slots(client: redis.Redis) -> list[bytes]:
    return [
        key
        for key in client.scan_iter(f"{keys.PREFIX}:warm:*")
        if (client.get(key) or b"").startswith(b"idle ")
    ]


@pytest.mark.usefixtures("base_image")
def test_a_served_docker_job_claims_its_predecessors_slot_container(
    tmp_path: Path, redis_url: str, engine_config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``acp-worker serve`` with ``ACPW_BACKEND=docker`` and ``ACPW_WARM_POOLS`` on
    Podman: the second job of an identity runs in the slot container made after the
    first (``sandbox.ready`` ``warm``); while it runs, that container carries the
    attempt's labels exactly (its job, attempt, lease token, worker, store, and the pool
    process as owner), no slot's; nothing is left once the worker stopped."""
    from tests.integration.test_drain import ANSWER, GATED, _question
    from tests.integration.test_service import BROKER_URL, Worker, _flush, job, wait_for
    from tests.integration.test_service import _settings as service_settings

    worker_id = "it-warm-docker-served"
    engine = {
        "ACPW_BACKEND": "docker",
        "ACPW_DOCKER_HOST": str(engine_config.docker_host),
        "ACPW_IMAGES_DIR": str(engine_config.images_dir),
    }
    for name, value in engine.items():
        monkeypatch.setenv(name, value)
    settings = Settings(backend="docker", redis_url=redis_url, worker_id=worker_id)
    backend = get_backend(backend_config(settings))

    def ours() -> list[Any]:
        return asyncio.run(backend.list({"acpw.worker": worker_id}))

    _flush(BROKER_URL)
    pools = {"ACPW_WARM_POOLS": json.dumps({PACK: 1})}
    worker = Worker(tmp_path / "worker.log", worker_id=worker_id, concurrency=1, env=engine | pools)
    try:
        with Client(redis_url, settings=service_settings()) as client:
            client.submit(job("warm-docker-1"))
            first = [e.event for e in client.events("warm-docker-1", follow=True, timeout=120)]
            assert first[-1]["data"]["status"] == "succeeded"
            assert "warm" not in _ready(first)
            assert _ready(first)["backend"] == "docker"
            wait_for(lambda: _slots_ready(worker.log) >= 1, "a warm slot", 120)
            [slot] = [s for s in ours() if LABEL_SLOT in s.labels]

            # A job held at a question, so that its container is seen while it runs.
            client.submit(job("warm-docker-2", GATED))
            question = _question(client, "warm-docker-2", 1)
            [claimed] = [s for s in ours() if s.labels.get(LABEL_JOB) == "warm-docker-2"]
            assert claimed.sandbox_id == slot.sandbox_id
            with redis.Redis.from_url(redis_url) as sync:  # the lease: <token>:<nonce>
                token = (sync.get(keys.lease("warm-docker-2")) or b"").decode().split(":")[0]
            assert token not in ("", "0")
            attempt = sandbox_labels(
                settings, job_id="warm-docker-2", attempt=1, labels={LABEL_TOKEN: token}
            )
            # The owner is the pool process's, which made the slot and runs the job; the
            # backend's own labels (which backend, which sandbox) are the slot's still.
            attempt["acpw.owner"] = slot.labels["acpw.owner"]
            backend_own = {k: slot.labels[k] for k in ("acpw.backend", "acpw.sandbox")}
            assert dict(claimed.labels) == attempt | backend_own
            client.answer("warm-docker-2", question, ANSWER)
            second = [e.event for e in client.events("warm-docker-2", follow=True, timeout=120)]
            assert second[-1]["data"]["status"] == "succeeded"
            ready = _ready(second)
            assert ready["warm"] is True
            assert ready["backend"] == "docker"
            assert ready["sandbox_id"] == slot.sandbox_id
            wait_for(lambda: _slots_ready(worker.log) >= 2, "the slot's replacement", 120)
    finally:
        worker.stop()
        _flush(BROKER_URL)
    assert ours() == []  # the drain destroyed the replacement slot
