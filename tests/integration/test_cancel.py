"""Cancels that arrive before the agent is launched, in process: real Redis, real
bubblewrap (the local backend), the Cursor emulator pack.

A cancel already in ``acpw:{J}:control`` when a worker takes the job settles it at once;
one that arrives during preparation stops the job at the next phase boundary. Either way
``job.completed`` says ``cancelled``, a ``cancelled_before_launch`` notice names the
phase that never began, and whatever the job had made is gone.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.conftest import REDIS_URL
from tests.integration.job_settings import job_settings
from worker.client import Client
from worker.errors import EXIT_CANCELLED
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.service.guarded import Delivery, run_delivery
from worker.settings import Settings
from worker.store import jobs as store_jobs
from worker.store import keys
from worker.store.control import CANCEL, ControlWatcher, control_fields

pytestmark = pytest.mark.integration

Event = Mapping[str, Any]
NOT_LAUNCHED = "cancelled_before_launch"


def _settings(tmp_path: Path) -> Settings:
    return job_settings(tmp_path, "it-cancel")


def _job(tmp_path: Path, prompt: str = "scenario: hello") -> dict[str, Any]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("# hello\n")
    os.mkfifo(workspace / "pipe")  # not copied: a notice right after staging says so
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("cancel-test-key-5e1b\n")
    return {
        "v": 1,
        "job_id": f"cancel-{uuid.uuid4().hex[:10]}",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(workspace)},
        "prompt": prompt,
        "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
    }


def _types(events: Sequence[Event]) -> list[str]:
    return [e["type"] for e in events]


def _notices(events: Sequence[Event], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]


def _left_behind(tmp_path: Path, job_id: str) -> dict[str, Any]:
    """What the job could have left: sandboxes by label, work dirs, held pack locks."""
    sandboxes = asyncio.run(
        LocalBackend(LocalConfig.from_settings(_settings(tmp_path))).list({LABEL_JOB: job_id})
    )
    work = tmp_path / "work"
    return {
        "sandboxes": sandboxes,
        "work": sorted(p.name for p in work.iterdir()) if work.exists() else [],
        "held": _held_locks(tmp_path / "cache" / "locks"),
    }


def _held_locks(locks: Path) -> list[str]:
    """Pack-closure locks someone still holds (a job holds one shared until teardown)."""
    held = []
    for path in sorted(locks.glob("*.lock")) if locks.exists() else []:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(path.name)
        finally:
            os.close(fd)
    return held


# --- a cancel written while the job was still queued ----------------------------------


def test_a_job_cancelled_while_queued_does_no_work(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path)
    job_id = job["job_id"]
    _submit_without_enqueueing(redis_url, job)
    with Client(redis_url) as client:
        assert client.cancel(job_id).status == "queued"
        result = asyncio.run(
            run_delivery(Delivery(job, attempt=1), settings=_settings(tmp_path), environ={})
        )
        events = [dict(item.event) for item in client.events(job_id)]
        state = client.get(job_id)
    assert (result.outcome, result.status, result.error) == ("ran", "cancelled", None)
    assert state.status == "cancelled"
    assert _types(events) == [
        "job.accepted",
        "job.started",
        "notice",
        "usage.reported",
        "job.completed",
    ]
    assert [n["details"] for n in _notices(events, NOT_LAUNCHED)] == [{"next_phase": "credentials"}]
    done = events[-1]["data"]
    assert (done["status"], done["stop_reason"], done["error"]) == ("cancelled", None, None)
    assert not (tmp_path / "cache").exists()  # no pack was even materialized
    assert _left_behind(tmp_path, job_id) == {"sandboxes": [], "work": [], "held": []}


def _submit_without_enqueueing(redis_url: str, job: dict[str, Any]) -> None:
    """The state a control plane's submit writes (queued, attempt 1). The broker is left
    out: this test is the worker that takes the message."""
    import redis

    from worker.client.client import spec_digest

    spec = parse_job(job)
    with redis.Redis.from_url(redis_url) as client:
        reply = store_jobs.submit(
            client,
            spec.job_id,
            job_json=spec.model_dump_json(),
            new_attempt=False,
            digest=spec_digest(spec),
        )
    assert reply.outcome == "created"


# --- a cancel that arrives during preparation (or before the prompt) --------------------


class CancelOn:
    """An event sink that, at the first event ``when`` picks, writes a cancel to the
    job's control stream (what ``Client.cancel`` writes) and returns only once the job's
    :class:`ControlWatcher` has seen it. The job waits in that ``emit``, so the cancel
    lands in a known phase without sleeping or racing the job."""

    def __init__(
        self, client: aioredis.Redis, seen: asyncio.Event, when: Callable[[Event], bool]
    ) -> None:
        self.client = client
        self.seen = seen
        self.when = when
        self.fired = False

    async def write(self, event: Event, line: str) -> None:
        if self.fired or not self.when(event):
            return
        self.fired = True
        fields: Any = control_fields(CANCEL, event["attempt"])
        await self.client.xadd(keys.control(event["job_id"]), fields)
        await asyncio.wait_for(self.seen.wait(), 10)

    async def close(self) -> None:
        return None


async def _run_cancelled_on(
    tmp_path: Path, when: Callable[[Event], bool], prompt: str = "scenario: hello"
) -> tuple[Any, list[Event]]:
    """Run one job wired as the service wires it (control watcher, control client),
    cancelling it at the first event ``when`` picks."""
    settings = _settings(tmp_path)
    spec = parse_job(_job(tmp_path, prompt))
    memory = MemorySink()
    cancel = asyncio.Event()
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        async with ControlWatcher(client, spec.job_id, 1, cancel).running():
            outcome = await run_job(
                spec,
                settings=settings,
                backend=LocalBackend(LocalConfig.from_settings(settings)),
                sinks=[memory, CancelOn(client, cancel, when)],
                environ={},
                cancel=cancel,
                control=client,
            )
    finally:
        await client.aclose()
    return outcome, [dict(e) for e in memory.events]


def _is(type_: str, code: str | None = None) -> Callable[[Event], bool]:
    return lambda e: e["type"] == type_ and (code is None or e["data"].get("code") == code)


@pytest.mark.parametrize(
    ("when", "next_phase", "made"),
    [
        # pack ready and held → the workspace (staged meanwhile) is not used
        (_is("pack.ready"), "workspace", {"pack.ready"}),
        # workspace staged (the FIFO notice comes right after) → no sandbox created
        (_is("notice", "workspace_special_files_skipped"), "sandbox_create", {"pack.ready"}),
        # sandbox created → never spawned into
        (_is("sandbox.ready"), "agent_spawn", {"pack.ready", "sandbox.ready"}),
    ],
    ids=["after-pack", "after-workspace", "after-sandbox"],
)
def test_a_cancel_during_preparation_stops_before_the_launch(
    tmp_path: Path,
    redis_url: str,
    when: Callable[[Event], bool],
    next_phase: str,
    made: set[str],
) -> None:
    outcome, events = asyncio.run(_run_cancelled_on(tmp_path, when))
    assert (outcome.status, outcome.exit_code) == ("cancelled", EXIT_CANCELLED)
    types = _types(events)
    assert {"pack.ready", "sandbox.ready"} & set(types) == made
    assert "agent.initialized" not in types
    assert [n["details"] for n in _notices(events, NOT_LAUNCHED)] == [{"next_phase": next_phase}]
    assert types[-1] == "job.completed"
    done = events[-1]["data"]
    assert (done["status"], done["stop_reason"], done["error"]) == ("cancelled", None, None)
    assert "agent_spawn" not in done["timings_ms"]
    job_id = events[0]["job_id"]
    assert _left_behind(tmp_path, job_id) == {"sandboxes": [], "work": [], "held": []}


def test_a_cancel_before_the_prompt_sends_none(tmp_path: Path, redis_url: str) -> None:
    """Once the agent runs, a cancel that comes before the turn ends the job without a
    prompt: the agent is shut down, and no notice claims it never started."""
    outcome, events = asyncio.run(_run_cancelled_on(tmp_path, _is("session.started")))
    assert (outcome.status, outcome.exit_code) == ("cancelled", EXIT_CANCELLED)
    types = _types(events)
    assert "agent.initialized" in types
    assert "message.delta" not in types  # the emulator says hello only when prompted
    assert _notices(events, NOT_LAUNCHED) == []
    done = events[-1]["data"]
    assert (done["status"], done["stop_reason"], done["error"]) == ("cancelled", None, None)
    assert "turn" not in done["timings_ms"]
    assert _left_behind(tmp_path, events[0]["job_id"]) == {
        "sandboxes": [],
        "work": [],
        "held": [],
    }


def test_a_cancel_during_the_turn_still_interrupts_it(tmp_path: Path, redis_url: str) -> None:
    outcome, events = asyncio.run(
        _run_cancelled_on(tmp_path, _is("message.delta"), prompt="scenario: hang")
    )
    assert (outcome.status, outcome.exit_code) == ("cancelled", EXIT_CANCELLED)
    done = events[-1]["data"]
    assert done["stop_reason"] == "cancelled"  # the emulator honoured session/cancel
    # Every phase reached has its time: the turn a cancel cut short too (not charged to
    # the teardown after it).
    assert list(done["timings_ms"]) == [
        "credentials",
        "pack_verify",
        "workspace",
        "sandbox_create",
        "agent_spawn",
        "initialize",
        "session_new",
        "turn",
        "teardown",
        "capture",
    ]
    assert _notices(events, NOT_LAUNCHED) == []
    assert _types(events).count("job.completed") == 1
    assert _left_behind(tmp_path, events[0]["job_id"])["sandboxes"] == []
