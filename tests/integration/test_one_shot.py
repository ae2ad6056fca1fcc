"""The one-shot overhead of ``acp-worker run`` (issue 14, item 5): what a plain local run
loads, and how the job ends. Figures are in benchmarks/one_shot.py and docs/figures.md;
nothing here asserts a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_run_job import REPO, _env, _events, _job
from worker.job.prepare import hold_pack
from worker.packs import verified
from worker.packs.runtime import load_declaration
from worker.sandbox.fake import FakeBackend
from worker.settings import Settings

#: Modules a plain local run must not load: the S3 SDK (no bucket named), the broker and
#: Redis (no ``--redis``), the docker SDK (the local backend), and the worker's own
#: lease, ownership and service modules that only a leased run uses.
FORBIDDEN = ("boto3", "botocore", "s3transfer", "celery", "kombu", "docker", "redis")
FORBIDDEN_WORKER = ("worker.store.lease", "worker.store.scripts", "worker.service", "tasks")

#: Runs the CLI as `python -m worker.cli` does, and writes the names of every module
#: loaded once the interpreter exits (atexit: after the job's last event and teardown).
_HOOK = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "acp-worker"
runpy.run_module("worker.cli", run_name="__main__", alter_sys=True)
"""


def _loaded(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_a_plain_local_run_loads_no_sdk_broker_or_redis_module(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello")
    modules = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", _HOOK, str(modules), "run", str(job), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    events = _events(proc.stdout)
    assert events[-1]["data"]["status"] == "succeeded"
    loaded = json.loads(modules.read_text())
    assert "worker.job.pipeline" in loaded  # the hook saw the run
    assert [m for m in loaded if _loaded(m, FORBIDDEN)] == []
    assert [m for m in loaded if _loaded(m, FORBIDDEN_WORKER)] == []


class _SameUidBackend(FakeBackend):
    """Sandboxes that run as the worker's own uid (a non-root worker's)."""

    def stage_owner(self) -> tuple[int, int]:
        return os.geteuid(), os.getegid()


async def _launches(tmp_path: Path, backend: FakeBackend, count: int) -> list[int]:
    """The bytes re-hashed by each of ``count`` launches' pack preparations."""
    settings = Settings(cache_dir=tmp_path / "cache")
    declaration = load_declaration(settings, "cursor-emulator")
    hashed = []
    for _ in range(count):
        pack, hold = await hold_pack(settings, declaration, platform=None, backend=backend)
        os.close(hold)
        hashed.append(pack.stats.hashed_bytes)
        time.sleep(0.03)  # past the (lowered) racy window of the closure's extraction
    return hashed


async def test_a_launch_rehashes_only_a_closure_not_verified_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real preparation, with the emulator pack: the first launch re-hashes (no
    record yet) and records unless its scan raced the closure's extraction (then the
    second does), the later ones use the record; a sandbox running as the worker's uid
    never lets a record stand."""
    monkeypatch.setattr(verified, "RACY_NS", 10_000_000)
    hashed = await _launches(tmp_path / "a", FakeBackend(), 4)
    assert hashed[0] > 0
    assert hashed[2:] == [0, 0]
    if os.geteuid() == 0:  # else FakeBackend's sandboxes run as the worker's uid too
        assert all(await _launches(tmp_path / "b", _SameUidBackend(), 3))
