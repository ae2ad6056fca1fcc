"""With nothing configured, the control-plane commands use the local Redis's database 0
(as redis-py and Celery default to the local server) and say so on stderr, never on
stdout. A real subprocess with no ``ACPW_*`` variable against the real Redis: database 0
is shared, so the test touches only the keys of one job id of its own and deletes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import REPO
from worker.jobs.spec import parse_job
from worker.store import jobs, keys
from worker.store.url import DEFAULT_REDIS_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def job_in_db0() -> Iterator[str]:
    """A queued job recorded in database 0 (never enqueued: no worker may take it)."""
    job_id = f"acpw-test-default-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(DEFAULT_REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"no Redis at {DEFAULT_REDIS_URL}: {exc}")
    spec = parse_job(
        {
            "v": 1,
            "job_id": job_id,
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": "/tmp"},
            "prompt": "hi",
        }
    )
    reply = jobs.submit(
        client, job_id, job_json=spec.model_dump_json(), new_attempt=False, digest="sha256:x"
    )
    assert reply.outcome == "created"
    try:
        yield job_id
    finally:
        per_job = (keys.state, keys.events, keys.lease, keys.control, keys.interactions)
        client.delete(*(key(job_id) for key in per_job))
        client.close()


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_status_and_cancel_use_the_local_default_and_say_so(job_in_db0: str) -> None:
    status = _cli("status", job_in_db0, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {
        "submitted_at": json.loads(status.stdout)["submitted_at"],
        "spec_digest": "sha256:x",
        "job_id": job_in_db0,
        "attempt": 1,
        "status": "queued",
    }
    [notice] = status.stderr.splitlines()
    assert DEFAULT_REDIS_URL in notice

    cancel = _cli("cancel", job_in_db0, "--json")
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads(cancel.stdout)["cancel"] == "cancel requested"
    assert DEFAULT_REDIS_URL in cancel.stderr
    with redis.Redis.from_url(DEFAULT_REDIS_URL) as client:
        [(_, fields)] = client.xrange(keys.control(job_in_db0))
    assert fields == {b"type": b"cancel", b"attempt": b"1"}


def test_a_configured_redis_is_used_without_a_word(job_in_db0: str) -> None:
    status = _cli("status", job_in_db0, "--json", "--redis", DEFAULT_REDIS_URL)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["job_id"] == job_in_db0
    assert status.stderr == ""


def test_ready_takes_no_default() -> None:
    ready = _cli("ready")
    assert ready.returncode != 0
    assert "no Redis configured" in ready.stderr
