"""The one-shot overhead of ``acp-worker run`` (issue 14, item 5): what a plain local run
loads, and how the job ends. Figures are in benchmarks/one_shot.py and docs/figures.md;
nothing here asserts a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.test_run_job import REPO, _env, _events, _job

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
