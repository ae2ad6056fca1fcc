"""A cold job's path: its directory removed once ``job.completed`` is written, its pack
checked while its workspace is staged. Real jobs (the emulator in bubblewrap, a real
loop-mounted workspace disk when root), a real reaper, a real dead worker process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.integration.test_cancel import _job, _left_behind, _settings, _types
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.service.reaper import reap_once
from worker.workspace import disk
from worker.workspace.prepare import read_labels

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


class _SeesWorkDir(MemorySink):
    """Keeps events; when ``job.completed`` is written, what the work directory held."""

    def __init__(self, work: Path) -> None:
        super().__init__()
        self._work = work
        self.at_completed: list[Path] = []
        self.mounted_at_completed: list[Path] = []
        self.labels_at_completed: list[dict[str, str] | None] = []

    async def write(self, event: Mapping[str, object], line: str) -> None:
        await super().write(event, line)
        if event["type"] == "job.completed":
            self.at_completed = sorted(self._work.iterdir())
            self.mounted_at_completed = disk.mounts_below(self._work)
            self.labels_at_completed = [read_labels(p) for p in self.at_completed]


def _run(tmp_path: Path, job: dict[str, Any], sink: MemorySink) -> str:
    settings = _settings(tmp_path)
    outcome = asyncio.run(
        run_job(
            parse_job(job),
            settings=settings,
            backend=LocalBackend(LocalConfig.from_settings(settings)),
            sinks=[sink],
            environ={},
            cancel=asyncio.Event(),
        )
    )
    return outcome.status


def test_the_job_dir_is_removed_once_job_completed_is_written(tmp_path: Path) -> None:
    """No result depends on the removal: ``job.completed`` goes out first, and the
    directory (its disk unmounted, when the worker can mount one) is gone by the time
    ``run_job`` returns, as a one-shot ``acp-worker run`` exits."""
    job = _job(tmp_path)
    sink = _SeesWorkDir(tmp_path / "work")
    assert _run(tmp_path, job, sink) == "succeeded"
    assert _types(sink.events)[-1] == "job.completed"
    [job_dir] = sink.at_completed
    [labels] = sink.labels_at_completed
    assert labels is not None
    assert labels["acpw.job"] == job["job_id"]
    if os.geteuid() == 0:  # the bounded disk is still mounted, then unmounted
        assert sink.mounted_at_completed == [job_dir / disk.MOUNT]
    assert _left_behind(tmp_path, job["job_id"]) == {"sandboxes": [], "work": [], "held": []}
    assert disk.mounts_below(tmp_path) == []


_DYING_WORKER = """
import asyncio, json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.integration.test_cancel import _settings
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend


class Dies:
    async def write(self, event, line):
        if event["type"] == "job.completed":  # written: the worker dies before removing
            print(line, flush=True)
            os._exit(0)

    async def close(self):
        return None


tmp = Path(sys.argv[2])
settings = _settings(tmp)
job = parse_job(json.loads((tmp / "job.json").read_text()))
backend = LocalBackend(LocalConfig.from_settings(settings))
asyncio.run(run_job(job, settings=settings, backend=backend, sinks=[Dies()], environ={}))
"""


async def _reap(redis_url: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """A reaper's pass over this host's local sandboxes and work directories: what it
    destroyed, and which directories it removed."""
    client = aioredis.Redis.from_url(redis_url)
    settings = _settings(tmp_path).model_copy(update={"redis_url": redis_url})
    try:
        backend = LocalBackend(LocalConfig.from_settings(settings))
        report = await reap_once(client, settings, {"local": backend})
        return list(report.destroyed), list(report.workspaces)
    finally:
        await client.aclose()


def test_a_worker_dying_after_job_completed_leaves_its_dir_to_the_reaper(
    tmp_path: Path, redis_url: str
) -> None:
    """The sandbox is destroyed and the directory removed after ``job.completed``: a
    worker that dies in between leaves the sandbox quiesced (nothing in it runs) and the
    directory labelled, and the reaper destroys the one and removes the other (their
    owner is gone), disk and all."""
    job = _job(tmp_path)
    (tmp_path / "job.json").write_text(json.dumps(job))
    argv = [sys.executable, "-c", _DYING_WORKER, str(REPO), str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    completed = json.loads(done.stdout.strip().splitlines()[-1])
    assert (completed["type"], completed["data"]["status"]) == ("job.completed", "succeeded")
    left = _left_behind(tmp_path, job["job_id"])
    assert left["held"] == []  # released (the process is gone)
    [sandbox] = left["sandboxes"]
    status = asyncio.run(LocalBackend(LocalConfig.from_settings(_settings(tmp_path))).status(
        sandbox.sandbox_id
    ))  # fmt: skip
    assert status is not None
    assert status.pids == frozenset()
    [name] = left["work"]
    destroyed, removed = asyncio.run(_reap(redis_url, tmp_path))
    # (This host's sandboxes share one state directory: another test's may go too.)
    assert sandbox.sandbox_id in destroyed
    assert removed == [name]
    assert _left_behind(tmp_path, job["job_id"]) == {"sandboxes": [], "work": [], "held": []}
    assert disk.mounts_below(tmp_path) == []


def test_a_failed_pack_check_beside_the_staging_settles_before_any_agent(
    tmp_path: Path,
) -> None:
    """The cold path checks the closure while it stages the workspace: a closure changed
    since its verification fails the job ``digest_mismatch`` once both ended, with no
    sandbox made and no agent started, and the staged directory and the closure's hold
    go with the teardown."""
    job = _job(tmp_path)
    assert _run(tmp_path, job, MemorySink()) == "succeeded"
    target = next((tmp_path / "cache" / "closures").glob("*/cursor_emulator.py"))
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[-2] ^= 0x01
    target.write_bytes(bytes(data))
    target.chmod(0o555)
    second = {**job, "job_id": job["job_id"] + "-b"}
    sink = _SeesWorkDir(tmp_path / "work")
    assert _run(tmp_path, second, sink) == "failed"
    types = _types(sink.events)
    done = sink.events[-1]["data"]
    assert isinstance(done, dict)
    assert done["error"]["code"] == "digest_mismatch"
    assert not {"pack.ready", "sandbox.ready", "agent.initialized"} & set(types)
    assert "agent_spawn" not in done["timings_ms"]
    assert "pack_verify" in done["timings_ms"]
    assert len(sink.at_completed) == 1  # the staging ran beside the check, then went
    assert _left_behind(tmp_path, second["job_id"]) == {"sandboxes": [], "work": [], "held": []}
    assert disk.mounts_below(tmp_path) == []
