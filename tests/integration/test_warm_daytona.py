"""Warm pools on the daytona backend, against the double of Daytona's API
(``tests/daytona_double``: Daytona's hosted service cannot be reached from here; the
double validates every request with the SDK's own models and runs the sandbox's
commands — the relay, the Cursor emulator agent — as real processes under bubblewrap),
a real Redis, jobs delivered as the service delivers them (``run_delivery``).

The first job of a launch identity is cold and leaves a slot sandbox behind, its agent
started and initialized; the next one claims it: the sandbox is relabelled to the
attempt through Daytona's label call (so any reaper judges it by the attempt's lease),
the job's staged workspace is uploaded into it through the file API, and the job's
changes are those of the cold job; the slot serves that one job and is replaced; a job
with other credentials misses; an idle slot holds no file, log or command line with a
secret; a slot whose record lapsed (its worker died) is reaped; an aged one is
destroyed; the relabel survives Daytona's 429/5xx answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.daytona_double import DaytonaDouble
from tests.integration.test_daytona_backend import (
    REPO,
    SECRET,
    _closure,
    _config,
    _until,
    double,
    serve_on_double,
)
from tests.integration.test_warm import (
    _changed,
    _claimed,
    _deliver,
    _job,
    _ready,
    _running,
    _until_idle,
)
from tests.integration.test_warm import _settings as _warm_settings
from worker.client import Client
from worker.errors import SandboxError
from worker.job.warm import WarmPool
from worker.jobs.spec import parse_job
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SLOT,
    LABEL_TOKEN,
    LeaseDeadline,
    ResourceLimits,
    Sandbox,
    SandboxSpec,
    SlotHost,
)
from worker.sandbox.daytona import DaytonaBackend, DaytonaSandbox
from worker.service.reaper import reap_once
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store import warm as records
from worker.store.owner import owner_labels

__all__ = ["double"]  # the fixture, used below

pytestmark = pytest.mark.integration

PROMPT = (
    "#!scenario\n"
    "exec cat README.md .cursor/rules/style.mdc\n"
    "write notes/daytona.txt written in the sandbox\n"
    "say Hello from the slot\n"
)


def _settings(tmp_path: Path) -> Settings:
    return _warm_settings(tmp_path, "daytona").model_copy(
        update={"packs_dir": REPO / "provider_packs"}
    )


@pytest.fixture
async def warm_backend(tmp_path: Path, double: DaytonaDouble) -> AsyncIterator[DaytonaBackend]:
    made = DaytonaBackend(_config(tmp_path, double, worker_id="it-warm-daytona"))
    try:
        yield made
    finally:
        await made.aclose()


def _secret_files(double: DaytonaDouble, secret: str) -> list[str]:
    """Every file of every live sandbox of the double holding ``secret``."""
    return [
        str(path)
        for record in double.sandboxes.values()
        for path in record.root.rglob("*")
        if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes()
    ]


async def test_a_warm_daytona_job_runs_in_its_relabelled_slot(
    tmp_path: Path, redis_url: str, double: DaytonaDouble, warm_backend: DaytonaBackend
) -> None:
    settings = _settings(tmp_path)
    backend = warm_backend
    assert isinstance(backend, SlotHost)
    assert backend.capabilities.warm_slots
    pool = WarmPool(settings, backend, backend_config=backend.config.model_dump_json())

    # Once assigned (before the fill): listed as the attempt's sandbox, kept by a reaper
    # (the attempt's lease holds). After the fill: the staged workspace is in the sandbox.
    seen: list[tuple[dict[str, str], list[str], dict[str, bytes]]] = []
    fill = backend.fill

    async def fill_seen(sandbox: Sandbox, staged: Path) -> Path:
        [info] = await backend.list({LABEL_JOB: _running[-1]})
        assert info.sandbox_id == sandbox.sandbox_id
        client = aioredis.Redis.from_url(redis_url)
        try:
            report = await reap_once(client, settings, {"daytona": DaytonaBackend(backend.config)})
        finally:
            await client.aclose()
        filled = await fill(sandbox, staged)
        assert isinstance(sandbox, DaytonaSandbox)
        [record] = [r for r in double.sandboxes.values() if r.dto["name"] == sandbox.sandbox_id]
        inside = {
            str(p.relative_to(record.root / "workspace")): p.read_bytes()
            for p in (record.root / "workspace").rglob("*")
            if p.is_file()
        }
        seen.append((dict(info.labels), list(report.destroyed), inside))
        return filled

    backend.fill = fill_seen  # type: ignore[method-assign]

    def job(key: str) -> dict[str, Any]:
        return {**_job(tmp_path, key), "prompt": PROMPT}

    try:
        # Cold: nothing to claim; a slot of this identity is made once the job settled.
        first = await _deliver(job("alpha"), settings, pool)
        assert _ready(first).keys() == {"backend", "sandbox_id"}
        assert first[-1]["data"]["status"] == "succeeded"
        await _until_idle(pool, 1)
        [slot] = pool.idle()
        [listed] = await backend.list({LABEL_SLOT: slot.slot_id})
        assert listed.sandbox_id == slot.sandbox.sandbox_id
        assert listed.labels[LABEL_TOKEN] == "0"
        # Claimable, it holds the secret of its own binding in its agent's memory only:
        # no header left in /tmp, no file, command line or log with it.
        assert "alpha-secret-value" in slot.recipe.plan.env.values()
        assert _secret_files(double, "alpha-secret-value") == []
        assert not any("alpha-secret-value" in text for text in double.logged)

        # Warm: the same identity claims it; relabelled, filled, run, gone with its job.
        second = await _deliver(job("alpha"), settings, pool)
        ready = _ready(second)
        assert ready["warm"] is True
        assert ready["backend"] == "daytona"
        assert ready["sandbox_id"] == slot.sandbox.sandbox_id
        assert second[-1]["data"]["status"] == "succeeded"
        [(labels, reaped, inside)] = seen
        assert LABEL_SLOT not in labels
        assert labels[LABEL_JOB] == _running[-1]
        assert labels[LABEL_TOKEN] not in ("", "0")  # the attempt's lease's fence
        assert slot.sandbox.sandbox_id not in reaped
        # Daytona's label call replaced the whole set with exactly the attempt's.
        [(name, replaced)] = double.relabels
        assert name == slot.sandbox.sandbox_id
        # (the SDK's own label, set at create, is kept as it was)
        assert {k: v for k, v in replaced.items() if k != "code-toolbox-language"} == labels
        # The staged workspace went in through the file API (the config under the mask
        # anchor too), and the agent read it there.
        assert inside["README.md"] == b"# hello\n"
        assert inside[".cursor/rules/style.mdc"] == b"be brief\n"
        assert "be brief" in json.dumps(second)
        # The same changes as the cold job's.
        assert _changed(second) == _changed(first)
        paths = {(p["path"], p["status"]) for p in _changed(second)["paths"]}
        assert ("notes/daytona.txt", "added") in paths
        # One use: the slot's sandbox went with its job; a new one replaces it.
        assert await backend.list({LABEL_SLOT: slot.slot_id}) == []
        assert await backend.list({LABEL_JOB: _running[-1]}) == []
        assert not slot.directory.exists()
        await _until_idle(pool, 1)
        [replacement] = pool.idle()
        assert replacement.slot_id != slot.slot_id

        # Aged past ACPW_WARM_MAX_IDLE_S: destroyed by the pool's keeper.
        pool.settings = settings.model_copy(update={"warm_max_idle_s": 0.01})
        await asyncio.sleep(0.02)  # older than that, however recently it was made
        await pool.tend()
        pool.settings = settings
        assert pool.idle() == []
        assert await backend.list({LABEL_SLOT: replacement.slot_id}) == []

        # Another credential binding misses; the slot made for it holds its secret only.
        third = await _deliver(job("beta"), settings, pool)
        assert "warm" not in _ready(third)
        await _until_idle(pool, 1)
        [orphan] = pool.idle()
        values = set(orphan.recipe.plan.env.values())
        assert "beta-secret-value" in values
        assert "alpha-secret-value" not in values
        assert _secret_files(double, "beta-secret-value") == []

        # Its worker died (its record lapses unrenewed): another process's reaper deletes
        # it by its labels alone.
        client = aioredis.Redis.from_url(redis_url)
        reaper = DaytonaBackend(backend.config)
        try:
            await client.delete(keys.warm_slot(orphan.slot_id))
            report = await reap_once(client, settings, {"daytona": reaper})
        finally:
            await client.aclose()
            await reaper.aclose()
        assert orphan.sandbox.sandbox_id in report.destroyed
        assert orphan.sandbox.sandbox_id not in {r.dto["name"] for r in double.sandboxes.values()}
        await pool.tend()  # its renewal fails: the pool lets it go
        assert pool.idle() == []
    finally:
        await pool.close()
    assert await backend.list({"acpw.worker": settings.worker_id}) == []
    assert double.sandboxes == {}


def _slot_spec(tmp_path: Path, slot_id: str) -> SandboxSpec:
    workspace = tmp_path / "slot-ws"
    workspace.mkdir()
    return SandboxSpec(
        job_id=f"warm-{slot_id}",
        attempt=1,
        workspace=workspace,
        pack_closure=_closure(tmp_path),
        limits=ResourceLimits(memory_bytes=512 * 1024**2, cpus=1.0, pids=128),
        labels={
            LABEL_JOB: f"warm-{slot_id}",
            LABEL_ATTEMPT: "1",
            LABEL_TOKEN: "0",
            LABEL_SLOT: slot_id,
            **owner_labels(),
        },
    )


async def test_a_claimed_slot_is_judged_and_bounded_by_its_attempts_lease(
    tmp_path: Path, redis_url: str, double: DaytonaDouble, warm_backend: DaytonaBackend
) -> None:
    """Once assigned, a slot is the attempt's sandbox to any reaper: kept while the
    attempt's lease holds, even with its slot record gone, deleted once that lease is
    gone. Its agent, started with no lease, is bounded by the attempt's from the
    assignment on: the relay's watchdog kills it when the lease lapses unrenewed.
    The relabel is retried through Daytona's 429 and a 503 that lost the answer of a
    replacement it applied."""
    settings = _settings(tmp_path).model_copy(update={"redis_url": redis_url})
    backend = warm_backend
    slot_id = uuid.uuid4().hex[:16]
    spec = parse_job(_job(tmp_path, "alpha"))
    reaper = DaytonaBackend(backend.config)
    client = aioredis.Redis.from_url(redis_url)

    async def reaped() -> list[str]:
        return list((await reap_once(client, settings, {"daytona": reaper})).destroyed)

    try:
        assert await records.register(client, slot_id, owner="it", ttl_s=30)
        sandbox = await backend.create(_slot_spec(tmp_path, slot_id))
        script = "import time\nprint('agent up',flush=True)\ntime.sleep(120)"
        proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"agent up\n"
        assert sandbox.sandbox_id not in await reaped()  # its record is alive

        lease, labels = await _claimed(client, redis_url, settings, spec, slot_id)
        double.fail_next("PUT", r"/labels$", 429, "Too Many Requests", Retry_After="1")
        double.fail_next("PUT", r"/labels$", 503, "Service Unavailable", after=True)
        deadline = LeaseDeadline(time.monotonic() + 30.0)
        await backend.assign(sandbox, labels=labels, lease_deadline=deadline)
        # Three calls (429, applied then 503, applied again): one outcome.
        assert [m for m, p in double.requests if p.endswith("/labels")] == ["PUT"] * 3
        assert len(double.relabels) == 2
        await client.delete(keys.warm_slot(slot_id))  # the claimed record lapsed
        [info] = await backend.list({LABEL_JOB: spec.job_id})
        assert info.sandbox_id == sandbox.sandbox_id
        assert LABEL_SLOT not in info.labels
        assert sandbox.sandbox_id not in await reaped()  # the lease holds

        # Renewed once, then no more (a frozen worker): the agent dies with the lease.
        deadline.extend(time.monotonic() + 2.0)
        renewed = time.monotonic()
        assert await asyncio.wait_for(proc.wait(), 30) == -9  # the relay's 137: SIGKILL
        assert time.monotonic() - renewed >= 1.5  # not before the renewed lease lapsed
        assert b"the lease lapsed unrenewed" in await proc.stderr.read()

        assert await leases.release(client, lease)
        assert sandbox.sandbox_id in await reaped()
        assert await backend.list({LABEL_JOB: spec.job_id}) == []
    finally:
        await client.aclose()
        await reaper.aclose()


async def test_a_relabel_daytona_refuses_fails_the_assignment(
    tmp_path: Path, double: DaytonaDouble, warm_backend: DaytonaBackend
) -> None:
    """A sandbox gone under its slot (404 to the label call) fails the claim with a
    typed error, and the slot keeps its slot labels (a reaper still judges it by its
    record). The double refuses a label set the SDK's ``SandboxLabels`` model refuses
    (a value that is not a string), replacing nothing."""
    slot_id = uuid.uuid4().hex[:16]
    sandbox = await warm_backend.create(_slot_spec(tmp_path, slot_id))
    labels = {LABEL_JOB: "job-x", LABEL_ATTEMPT: "1", LABEL_TOKEN: "9"}
    double.fail_next("PUT", r"/labels$", 404, "Sandbox not found")
    with pytest.raises(SandboxError) as refused:
        await warm_backend.assign(sandbox, labels=labels, lease_deadline=None)
    assert refused.value.details["status"] == 404
    assert LABEL_SLOT in (await warm_backend.list({LABEL_JOB: f"warm-{slot_id}"}))[0].labels
    auth = {"Authorization": f"Bearer {double.api_key}"}
    url = f"{double.api_url}/sandbox/{sandbox.sandbox_id}/labels"
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.put(url, json={"labels": {LABEL_JOB: 1}}) as reply:
            assert reply.status == 400
        async with http.put(url, json={"labels": {"a": "b"}}) as reply:
            assert reply.status == 200
            assert await reply.json() == {"labels": {"a": "b"}}
    assert double.relabels == [(sandbox.sandbox_id, {"a": "b"})]
    await warm_backend.destroy(sandbox.sandbox_id)
    assert double.sandboxes == {}


async def test_a_slots_mask_points_are_admitted_and_anything_more_refused(
    tmp_path: Path, double: DaytonaDouble, warm_backend: DaytonaBackend
) -> None:
    """A warm slot's relay made its mask points before its job's re-admission: the
    sandbox's view admits exactly those (an empty file at a file mask, an empty directory
    at a directory mask, which the agent sees read-only); content at a masked path —
    settings written there, a plugin in a masked directory — is refused as before."""
    slot_id = uuid.uuid4().hex[:16]
    sandbox = await warm_backend.create(_slot_spec(tmp_path, slot_id))
    assert isinstance(sandbox, DaytonaSandbox)
    script = "import time\nprint('agent up',flush=True)\ntime.sleep(120)"
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"agent up\n"
    [record] = double.sandboxes.values()
    made = record.root / "workspace"
    assert (made / ".claude" / "settings.json").read_bytes() == b""  # the relay's
    assert (made / ".cursor" / "plugins").is_dir()
    view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
    assert view.admitted, view.to_dict()

    (made / ".cursor" / "plugins" / "evil").mkdir()
    (made / ".claude" / "settings.json").write_text('{"hooks": {"Stop": []}}')
    view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
    assert {f.path for f in view.findings} >= {".claude/settings.json", ".cursor/plugins"}
    await warm_backend.destroy(sandbox.sandbox_id)


async def test_an_idle_slot_keeps_its_sandbox_active_until_claimed(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """Daytona's auto-stop counts API calls only and an idle slot has no lease whose
    renewals would refresh it: its process refreshes its activity every
    ``daytona_activity_every_s`` while it waits, and stops once the slot is claimed
    (from then on the attempt's lease renewals do it)."""
    backend = DaytonaBackend(_config(tmp_path, double, daytona_activity_every_s=0.05))
    try:
        sandbox = await backend.create(_slot_spec(tmp_path, uuid.uuid4().hex[:16]))
        for _ in range(200):
            if double.activity_refreshes(sandbox.sandbox_id) >= 3:
                break
            await asyncio.sleep(0.05)
        assert double.activity_refreshes(sandbox.sandbox_id) >= 3
        labels = {LABEL_JOB: "job-k", LABEL_ATTEMPT: "1", LABEL_TOKEN: "3"}
        await backend.assign(sandbox, labels=labels, lease_deadline=None)
        claimed = double.activity_refreshes(sandbox.sandbox_id)
        await asyncio.sleep(0.5)  # ten intervals: none is refreshed by the slot's keeper
        assert double.activity_refreshes(sandbox.sandbox_id) == claimed
        [info] = await backend.list({LABEL_JOB: "job-k"})
        assert info.labels[LABEL_TOKEN] == "3"
    finally:
        await backend.aclose()
    assert double.sandboxes == {}


async def test_a_served_daytona_job_claims_the_slot_its_predecessor_left(
    tmp_path: Path, double: DaytonaDouble, redis_url: str
) -> None:
    """``acp-worker serve`` with ``ACPW_BACKEND=daytona`` and ``ACPW_WARM_POOLS``: the
    slot made after the first job lives on the pool process's long-lived loop (its SDK
    client with it) and the second job of the identity runs in it; on SIGTERM the idle
    slot made after that is destroyed, never handed back."""
    broker, serve, log = serve_on_double(
        tmp_path,
        double,
        redis_url,
        "w-served-warm",
        ACPW_WARM_POOLS=json.dumps({"cursor-emulator": 1}),
    )

    def slots() -> list[str]:
        return [r.dto["name"] for r in double.sandboxes.values() if LABEL_SLOT in r.dto["labels"]]

    readies = []
    try:
        await _until(lambda: " ready." in log.read_text(), 90)
        settings = Settings(redis_url=redis_url, broker_url=broker)
        with Client(redis_url, settings=settings) as client:
            for made, job_id in enumerate(("dt-warm-1", "dt-warm-2"), start=1):
                (tmp_path / job_id).mkdir()
                (tmp_path / job_id / "README.md").write_text("# served\n")
                job = {
                    "v": 1, "job_id": job_id, "pack": {"name": "cursor-emulator"},
                    "workspace": {"kind": "local", "path": str(tmp_path / job_id)},
                    "prompt": "scenario: hello", "credentials": {"CURSOR_API_KEY": "file:key"},
                    "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
                }  # fmt: skip
                await asyncio.to_thread(client.submit, job)

                def done(job_id: str = job_id) -> list[dict[str, Any]]:
                    events = [dict(item.event) for item in client.events(job_id)]
                    return events if events and events[-1]["type"] == "job.completed" else []

                events = await _until(done, 90)
                assert events[-1]["data"]["status"] == "succeeded", log.read_text()[-3000:]
                readies.append(_ready(events))
                await _until(lambda n=made: log.read_text().count(" ready (made in ") >= n, 90)
        assert "warm" not in readies[0]
        assert readies[1]["warm"] is True
        assert readies[1]["backend"] == "daytona"
        [slot] = slots()  # the replacement, made after the second job
        assert slot != readies[1]["sandbox_id"]
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        await asyncio.to_thread(serve.wait, 60)
    assert double.sandboxes == {}  # the drain destroyed the idle slot
    assert SECRET not in log.read_text()
    assert all(SECRET not in text for text in double.logged)
