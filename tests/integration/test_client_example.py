"""docs/client.md's runnable example, run for real: ``examples/control_plane.py`` against
a real ``acp-worker serve`` and Redis submits the Cursor tour, answers its question, plan
and permission ask from the typed ``interaction.requested`` events, and sees the job
succeed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.test_service import BROKER_URL, REDIS_URL, REPO, Worker, _flush


def test_the_control_plane_example_runs_the_tour_to_success(tmp_path: Path) -> None:
    job = json.loads((REPO / "examples" / "cursor-tour.json").read_text())
    job["job_id"] = f"client-example-{tmp_path.name[-8:]}".replace("_", "-")
    job["workspace"]["path"] = str(REPO / "examples" / job["workspace"]["path"])
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(job))
    _flush(REDIS_URL)
    _flush(BROKER_URL)
    worker = Worker(tmp_path / "worker.log", worker_id="it-client-example")
    runs = []
    try:
        env = {**os.environ, "ACPW_REDIS_URL": REDIS_URL, "ACPW_BROKER_URL": BROKER_URL}
        example = [sys.executable, str(REPO / "examples" / "control_plane.py"), str(job_file)]
        # Then again, as docs/client.md runs it: a new attempt answers its own questions,
        # not the first attempt's (resolved) ones.
        for argv in (example, [*example, "--new-attempt"]):
            done = subprocess.run(
                argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
                check=False,
            )  # fmt: skip
            runs.append(done)
    finally:
        worker.stop()
        _flush(BROKER_URL)
    for attempt, done in enumerate(runs, start=1):
        assert done.returncode == 0, done.stdout + done.stderr + worker.log.read_text()[-3000:]
        outcome = "created" if attempt == 1 else "retried"
        _check(done.stdout.splitlines(), f"{job['job_id']}: {outcome}, attempt {attempt}")


def _check(lines: list[str], first: str) -> None:
    assert lines[0] == first
    asked = [line for line in lines if line.startswith("asked: ")]
    assert [line.split(",")[0] for line in asked] == [
        "asked: question",
        "asked: plan",
        "asked: permission",
    ]
    assert any(line.startswith("agent: ") for line in lines)
    assert lines[-1].startswith("job succeeded in ")
