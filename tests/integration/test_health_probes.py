"""The probes the Helm chart gives the worker, against a real ``acp-worker serve``.

The chart's liveness probe is ``GET /healthz`` and its readiness probe ``GET /ready``,
both on ``serve --metrics-port`` (helm/acp-worker/templates/deployment.yaml). Liveness
must check the process alone: when Redis goes away, every worker fails readiness at once,
and a liveness probe that did too would have the kubelet restart them all, turning every
running job into a lost one. So: a real Redis of the test's own (``redis-server`` on a free
port, the job store and the broker), a real ``serve``; Redis stopped: ``/healthz`` still
answers 200 and ``/ready`` 503 naming Redis, and the worker process is still running;
Redis back on the same port: ready again. (The chart's liveness probe was ``acp-worker
ready`` before, which fails in the outage: the test runs it too.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_service import _free_port, _get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
ACP_WORKER = str(Path(sys.executable).with_name("acp-worker"))
REDIS_SERVER = shutil.which("redis-server")


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


class Redis:
    """A ``redis-server`` of this test alone (no persistence), on ``port``."""

    def __init__(self, port: int, directory: Path) -> None:
        assert REDIS_SERVER, "redis-server is needed for this test"
        self.port = port
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self._answers, "redis-server", 30)

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def test_a_redis_outage_fails_readiness_never_liveness(tmp_path: Path) -> None:
    redis_port = _free_port()
    redis = Redis(redis_port, tmp_path)
    metrics_port = _free_port()
    url = f"redis://127.0.0.1:{redis_port}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env |= {
        "ACPW_REDIS_URL": url,
        "ACPW_BROKER_URL": url,
        "ACPW_BACKEND": "local",
        "ACPW_WORKER_ID": "it-probes",
        "ACPW_WORK_DIR": str(tmp_path / "work"),
        "ACPW_SESSION_DIR": str(tmp_path / "sessions"),
    }
    log = tmp_path / "serve.log"
    argv = [ACP_WORKER, "serve", "--concurrency", "1", "--no-reaper",
            "--metrics-port", str(metrics_port)]  # fmt: skip
    with log.open("w") as out:
        worker = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(lambda: " ready." in log.read_text(), "the Celery worker")
        status, body = _get(metrics_port, "/ready")
        assert (status, json.loads(body)["ready"]) == (200, True), body
        assert _get(metrics_port, "/healthz")[0] == 200

        redis.stop()  # the outage
        status, body = wait_for(
            lambda: (r := _get(metrics_port, "/ready"))[0] == 503 and r, "readiness to fail"
        )
        assert json.loads(body)["redis"].startswith("error"), body
        # Liveness through the outage: probed a few times, as a kubelet does.
        for _ in range(5):
            assert _get(metrics_port, "/healthz") == (200, '{"ok": true}')
            time.sleep(1)
        assert worker.poll() is None, log.read_text()[-3000:]
        # What the chart's liveness probe was before (`acp-worker ready`, exec) fails here:
        # every worker would have been restarted by the outage.
        before = subprocess.run(
            [ACP_WORKER, "ready"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert before.returncode == 1, before.stdout + before.stderr

        redis = Redis(redis_port, tmp_path)  # back, on the same port
        wait_for(lambda: _get(metrics_port, "/ready")[0] == 200, "readiness to come back")
        assert _get(metrics_port, "/healthz")[0] == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        redis.stop()
