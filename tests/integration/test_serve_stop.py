"""``acp-worker serve`` started and stopped by hand, for real: Celery, Redis, bubblewrap and
the Cursor emulator pack.

Each worker runs in a session of its own with ``TMPDIR`` set to a fresh folder, so "it
left nothing" is exact: no process of its session (live or zombie) once it exited, and
nothing in its temp dir. It is stopped as an operator would: SIGTERM to the ``serve``
process, Ctrl-C (SIGINT to the whole process group, as a terminal sends it), or SIGKILL,
right as a job's task finishes. Celery runs without gossip and mingle; remote control
(``celery inspect``) still answers, and a Redis restart logs no gossip traceback.
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.test_service import (
    ACP_WORKER,
    BROKER_URL,
    REDIS_URL,
    REPO,
    _env,
    _flush,
    _settings,
    completed,
    events_of,
    job,
    sandboxes_left,
    wait_for,
)
from worker.client import Client
from worker.store import keys

pytestmark = pytest.mark.integration


def session_processes(sid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of every process of session ``sid``, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == sid:
            found.append((int(entry.name), fields[0], cmdline.strip()))
    return found


class Served:
    """``acp-worker serve`` in a session of its own, its temp dir a fresh folder."""

    def __init__(self, log: Path, worker_id: str, *, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.tmpdir = Path(tempfile.mkdtemp(prefix="acpw-it-tmpdir-"))
        self.env = (env or _env(worker_id)) | {"TMPDIR": str(self.tmpdir)}
        argv = [ACP_WORKER, "serve", "--concurrency", "2"]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(lambda: " ready." in log.read_text(), "the Celery worker", 90)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def left_in_tmpdir(self) -> list[str]:
        return sorted(os.listdir(self.tmpdir))

    def remove(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture
def served(tmp_path: Path, redis_url: str) -> Iterator[list[Served]]:
    """The workers a test starts; any still running at its end is killed."""
    _flush(BROKER_URL)
    started: list[Served] = []
    yield started
    for worker in started:
        worker.kill()
        worker.remove()
    _flush(BROKER_URL)


def _task_finishing(job_id: str) -> None:
    """Returns as soon as the job's ``job.completed`` is in Redis: its task is returning."""
    with redis.Redis.from_url(REDIS_URL) as r:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            last = r.xrevrange(keys.events(job_id), count=1)
            if last and b'"job.completed"' in last[0][1][b"event"]:
                return
            time.sleep(0.002)
    pytest.fail(f"{job_id} never completed")


STOPS = {
    "sigterm": lambda pid: os.kill(pid, signal.SIGTERM),  # `kill PID`, systemd, Kubernetes
    "ctrl-c": lambda pid: os.killpg(pid, signal.SIGINT),  # a terminal's whole foreground group
}


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_serve_stopped_by_hand_as_its_job_finishes_leaves_nothing(
    served: list[Served], tmp_path: Path, stop: str
) -> None:
    worker = Served(tmp_path / "serve.log", f"it-stop-{stop}")
    served.append(worker)
    running = session_processes(worker.proc.pid)
    assert any(" reap --loop " in cmd for _, _, cmd in running), running
    with Client(REDIS_URL, settings=_settings()) as client:
        client.submit(job(f"stop-{stop}"))
        _task_finishing(f"stop-{stop}")
        STOPS[stop](worker.proc.pid)
        code = worker.proc.wait(60)
        left = session_processes(worker.proc.pid)  # at once: nothing may linger a moment
        events = events_of(client, f"stop-{stop}")
    assert left == [], f"left running after serve exited: {left}"
    assert code == 0  # a clean drain, whichever stop asked for it (Celery's Ctrl-C says 1)
    assert worker.left_in_tmpdir() == []
    assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
    assert sandboxes_left(f"stop-{stop}") == []
    log = worker.log.read_text()
    assert "Traceback" not in log, log[-3000:]


def test_make_serve_demo_stopped_with_ctrl_c_reports_no_error(
    served: list[Served], tmp_path: Path
) -> None:
    """The README's tour: ``make serve-demo``, then Ctrl-C in its terminal (SIGINT to the
    whole foreground group: make, serve, its pool and reaper). serve drains and exits 0,
    so make reports no ``Error``; make itself then ends by the SIGINT it got, as make
    does on every Ctrl-C (a shell shows 130 and nothing else). Nothing is left."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = _env("it-serve-demo") | {"TMPDIR": str(tmpdir)}
    log = tmp_path / "make.log"
    with log.open("w") as out:
        make = subprocess.Popen(
            ["make", "serve-demo"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A terminal's foreground job takes SIGINT (this test may run with it ignored).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
        )
    try:
        wait_for(lambda: " ready." in log.read_text(), "serve-demo's Celery worker", 120)
        os.killpg(make.pid, signal.SIGINT)
        code = make.wait(60)
        left = session_processes(make.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGKILL)
        make.wait()
    text = log.read_text()
    assert "Warm shutdown" in text, text[-3000:]
    assert "Error" not in text, text[-3000:]
    assert code == -signal.SIGINT
    assert left == [], f"left running after make exited: {left}"
    assert sorted(os.listdir(tmpdir)) == []


def test_a_killed_serve_leaves_no_process_and_nothing_in_the_temp_dir(
    served: list[Served], tmp_path: Path
) -> None:
    """SIGKILL of the worker alone: its pool processes and its reaper go with it (the
    kernel signals them), and the pool left no ``pymp-*`` folder (it made none)."""
    worker = Served(tmp_path / "serve.log", "it-stop-kill")
    served.append(worker)
    worker.proc.kill()
    worker.proc.wait()
    wait_for(
        lambda: all(state == "Z" for _, state, _ in session_processes(worker.proc.pid)),
        "the worker's children to die with it",
        10,
    )
    assert worker.left_in_tmpdir() == []


def test_remote_control_answers_a_worker_without_gossip_or_mingle(
    served: list[Served], tmp_path: Path
) -> None:
    worker = Served(tmp_path / "serve.log", "it-inspect")
    served.append(worker)
    log = worker.log.read_text()
    assert "mingle" not in log  # no "searching for neighbors" at start
    # Addressed to the worker by name, a broadcast ends at its reply; to all, it would
    # wait out its whole timeout for workers that might still answer.
    node = f"celery@{socket.gethostname()}"
    for command in ("ping", "active"):
        out = subprocess.run(
            [*INSPECT, command, "--json", "--timeout", "10", "--destination", node],
            cwd=REPO,
            env=worker.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        replies = json.loads(out.stdout.strip().splitlines()[-1])
        [(name, reply)] = replies.items()
        assert name == node
        assert reply == ({"ok": "pong"} if command == "ping" else [])


OUTAGE_S = 6.0
REDIS_SERVER = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
INSPECT = [sys.executable, "-m", "celery", "-A", "tasks", "inspect"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _redis_server(port: int, folder: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*REDIS_SERVER, "--port", str(port), "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"

    def answers() -> bool:
        with contextlib.suppress(redis.exceptions.ConnectionError), redis.Redis.from_url(url) as r:
            return bool(r.ping())
        return False

    wait_for(answers, "redis-server", 20)
    return proc


def test_a_redis_restart_logs_no_gossip_traceback(served: list[Served], tmp_path: Path) -> None:
    """A Redis of the test's own, on its own port, stopped and started again under a
    running worker: the worker reconnects, and nothing in its log is Celery's gossip
    (its consumer of other workers' events, which logged a traceback here)."""
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _redis_server(port, tmp_path)
    try:
        env = _env("it-restart") | {"ACPW_REDIS_URL": url, "ACPW_BROKER_URL": url}
        worker = Served(tmp_path / "serve.log", "it-restart", env=env)
        served.append(worker)
        server.kill()  # as a crash or an OOM kill would: no goodbye on the connections
        server.wait(20)
        wait_for(lambda: "Connection to broker lost" in worker.log.read_text(), "the loss", 30)
        time.sleep(OUTAGE_S)  # the worker retries meanwhile, every few seconds
        server = _redis_server(port, tmp_path)
        wait_for(
            lambda: worker.log.read_text().count("Connected to redis") >= 2,
            "the worker to reconnect",
            60,
        )
        settings = _settings().model_copy(update={"redis_url": url, "broker_url": url})
        with Client(url, settings=settings) as client:
            client.submit(job("after-restart"))
            events = [e.event for e in client.events("after-restart", follow=True, timeout=60)]
        assert [e["data"]["status"] for e in completed(events)] == ["succeeded"]
        log = worker.log.read_text()
        assert "gossip" not in log.lower(), log[-4000:]
        assert "Traceback" not in log, log[-4000:]
    finally:
        server.terminate()
        server.wait(20)
