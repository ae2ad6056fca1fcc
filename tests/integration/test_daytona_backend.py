"""The daytona backend through the real ``daytona`` SDK, against the local double of
Daytona's HTTP API (``tests/daytona_double``).

Daytona's hosted service cannot run on these machines: every test here talks to the
double, which validates each request with the SDK's own generated models and runs the
commands as real processes under bubblewrap. ``make test-daytona`` runs the same tests
against a real account when ``DAYTONA_API_KEY`` is set (see ``conftest``-less switch
``DAYTONA_REAL`` below).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis

from tests.daytona_double import DaytonaDouble
from tests.integration.daytona_thread import BASE_ID, REGISTRY, closure_resolver
from worker.client import Client
from worker.errors import (
    ArchiveRefused,
    BackendAuthFailed,
    BackendQuotaExceeded,
    BackendRateLimited,
    SandboxError,
    SandboxStartTimeout,
    SnapshotFailed,
)
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox.base import (
    LABEL_JOB,
    LABEL_TOKEN,
    LeaseDeadline,
    ResourceLimits,
    SandboxSpec,
)
from worker.sandbox.config import DaytonaConfig
from worker.sandbox.daytona import DaytonaBackend
from worker.sandbox.files import PathRefused
from worker.service.reaper import reap_once
from worker.settings import Settings
from worker.store import fields, keys
from worker.store.owner import LABEL_OWNER, LABEL_STORE, owner_label, owner_labels, store_label

REPO = Path(__file__).resolve().parents[2]
SECRET = "emulator-daytona-secret-7d1e"


@pytest.fixture
async def double(tmp_path: Path) -> AsyncIterator[DaytonaDouble]:
    server = DaytonaDouble(tmp_path / "daytona")
    server.resolve_image = closure_resolver(tmp_path / "cache")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _config(tmp_path: Path, server: DaytonaDouble, **overrides: Any) -> DaytonaConfig:
    values: dict[str, Any] = {
        "worker_id": "w-daytona",
        "cache_dir": tmp_path / "cache",
        "daytona_api_url": server.api_url,
        "daytona_api_key": server.api_key,
        "daytona_image_registry": REGISTRY,
        "daytona_base_image_id": BASE_ID,
        "daytona_retry_attempts": 3,
        "daytona_snapshot_rebuild_backoff_s": 0.1,
    }
    values.update(overrides)
    return DaytonaConfig(**values)


@pytest.fixture
async def backend(tmp_path: Path, double: DaytonaDouble) -> AsyncIterator[DaytonaBackend]:
    made = DaytonaBackend(_config(tmp_path, double))
    try:
        yield made
    finally:
        await made.aclose()


def _closure(tmp_path: Path) -> Path:
    closure = tmp_path / "cache" / "closures" / ("c" * 64)
    closure.mkdir(parents=True, exist_ok=True)
    (closure / "tool.py").write_text("print('from the pack')\n")
    return closure


def _spec(tmp_path: Path, **overrides: Any) -> SandboxSpec:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# staged\n")
    values: dict[str, Any] = {
        "job_id": "job-1",
        "attempt": 1,
        "workspace": workspace,
        "pack_closure": _closure(tmp_path),
        "limits": ResourceLimits(memory_bytes=512 * 1024**2, cpus=1.0, pids=128),
        "labels": {LABEL_JOB: "job-1", LABEL_TOKEN: "7"},
    }
    values.update(overrides)
    return SandboxSpec(**values)


async def test_stdio_roundtrip_eof_and_exit_status(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """The agent's stdin reaches the program framed (several input calls), its EOF ends
    a program that reads to the end, its stdout comes from the log stream, and the
    environment is exactly the one given (never in the recorded command)."""
    sandbox = await backend.create(_spec(tmp_path))
    script = (
        "import os,sys\n"
        "data=sys.stdin.buffer.read()\n"
        "env=sorted(e.split('=')[0] for e in open('/proc/self/environ').read().split('\\0') if e)\n"
        "sys.stdout.write('%d %s %s\\n'%(len(data),os.environ.get('TOKEN'),env))\n"
        "sys.stdout.flush()\n"
        "sys.exit(3)\n"
    )
    proc = await sandbox.spawn(
        ["/usr/bin/python3", "-c", script], env={"TOKEN": "tok-123"}, cwd="/workspace"
    )
    payload = ("é" * 50_000 + "\n").encode()  # 100 KB: two frames, cut between characters
    proc.stdin.write(payload)
    await proc.stdin.drain()
    proc.stdin.close()
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    assert line.decode().split(" ", 2)[:2] == [str(len(payload)), "tok-123"]
    assert "['TOKEN']" in line.decode()
    assert await asyncio.wait_for(proc.wait(), 20) == 3
    record = next(iter(double.sandboxes.values()))
    runs = [run for session in record.sessions.values() for run in session.values()]
    assert all("tok-123" not in run.command for run in runs)
    assert max(run.inputs for run in runs) >= 3  # two data frames, EOF
    # The environment went as a file the relay removed, never as an input call.
    assert all("tok-123" not in data for run in runs for data in run.received)
    assert not list((record.root / "tmp").glob("acpw-launch-*"))
    await backend.destroy(sandbox.sandbox_id)
    assert double.sandboxes == {}


async def test_terminate_and_kill_reach_a_program_that_ignores_eof(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    sandbox = await backend.create(_spec(tmp_path))
    script = (
        "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    proc.stdin.close()
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"ready\n"
    proc.terminate()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), 1.0)
    proc.kill()
    assert await asyncio.wait_for(proc.wait(), 20) < 0
    diagnosis = await proc.exit_diagnosis()
    assert diagnosis.signal == "SIGKILL"
    assert not diagnosis.oom_killed
    await backend.destroy(sandbox.sandbox_id)


async def test_a_dropped_log_stream_is_reopened_without_repeating_output(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    sandbox = await backend.create(_spec(tmp_path))
    script = (
        "import sys\nprint('one', flush=True)\nsys.stdin.readline()\nprint('two', flush=True)\n"
    )
    double.drop_logs_once = True
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"one\n"
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b"two\n"
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert await proc.stdout.read() == b""  # "one" was not delivered twice
    assert not double.drop_logs_once
    await backend.destroy(sandbox.sandbox_id)


async def test_an_input_applied_then_lost_reaches_the_program_once(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """An input call the daemon applied but whose answer was lost (504, 502) is retried,
    and the relay drops the copy: the agent reads each JSON-RPC message once. A 429 is
    retried after its Retry-After."""
    sandbox = await backend.create(_spec(tmp_path))
    script = "import sys\nfor line in sys.stdin: print('got', line.strip(), flush=True)\n"
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    inputs = r"/process/session/[^/]+/command/[^/]+/input$"
    double.fail_next("POST", inputs, 504, "Gateway Timeout", after=True)
    proc.stdin.write(b'{"id":1}\n')
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b'got {"id":1}\n'
    double.fail_next("POST", inputs, 502, "Bad Gateway", after=True)
    proc.stdin.write(b'{"id":2}\n')
    await proc.stdin.drain()
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b'got {"id":2}\n'
    double.fail_next("POST", inputs, 429, "Too Many Requests", Retry_After="1")
    proc.stdin.write(b'{"id":3}\n')
    proc.stdin.close()
    assert await asyncio.wait_for(proc.stdout.readline(), 20) == b'got {"id":3}\n'
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert await proc.stdout.read() == b""  # nothing twice
    calls = [t for t, method, path in double.timed if method == "POST" and "/input" in path]
    # Each message took two calls (the lost answer, then the retry); the 429's retry came
    # no sooner than its Retry-After.
    assert len(calls) == 7  # 3 messages x 2, and the EOF
    assert calls[5] - calls[4] >= 0.95
    await backend.destroy(sandbox.sandbox_id)


async def test_echoed_input_carries_no_credential(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """With the double echoing every input call into the command's log (a runner that
    ignores suppressInputEcho), the credentials of the environment are nowhere in the
    log, in what the worker read, nor left in the sandbox: they went as a 0600 file in a
    0700 folder that the relay removed."""
    double.echo_input = True
    sandbox = await backend.create(_spec(tmp_path))
    script = "import os,sys\nsys.stdin.read()\nprint('len', len(os.environ['TOKEN']), flush=True)\n"
    proc = await sandbox.spawn(
        ["/usr/bin/python3", "-c", script], env={"TOKEN": SECRET}, cwd="/workspace"
    )
    proc.stdin.write(b"some input\n")
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 20)
    err = await asyncio.wait_for(proc.stderr.read(), 20)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert f"len {len(SECRET)}".encode() in out  # the program had it
    assert b"some input" in out  # and the echo is on: input does reach the log
    assert SECRET.encode() not in out + err
    assert all(SECRET not in text for text in double.logged)
    record = next(iter(double.sandboxes.values()))
    assert not list((record.root / "tmp").glob("acpw-launch-*"))
    modes = double.header_modes
    assert modes
    assert all(m == (0o700, 0o600) for m in modes), modes
    await backend.destroy(sandbox.sandbox_id)


async def test_an_echoed_frame_never_joins_the_agents_next_line(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """With every input call echoed into the log the worker reads as the agent's stdout,
    a frame the agent does not answer (a lease renewal, the EOF) lands just before the
    agent's next line: it must be a line of its own, not the head of that line (an echoed
    ``L`` frame once prefixed the agent's answer to ``initialize``, which was skipped as
    not JSON, and the served job waited for it until its time-out)."""
    double.echo_input = True
    sandbox = await backend.create(_spec(tmp_path))
    script = (
        "import sys\n"
        "sys.stdin.readline();print('{\"id\":1}',flush=True)\n"
        "sys.stdin.read();print('{\"id\":2}',flush=True)\n"
    )
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={}, cwd="/workspace")
    proc.stdin.write(b'{"ask":1}\n')
    lines = []
    while b'{"id":1}' not in lines:  # the data frame's echo, then the program's answer
        lines.append((await asyncio.wait_for(proc.stdout.readline(), 20)).strip())
    # Nothing else is written now: the renewal's echo, then the EOF's, come right before
    # the program's last line.
    await sandbox.arm_lease(LeaseDeadline(time.monotonic() + 30))
    proc.stdin.close()
    rest = (await asyncio.wait_for(proc.stdout.read(), 20)).splitlines()
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert double.echoed == 3
    assert b'{"id":2}' in rest, rest
    assert [line[:1] for line in rest if line] == [b"L", b"E", b"{"], rest
    await backend.destroy(sandbox.sandbox_id)


async def test_a_workspace_over_its_bound_is_not_brought_back_but_deleted(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    backend = DaytonaBackend(_config(tmp_path, double, daytona_sync_max_bytes=64 * 1024))
    spec = _spec(tmp_path)
    try:
        sandbox = await backend.create(spec)
        script = "open('/workspace/big','wb').write(b'x' * 4 * 1024 * 1024)"
        proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        with pytest.raises(SandboxError, match="over its bound"):
            await backend.destroy(sandbox.sandbox_id)
    finally:
        await backend.aclose()
    assert double.sandboxes == {}
    assert not (spec.workspace / "big").exists()


async def test_a_snapshot_another_worker_is_creating_is_waited_for(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """Two workers create the same snapshot: the second's create answers 409 and it
    uses (and verifies) the one being made."""
    name, image, _ = backend.snapshot_plan(_spec(tmp_path))
    double.images[image] = _closure(tmp_path)
    double.fail_next("GET", f"^/api/snapshots/{name}$", 404, "Snapshot not found")
    double.snapshots[name] = {
        "id": "other-worker", "organizationId": "org-double", "general": False,
        "name": name, "imageName": image, "state": "active", "size": 0.1,
        "entrypoint": None, "cpu": 1, "gpu": 0, "mem": 1, "disk": 3, "errorReason": None,
        "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
        "lastUsedAt": None, "sourceSandboxId": None,
    }  # fmt: skip
    sandbox = await backend.create(_spec(tmp_path))
    assert ("POST", "/api/snapshots") in double.requests
    assert len(double.snapshots) == 1
    await backend.destroy(sandbox.sandbox_id)


async def test_workspace_changes_come_back_on_destroy(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    script = (
        "import os\n"
        "open('/workspace/new.txt','w').write('made in the sandbox\\n')\n"
        "os.remove('/workspace/README.md')\n"
        "os.makedirs('/workspace/sub')\n"
        "open('/workspace/sub/f','w').write('x')\n"
    )
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    await backend.destroy(sandbox.sandbox_id)
    assert sorted(p.name for p in spec.workspace.iterdir()) == ["new.txt", "sub"]
    assert (spec.workspace / "new.txt").read_text() == "made in the sandbox\n"


async def test_a_symlink_comes_back_as_a_link_and_a_fifo_refuses_the_sync_but_deletes(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    spec = _spec(tmp_path)
    linked = await backend.create(spec)
    proc = await linked.spawn(
        ["/usr/bin/python3", "-c", "import os; os.symlink('/etc/passwd', '/workspace/l')"], env={}
    )
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 20)
    await backend.destroy(linked.sandbox_id)
    assert os.readlink(spec.workspace / "l") == "/etc/passwd"  # a link, as the agent left it
    assert (spec.workspace / "README.md").read_text() == "# staged\n"

    (tmp_path / "ws2").mkdir()
    (tmp_path / "ws2" / "README.md").write_text("# staged\n")
    fifo = _spec(tmp_path, workspace=tmp_path / "ws2")
    sandbox = await backend.create(fifo)
    proc = await sandbox.spawn(
        ["/usr/bin/python3", "-c", "import os; os.mkfifo('/workspace/p')"], env={}
    )
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 20)
    with pytest.raises(ArchiveRefused):
        await backend.destroy(sandbox.sandbox_id)
    assert double.sandboxes == {}  # deleted all the same
    assert sorted(p.name for p in fifo.workspace.iterdir()) == ["README.md"]  # nothing replaced


async def test_labels_list_network_and_cleanup_settings(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    none = await backend.create(_spec(tmp_path))
    allow = await backend.create(
        _spec(
            tmp_path, job_id="job-2", labels={LABEL_JOB: "job-2"}, network="allowlist",
            network_allow=("api.example.com:443", "10.1.2.3:8080"),
        )
    )  # fmt: skip
    infos = await backend.list({LABEL_TOKEN: "7"})
    assert [i.sandbox_id for i in infos] == [none.sandbox_id]
    assert infos[0].labels[LABEL_JOB] == "job-1"
    assert infos[0].backend == "daytona"
    assert "code-toolbox-language" not in infos[0].labels
    assert {i.sandbox_id for i in await backend.list({})} == {none.sandbox_id, allow.sandbox_id}
    dtos = {r.dto["name"]: r.dto for r in double.sandboxes.values()}
    assert dtos[none.sandbox_id]["networkBlockAll"] is True
    assert dtos[allow.sandbox_id]["networkBlockAll"] is False
    assert dtos[allow.sandbox_id]["domainAllowList"] == "api.example.com"
    assert dtos[allow.sandbox_id]["networkAllowList"] == "10.1.2.3/32"
    assert dtos[none.sandbox_id]["autoStopInterval"] == 15
    assert dtos[none.sandbox_id]["autoDeleteInterval"] == 0
    assert dtos[none.sandbox_id]["ttlMinutes"] == 24 * 60
    # Another process (a reaper) destroys by id alone; twice is fine.
    other = DaytonaBackend(backend.config)
    try:
        await other.destroy(allow.sandbox_id)
        await other.destroy(allow.sandbox_id)
    finally:
        await other.aclose()
    assert [i.sandbox_id for i in await backend.list({})] == [none.sandbox_id]
    await backend.destroy(none.sandbox_id)


async def test_snapshot_is_reused_and_verified(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    first = await backend.create(_spec(tmp_path))
    second = await backend.create(_spec(tmp_path, attempt=2))
    creates = [r for r in double.requests if r == ("POST", "/api/snapshots")]
    assert len(creates) == 1
    assert len(double.snapshots) == 1
    for made in (first, second):
        await backend.destroy(made.sandbox_id)
    # A snapshot of that name made from another image is refused, never used.
    snapshot = next(iter(double.snapshots.values()))
    snapshot["imageName"] = f"{REGISTRY}/acpw-pack:{'0' * 64}"
    with pytest.raises(SnapshotFailed) as caught:
        await backend.create(_spec(tmp_path, attempt=3))
    assert caught.value.details["reason"] == "identity"


async def test_snapshot_build_failed_and_stuck_pending(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    failing = DaytonaBackend(_config(tmp_path, double, daytona_image_registry="nowhere.test"))
    stuck = DaytonaBackend(_config(tmp_path, double, daytona_snapshot_timeout_s=1.0))
    name, image, _ = stuck.snapshot_plan(_spec(tmp_path))
    double.stuck_images.add(image)
    try:
        with pytest.raises(SnapshotFailed) as failed:
            await failing.create(_spec(tmp_path))
        assert failed.value.code == "snapshot_failed"
        double.snapshots.clear()  # the failed one keeps its name (docs/daytona.md)
        with pytest.raises(SnapshotFailed) as pending:
            await stuck.create(_spec(tmp_path))
        assert pending.value.details["reason"] == "pending"
        assert pending.value.details["state"] == "pending"
        assert name in double.snapshots
    finally:
        await failing.aclose()
        await stuck.aclose()
    assert double.sandboxes == {}


async def test_snapshot_lifecycle_inactive_activated_failed_rebuilt(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """The snapshot's states as the double times them: a build takes a while (pending,
    building, then active); a snapshot gone inactive is activated, not remade; a failed
    build is deleted and built again after a back-off; builds that keep failing end in
    ``snapshot_failed`` naming the rebuilds."""
    backend = DaytonaBackend(_config(tmp_path, double, daytona_snapshot_rebuilds=1))
    spec = _spec(tmp_path)
    name, _, _ = backend.snapshot_plan(spec)
    try:
        double.snapshot_build_s = 1.5
        double.fail_builds = 1
        first = await backend.create(spec)  # build failed, deleted, rebuilt, active
        assert double.snapshot_calls == {"create": 2, "activate": 0, "delete": 1}
        states = [p for _, m, p in double.timed if m == "GET" and name in p]
        assert len(states) >= 2  # polled while building
        await backend.destroy(first.sandbox_id)
        double.snapshots[name]["state"] = "inactive"
        second = await backend.create(spec)  # activated, not made again
        assert double.snapshot_calls == {"create": 2, "activate": 1, "delete": 1}
        await backend.destroy(second.sandbox_id)
        double.snapshots.clear()
        double.snapshot_build_s = 0.0
        double.fail_builds = 5
        with pytest.raises(SnapshotFailed) as failed:
            await backend.create(spec)
        assert failed.value.details["reason"] == "build_failed"
        assert failed.value.details["rebuilds"] == 1
        assert double.snapshot_calls["create"] == 4
    finally:
        await backend.aclose()
    assert double.sandboxes == {}


async def test_calls_to_one_organisation_are_bounded(tmp_path: Path, double: DaytonaDouble) -> None:
    """At most ``daytona_max_concurrent_calls`` calls to one organisation are in flight
    from the process, however many operations want one; a wider bound lets more through
    (so the count can see it)."""
    double.rtt_s = 0.1
    narrow = DaytonaBackend(_config(tmp_path, double, daytona_max_concurrent_calls=2))
    await asyncio.gather(*(narrow.list({}) for _ in range(6)))
    assert double.most_in_flight == 2
    double.most_in_flight = 0
    wide = DaytonaBackend(_config(tmp_path, double, daytona_max_concurrent_calls=8))
    await asyncio.gather(*(wide.list({}) for _ in range(6)))
    assert double.most_in_flight > 2


async def test_registry_credentials_reach_daytona_for_a_private_pull(
    tmp_path: Path, double: DaytonaDouble, caplog: pytest.LogCaptureFixture
) -> None:
    """A pack image in a private registry: without credentials its snapshot cannot be
    built (pull denied); with them the snapshot request is preceded by the registry's
    credentials registered with the organisation, and it builds; rotated credentials
    update that entry. The password is in no log line or error."""
    password = "reg-secret-" + os.urandom(6).hex()
    double.private_registries["registry.test"] = ("puller", password)
    spec = _spec(tmp_path)
    plain = DaytonaBackend(_config(tmp_path, double, daytona_snapshot_rebuilds=0))
    with pytest.raises(SnapshotFailed) as refused:
        await plain.create(spec)
    assert "unauthorized" in refused.value.message
    assert double.registries == {}
    double.snapshots.clear()
    creds = {"daytona_registry_username": "puller", "daytona_registry_password": password}
    backend = DaytonaBackend(_config(tmp_path, double, **creds))
    before = len(double.requests)
    try:
        sandbox = await backend.create(spec)
        await backend.destroy(sandbox.sandbox_id)
        registered = [(r["name"], r["url"], r["username"]) for r in double.registries.values()]
        assert registered == [("acpw-registry-test", "registry.test", "puller")]
        assert list(double.registry_passwords.values()) == [password]
        calls = [
            (m, p)
            for m, p in double.requests[before:]
            if "docker-registry" in p or "snapshots" in p
        ]
        assert calls.index(("POST", "/api/docker-registry")) < calls.index(
            ("POST", "/api/snapshots")
        )
        # Rotated: the same entry updated, not a second one.
        double.private_registries["registry.test"] = ("puller", password + "-2")
        double.snapshots.clear()
        creds["daytona_registry_password"] = password + "-2"
        rotated = DaytonaBackend(_config(tmp_path, double, **creds))
        again = await rotated.create(spec)
        await rotated.destroy(again.sandbox_id)
        assert len(double.registries) == 1
        assert list(double.registry_passwords.values()) == [password + "-2"]
    finally:
        await backend.aclose()
    assert password not in caplog.text
    assert password not in str(refused.value.to_dict())


async def test_an_organisation_limit_is_backend_quota_exceeded(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """Daytona refuses a sandbox past the organisation's total CPU with a 400 that names
    no quota ("Total CPU limit exceeded. Maximum allowed: N."): it is still
    ``backend_quota_exceeded``, and nothing is left behind."""
    double.org_cpu_limit = 1
    first = await backend.create(_spec(tmp_path))
    with pytest.raises(BackendQuotaExceeded) as refused:
        await backend.create(_spec(tmp_path, attempt=2))
    assert "Total CPU limit exceeded" in refused.value.message
    assert [r.dto["name"] for r in double.sandboxes.values()] == [first.sandbox_id]
    await backend.destroy(first.sandbox_id)


async def test_typed_errors_and_the_key_never_in_them(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """401 → backend_auth_failed, a quota answer → backend_quota_exceeded, 429 retried
    (Retry-After honoured) then backend_rate_limited; the key appears in none."""
    wrong = DaytonaBackend(_config(tmp_path, double, daytona_api_key="dtn_wrong_" + "k" * 20))
    try:
        with pytest.raises(BackendAuthFailed) as auth:
            await wrong.list({})
    finally:
        await wrong.aclose()
    double.fail_next("POST", r"^/api/sandbox$", 403, "Total CPU quota exceeded (4 > 2)")
    with pytest.raises(BackendQuotaExceeded) as quota:
        await backend.create(_spec(tmp_path))
    double.fail_next("GET", r"^/api/sandbox$", 429, "Too Many Requests", Retry_After="0")
    assert await backend.list({}) == []  # one 429, then answered
    for _ in range(3):
        double.fail_next("GET", r"^/api/sandbox$", 429, "Too Many Requests", Retry_After="0")
    with pytest.raises(BackendRateLimited) as limited:
        await backend.list({})
    for error in (auth.value, quota.value, limited.value):
        text = json.dumps(error.to_dict()) + str(error)
        assert double.api_key not in text
        assert "dtn_wrong_" not in text
        assert isinstance(error, SandboxError)


async def test_a_sandbox_that_never_starts_times_out_and_is_deleted(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    backend = DaytonaBackend(_config(tmp_path, double, daytona_start_timeout_s=1.0))
    double.start_stuck = True
    try:
        with pytest.raises(SandboxStartTimeout) as caught:
            await backend.create(_spec(tmp_path))
    finally:
        await backend.aclose()
    assert caught.value.code == "sandbox_start_timeout"
    assert double.sandboxes == {}


async def test_a_sandbox_that_takes_a_while_to_start_is_waited_for(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """A sandbox ``starting`` for a while (the double's start timing) is waited for and
    used once ``started``; one slower than ``daytona_start_timeout_s`` times out and is
    deleted."""
    double.sandbox_start_s = 1.5
    patient = DaytonaBackend(_config(tmp_path, double, daytona_start_timeout_s=30.0))
    hasty = DaytonaBackend(_config(tmp_path, double, daytona_start_timeout_s=0.5))
    try:
        sandbox = await patient.create(_spec(tmp_path))
        assert double.sandboxes[next(iter(double.sandboxes))].dto["state"] == "started"
        await patient.destroy(sandbox.sandbox_id)
        with pytest.raises(SandboxStartTimeout):
            await hasty.create(_spec(tmp_path, attempt=2))
    finally:
        await patient.aclose()
        await hasty.aclose()
    assert double.sandboxes == {}


async def test_lease_renewals_refresh_the_sandbox_activity(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    backend = DaytonaBackend(_config(tmp_path, double, daytona_activity_every_s=0.01))
    deadline = LeaseDeadline(1e12)
    try:
        sandbox = await backend.create(_spec(tmp_path, lease_deadline=deadline))
        for step in range(3):
            await asyncio.sleep(0.05)
            deadline.extend(1e12 + step)
        await asyncio.sleep(0.3)
        assert double.activity_refreshes(sandbox.sandbox_id) >= 3
        await backend.destroy(sandbox.sandbox_id)
        deadline.extend(2e12)  # no longer followed: nothing is sent for a deleted sandbox
    finally:
        await backend.aclose()


_FROZEN_WORKER = """
import asyncio, json, sys, time
from pathlib import Path
from tests.integration.test_daytona_backend import _spec
from worker.sandbox.base import LeaseDeadline
from worker.sandbox.config import DaytonaConfig
from worker.sandbox.daytona import DaytonaBackend

TTL = float(sys.argv[2])

async def heartbeat(deadline: LeaseDeadline) -> None:
    while True:  # the lease heartbeat: renewed every TTL/5, TTL ahead
        await asyncio.sleep(TTL / 5)
        deadline.extend(time.monotonic() + TTL)

async def main() -> None:
    config = DaytonaConfig.model_validate(json.loads(sys.argv[1]))
    deadline = LeaseDeadline(time.monotonic() + TTL)
    beat = asyncio.create_task(heartbeat(deadline))
    backend = DaytonaBackend(config)
    sandbox = await backend.create(_spec(Path(sys.argv[3]), lease_deadline=deadline))
    script = "import time\\nprint('agent up', flush=True)\\ntime.sleep(120)"
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    assert await proc.stdout.readline() == b"agent up\\n"
    print("ready", flush=True)
    await beat

asyncio.run(main())
"""


async def test_a_frozen_workers_agent_dies_with_its_lease(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """A worker that renews its lease keeps its agent running past the lease's first
    deadline; frozen (SIGSTOP), its renewals stop and the relay's watchdog kills the agent
    once the last renewal's deadline passes: the overlap with a next attempt is bounded by
    the lease TTL plus the margin docs/daytona.md states (the watchdog's 0.1 s look and
    the renewal's input call). The measured overlap is printed."""
    ttl = 2.0
    config = _config(tmp_path, double).model_dump(mode="json")
    config["daytona_api_key"] = double.api_key  # a SecretStr: dumped masked
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FROZEN_WORKER, json.dumps(config), str(ttl),
        str(tmp_path), cwd=REPO, stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert worker.stdout is not None
    try:
        assert await asyncio.wait_for(worker.stdout.readline(), 60) == b"ready\n"
        record = next(iter(double.sandboxes.values()))
        runs = [r for s in record.sessions.values() for r in s.values() if "-launch-" in r.command]
        await asyncio.sleep(2 * ttl)  # renewed all along: the agent still runs
        assert all(run.exit_code is None for run in runs)
        renewals = [t for t, _, path in double.timed if path.endswith("/input")]
        assert len(renewals) >= 3  # the lease frames
        os.kill(worker.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        while any(run.exit_code is None for run in runs):
            await asyncio.sleep(0.05)
            assert time.monotonic() - frozen < ttl + 30, "the agent outlived its lease"
        died = time.monotonic()
        last = max(t for t, _, path in double.timed if path.endswith("/input"))
        print(f"agent died {died - last:.2f} s after the last renewal (lease TTL {ttl} s)")
        assert died - last >= ttl * 0.9  # not before the lease could have lapsed
        assert [run.exit_code for run in runs] == [137]
        assert b"the lease lapsed unrenewed" in runs[0].stderr
    finally:
        worker.kill()
        await worker.wait()


async def test_hello_job_completes_through_the_backend(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """The emulator pack's hello job, run_job end to end (what `acp-worker run --backend
    daytona` calls), on a sandbox of the double."""
    settings = Settings(
        cache_dir=tmp_path / "cache", work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets", worker_id="w-daytona",
        packs_dir=REPO / "provider_packs", shutdown_eof_grace=1.0,
    )  # fmt: skip
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    job = parse_job({
        "v": 1, "job_id": "dt-hello", "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
        "prompt": "scenario: hello", "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
    })  # fmt: skip
    backend = DaytonaBackend(_config(tmp_path, double))
    sink = MemorySink()
    try:
        outcome = await run_job(job, settings=settings, backend=backend, sinks=[sink], environ={})
    finally:
        await backend.aclose()
    events = [dict(e) for e in sink.events]
    types = [e["type"] for e in events]
    assert outcome.status == "succeeded", json.dumps(events)[-3000:]
    assert types[-1] == "job.completed"
    assert "sandbox.ready" in types
    assert "workspace.changed" in types
    assert SECRET not in json.dumps(events)
    assert double.sandboxes == {}


async def test_the_reaper_deletes_daytona_sandboxes_whose_lease_is_gone(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble, redis_url: str
) -> None:
    """The reaper lists Daytona sandboxes by our labels alone: one whose lease token is
    not the job's (no lease in this Redis) and one whose owner process is gone are
    deleted; one whose owner runs is kept."""
    settings = Settings(
        redis_url=redis_url, work_dir=tmp_path / "work", cache_dir=tmp_path / "cache",
        results_dir=tmp_path / "results",
    )  # fmt: skip
    store = store_label(redis_url)
    assert store is not None
    child = subprocess.Popen(["sleep", "30"])
    dead_owner = owner_label(child.pid)
    child.kill()
    child.wait()
    assert dead_owner is not None
    leased = await backend.create(
        _spec(tmp_path, labels={LABEL_JOB: "job-1", LABEL_TOKEN: "5", LABEL_STORE: store})
    )
    orphan = await backend.create(
        _spec(tmp_path, job_id="job-2", labels={LABEL_JOB: "job-2", LABEL_OWNER: dead_owner})
    )
    alive = await backend.create(
        _spec(tmp_path, job_id="job-3", labels={LABEL_JOB: "job-3", **owner_labels()})
    )
    reaper = DaytonaBackend(backend.config)  # another process's view: labels only
    client = aioredis.Redis.from_url(redis_url)
    # This Redis issued token 5 for job-1 and its lease is gone (another attempt, 6, holds it).
    await client.hset(keys.state("job-1"), fields.FENCE, "6")
    await client.set(keys.lease("job-1"), "6")
    try:
        report = await reap_once(client, settings, {"daytona": reaper})
    finally:
        await client.aclose()
        await reaper.aclose()
    assert sorted(report.destroyed) == sorted([leased.sandbox_id, orphan.sandbox_id])
    assert [r.dto["name"] for r in double.sandboxes.values()] == [alive.sandbox_id]
    await backend.destroy(alive.sandbox_id)


async def test_acp_worker_run_backend_daytona(tmp_path: Path, double: DaytonaDouble) -> None:
    """``acp-worker run --backend daytona`` with its settings from the environment (the
    key too) reaches ``job.completed`` succeeded on the double; the key is nowhere in
    what the CLI printed or wrote."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    job = {
        "v": 1, "job_id": "dt-cli", "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
        "prompt": "scenario: hello", "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
    }  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACPW_", "DAYTONA_"))
    } | {
        "ACPW_CACHE_DIR": str(tmp_path / "cache"), "ACPW_WORK_DIR": str(tmp_path / "work"),
        "ACPW_SECRETS_DIR": str(tmp_path / "secrets"),
        "ACPW_PACKS_DIR": str(REPO / "provider_packs"),
        "ACPW_RESULTS_DIR": str(tmp_path / "results"),
        "ACPW_DAYTONA_API_URL": double.api_url, "ACPW_DAYTONA_API_KEY": double.api_key,
        "ACPW_DAYTONA_IMAGE_REGISTRY": REGISTRY, "ACPW_DAYTONA_BASE_IMAGE_ID": BASE_ID,
    }  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"),
        "--backend", "daytona", "--events-out", str(tmp_path / "events.jsonl"), "--quiet",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert proc.returncode == 0, err.decode()[-3000:]
    assert events[-1]["type"] == "job.completed"
    assert events[-1]["data"]["status"] == "succeeded"
    assert "daytona" in {e["data"].get("backend") for e in events if e["type"] == "sandbox.ready"}
    for text in (out.decode(), err.decode(), (tmp_path / "events.jsonl").read_text()):
        assert double.api_key not in text
    assert double.sandboxes == {}


def serve_on_double(
    tmp_path: Path, double: DaytonaDouble, redis_url: str, worker_id: str, **extra: str
) -> tuple[str, subprocess.Popen[bytes], Path]:
    """An ``acp-worker serve --concurrency 1 --no-reaper`` on ``double`` (the broker's db
    flushed first, ``SECRET`` as the secret ``key``, ``extra`` more ``ACPW_*`` settings):
    its broker URL, its process (a session of its own) and its log."""
    broker = os.environ.get("ACPW_TEST_BROKER_URL", redis_url.rsplit("/", 1)[0] + "/14")
    with redis.Redis.from_url(broker) as sync_client:
        sync_client.flushdb()
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACPW_", "DAYTONA_"))
    } | {
        "ACPW_REDIS_URL": redis_url, "ACPW_BROKER_URL": broker, "ACPW_BACKEND": "daytona",
        "ACPW_WORKER_ID": worker_id, "ACPW_WORK_DIR": str(tmp_path / "work"),
        "ACPW_CACHE_DIR": str(tmp_path / "cache"), "ACPW_SECRETS_DIR": str(tmp_path / "secrets"),
        "ACPW_PACKS_DIR": str(REPO / "provider_packs"), "ACPW_LEASE_TTL": "30",
        "ACPW_LEASE_RENEW": "1", "ACPW_SHUTDOWN_EOF_GRACE": "1",
        "ACPW_DAYTONA_API_URL": double.api_url, "ACPW_DAYTONA_API_KEY": double.api_key,
        "ACPW_DAYTONA_IMAGE_REGISTRY": REGISTRY, "ACPW_DAYTONA_BASE_IMAGE_ID": BASE_ID,
    } | extra  # fmt: skip
    log = tmp_path / "serve.log"
    argv = [str(Path(sys.executable).with_name("acp-worker")), "serve", "--concurrency", "1"]
    with log.open("w") as out:
        serve = subprocess.Popen(
            [*argv, "--no-reaper"], cwd=REPO, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return broker, serve, log


async def test_a_served_job_runs_on_daytona(
    tmp_path: Path, double: DaytonaDouble, redis_url: str
) -> None:
    """``acp-worker serve`` with ``ACPW_BACKEND=daytona``: a submitted hello job settles
    ``succeeded`` on a sandbox of the double, leased through the same ``owning()`` as
    every served job, and the sandbox is gone afterwards."""
    # A runner that ignores suppressInputEcho: every input call lands in the command's log.
    double.echo_input = True
    broker, serve, log = serve_on_double(
        tmp_path, double, redis_url, "w-served", ACPW_DAYTONA_ACTIVITY_EVERY_S="0.5"
    )
    try:
        await _until(lambda: " ready." in log.read_text(), 90)
        (tmp_path / "ws").mkdir()
        (tmp_path / "ws" / "README.md").write_text("# served\n")
        job = {
            "v": 1, "job_id": "dt-served", "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
            "prompt": "scenario: hello", "credentials": {"CURSOR_API_KEY": "file:key"},
            "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
        }  # fmt: skip
        with Client(redis_url, settings=Settings(redis_url=redis_url, broker_url=broker)) as c:
            await asyncio.to_thread(c.submit, job)

            def done() -> list[dict[str, Any]]:
                events = [dict(item.event) for item in c.events("dt-served")]
                return events if events and events[-1]["type"] == "job.completed" else []

            events = await _until(done, 90)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        await asyncio.to_thread(serve.wait, 60)
    # Where a job that did not succeed stopped: its events' types and notices, then the log.
    trail = [(e["type"], e["data"].get("kind") or e["data"].get("status")) for e in events]
    assert events[-1]["data"]["status"] == "succeeded", (trail, log.read_text()[-3000:])
    ready = [e for e in events if e["type"] == "sandbox.ready"]
    assert ready[0]["data"]["backend"] == "daytona"
    assert double.sandboxes == {}
    assert double.api_key not in log.read_text()
    # With input echoed, the job's credential is still nowhere: not in what the runner
    # logged or received, the worker's log, the events, nor anything kept in Redis.
    assert double.echoed > 0
    assert SECRET not in log.read_text()
    assert SECRET not in json.dumps(events)
    assert all(SECRET not in text for text in double.logged)
    assert not _in_redis(redis_url, SECRET)
    assert not _in_redis(broker, SECRET)


def _in_redis(url: str, needle: str) -> list[str]:
    """The keys of the Redis at ``url`` whose value holds ``needle``."""
    found = []
    with redis.Redis.from_url(url) as r:
        for key in r.scan_iter(count=1000):
            kind = r.type(key).decode()
            if kind == "string":
                values = [r.get(key) or b""]
            elif kind == "hash":
                values = [*r.hgetall(key).values()]
            elif kind == "list":
                values = r.lrange(key, 0, -1)
            elif kind in ("set", "zset"):
                values = list(r.smembers(key)) if kind == "set" else r.zrange(key, 0, -1)
            elif kind == "stream":
                values = [
                    json.dumps(
                        {k.decode(): v.decode(errors="replace") for k, v in fields_.items()}
                    ).encode()
                    for _, fields_ in r.xrange(key)
                ]
            else:
                values = []
            if any(needle.encode() in v for v in values):
                found.append(key.decode(errors="replace"))
    return found


async def _until(check: Any, timeout: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s")


async def test_the_double_refuses_what_the_sdk_models_refuse(double: DaytonaDouble) -> None:
    """The double is only as strict as the API's schema, as the SDK's generated models
    carry it: a label that is not a string, a snapshot without a name, a wrong key."""
    auth = {"Authorization": f"Bearer {double.api_key}"}
    base = f"http://127.0.0.1:{double.port}"
    async with aiohttp.ClientSession(headers=auth) as http:
        bad_labels = {"snapshot": "s", "labels": {"acpw.job": 1}}
        async with http.post(f"{base}/api/sandbox", json=bad_labels) as reply:
            assert reply.status == 400
        async with http.post(f"{base}/api/snapshots", json={"imageName": "x"}) as reply:
            assert reply.status == 400  # no name
        async with http.get(f"{base}/api/sandbox", headers={"Authorization": "Bearer no"}) as r:
            assert r.status == 401


# --- masks by content ------------------------------------------------------------------

_ADMITTED = '{"permissions": {"allow": []}}\n'


def _masked_workspace(tmp_path: Path) -> SandboxSpec:
    spec = _spec(tmp_path)
    claude = spec.workspace / ".claude"
    claude.mkdir()
    (claude / "settings.json").write_text(_ADMITTED)
    (claude / "notes.md").write_text("kept editable\n")
    (spec.workspace / ".codex").mkdir()
    (spec.workspace / ".codex" / "prompts.md").write_text("codex dir, masked whole\n")
    return spec


_TRIES = (
    "import json, os, shutil, ctypes\n"
    "def t(what, fn):\n"
    "    try:\n"
    "        fn(); return 'ok'\n"
    "    except OSError as e:\n"
    "        return 'refused'\n"
    "def w(p, text):\n"
    "    return lambda: open(p, 'w').write(text)\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def umount(p):\n"
    "    if libc.umount2(p.encode(), 2) != 0: raise OSError(ctypes.get_errno(), 'umount')\n"
    "seen = sorted(os.path.relpath(os.path.join(d, f), '/workspace')\n"
    "              for d, _, fs in os.walk('/workspace') for f in fs\n"
    "              if os.path.getsize(os.path.join(d, f)))\n"
    "r = {'seen': seen}\n"
    "r['cursor hooks'] = t('', w('/workspace/.cursor/hooks.json', '{\"hooks\": {}}'))\n"
    "r['mcp'] = t('', w('/workspace/.mcp.json', '{}'))\n"
    "r['claude settings'] = t('', w('/workspace/.claude/settings.json', '{\"hooks\": 1}'))\n"
    "r['codex config'] = t('', w('/workspace/.codex/config.toml', 'x = 1'))\n"
    "r['cursor plugins'] = t('', lambda: os.mkdir('/workspace/.cursor/plugins/p'))\n"
    "r['move claude aside'] = t('', lambda: os.rename('/workspace/.claude', '/workspace/c2'))\n"
    "r['remove claude'] = t('', lambda: shutil.rmtree('/workspace/.claude'))\n"
    "r['unmount'] = t('', lambda: umount('/workspace/.mcp.json'))\n"
    "r['notes'] = t('', w('/workspace/.claude/notes.md', 'changed\\n'))\n"
    "r['agents'] = t('', lambda: (os.makedirs('/workspace/.claude/agents'),\n"
    "    open('/workspace/.claude/agents/a.md', 'w').write('an agent file')))\n"
    "print(json.dumps(r))\n"
)


async def test_masked_config_paths_are_read_only_for_the_agent(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    """Masked config is not uploaded, and the agent cannot write at a masked path, move
    a config directory aside, remove it or unmount a mask (the relay's locked read-only
    mounts); the rest of a config directory stays writable and comes back; the host
    copies of masked files stay as staged."""
    spec = _masked_workspace(tmp_path)
    sandbox = await backend.create(spec)
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", _TRIES], env={})
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 20)
    err = await asyncio.wait_for(proc.stderr.read(), 20)
    assert await asyncio.wait_for(proc.wait(), 20) == 0, err.decode()
    tried = json.loads(out)
    assert tried.pop("seen") == [".claude/notes.md", "README.md"]  # masked: empty
    assert tried == {
        "cursor hooks": "refused", "mcp": "refused", "claude settings": "refused",
        "codex config": "refused", "cursor plugins": "refused",
        "move claude aside": "refused", "remove claude": "refused", "unmount": "refused",
        "notes": "ok", "agents": "ok",
    }  # fmt: skip
    await backend.destroy(sandbox.sandbox_id)
    ws = spec.workspace
    assert (ws / ".claude" / "settings.json").read_text() == _ADMITTED  # host copy as it was
    assert (ws / ".claude" / "notes.md").read_text() == "changed\n"  # not masked: comes back
    assert (ws / ".claude" / "agents" / "a.md").read_text() == "an agent file"
    assert (ws / ".codex" / "prompts.md").read_text() == "codex dir, masked whole\n"
    assert not (ws / ".codex" / "config.toml").exists()
    assert not (ws / ".mcp.json").exists()
    assert not (ws / ".cursor").exists()  # the relay's empty mask points do not come back


async def test_a_mask_that_cannot_be_made_stops_the_agent_before_it_runs(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    """A masked path the relay cannot make (the snapshot's image left a file where the
    ``.cursor`` directory goes) fails the command with 126 before the program runs:
    masks are never silently skipped."""
    double.image_files = {"/workspace/.cursor": b"not a directory"}
    spec = _masked_workspace(tmp_path)
    sandbox = await backend.create(spec)
    proc = await sandbox.spawn(
        ["/usr/bin/python3", "-c", "open('/workspace/ran', 'w').write('x')"], env={}
    )
    proc.stdin.close()
    err = await asyncio.wait_for(proc.stderr.read(), 20)
    assert await asyncio.wait_for(proc.wait(), 20) == 126
    assert b"cannot make the mask point /workspace/.cursor/" in err
    record = next(iter(double.sandboxes.values()))
    assert not (record.root / "workspace" / "ran").exists()
    await backend.destroy(sandbox.sandbox_id)


async def test_without_mask_config_everything_goes_in(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    _masked_workspace(tmp_path)
    spec = _spec(tmp_path, mask_config=False)  # the same workspace, unmasked
    sandbox = await backend.create(spec)
    proc = await sandbox.spawn(
        ["/usr/bin/python3", "-c", "print(open('/workspace/.claude/settings.json').read())"],
        env={},
    )
    proc.stdin.close()
    assert _ADMITTED.strip() in (await asyncio.wait_for(proc.stdout.read(), 20)).decode()
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    await backend.destroy(sandbox.sandbox_id)


# --- admission in the sandbox's view ---------------------------------------------------


async def test_the_view_admits_a_masked_workspace_and_refuses_planted_config(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    spec = _masked_workspace(tmp_path)  # its admitted settings.json is not uploaded
    sandbox = await backend.create(spec)
    view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
    assert view.admitted, view.to_dict()
    root = double.sandboxes[sandbox.remote.id].root / "workspace"
    # What a snapshot's image could hold in /workspace, after the upload:
    (root / ".cursor").mkdir()
    (root / ".cursor" / "hooks.json").write_text("{}")
    (root / ".claude" / "settings.local.json").write_text('{"hooks": {"Stop": [1]}}')
    (root / ".mcp.json").symlink_to("/etc/hostname")
    view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
    found = {(f.path, f.rule) for f in view.findings}
    assert not view.admitted
    assert {p for p, _ in found} == {
        ".cursor/hooks.json",
        ".claude/settings.local.json",
        ".mcp.json",
    }
    assert (".mcp.json", "config.symlink") in found
    (root / ".mcp.json").unlink()  # a link would refuse the bring-back (tested above)
    await backend.destroy(sandbox.sandbox_id)
    # Planted at masked paths: never taken back to the host.
    assert not (spec.workspace / ".cursor" / "hooks.json").exists()
    assert not (spec.workspace / ".claude" / "settings.local.json").exists()


async def test_the_view_walks_up_to_the_git_root_and_is_bounded(
    tmp_path: Path, backend: DaytonaBackend, double: DaytonaDouble
) -> None:
    sandbox = await backend.create(_spec(tmp_path))
    view = await asyncio.to_thread(sandbox.admission_view, provider="claude")
    assert view.admitted
    # No .git in /workspace: the level above (/) is looked at too, and the system paths.
    assert {"/workspace/.git", "/.git", "/.mcp.json", "/.claude"} <= set(double.info_paths)
    assert "/etc/claude-code/managed-mcp.json" in double.info_paths
    assert len(double.info_paths) <= 128
    root = double.sandboxes[sandbox.remote.id].root / "workspace"
    (root / ".git").mkdir()
    double.info_paths.clear()
    view = await asyncio.to_thread(sandbox.admission_view, provider="claude")
    assert view.admitted
    assert view.git_root == Path("/workspace")
    assert "/workspace/.mcp.json" in double.info_paths
    assert "/.git" not in double.info_paths  # the Git root ends the walk
    with pytest.raises(SandboxError):  # on the loop's own thread it would deadlock
        sandbox.admission_view(provider="cursor")
    (root / ".git").rmdir()
    await backend.destroy(sandbox.sandbox_id)


async def test_a_job_whose_snapshot_plants_config_is_refused_before_launch(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    double.image_files["/workspace/.cursor/mcp.json"] = b'{"mcpServers": {"x": {}}}'
    outcome, events = await _hello_job(tmp_path, double)
    assert outcome.status == "failed", json.dumps(events)[-2000:]
    last = events[-1]
    assert last["type"] == "job.completed"
    assert last["data"]["status"] == "failed"
    assert last["data"]["error"]["code"] == "admission_refused"
    assert ".cursor/mcp.json" in json.dumps(last["data"]["error"])
    assert not any(e["type"].startswith(("agent.", "session.", "acp.")) for e in events)
    assert double.sandboxes == {}


async def test_hello_job_with_admitted_claude_settings_through_the_backend(
    tmp_path: Path, double: DaytonaDouble
) -> None:
    """The workspace's admitted .claude/settings.json is masked by content: not in the
    sandbox, not reported changed, and still on the host after the job."""
    claude = tmp_path / "ws" / ".claude"
    claude.mkdir(parents=True)
    (claude / "settings.json").write_text(_ADMITTED)
    outcome, events = await _hello_job(tmp_path, double)
    assert outcome.status == "succeeded", json.dumps(events)[-3000:]
    changed = [e for e in events if e["type"] == "workspace.changed"]
    assert changed
    assert ".claude" not in json.dumps(changed)
    assert (claude / "settings.json").read_text() == _ADMITTED


async def _hello_job(tmp_path: Path, double: DaytonaDouble) -> tuple[Any, list[dict[str, Any]]]:
    settings = Settings(
        cache_dir=tmp_path / "cache", work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets", worker_id="w-daytona",
        packs_dir=REPO / "provider_packs", shutdown_eof_grace=1.0,
    )  # fmt: skip
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# hello\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text(SECRET + "\n")
    job = parse_job({
        "v": 1, "job_id": "dt-hello", "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
        "prompt": "scenario: hello", "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 60, "memory_mb": 512, "pids": 128},
    })  # fmt: skip
    backend = DaytonaBackend(_config(tmp_path, double))
    sink = MemorySink()
    try:
        outcome = await run_job(job, settings=settings, backend=backend, sinks=[sink], environ={})
    finally:
        await backend.aclose()
    return outcome, [dict(e) for e in sink.events]


# --- the workspace's files through the file API ----------------------------------------


async def test_fs_read_write_and_artifacts_through_the_file_api(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    spec = _masked_workspace(tmp_path)
    sandbox = await backend.create(spec)
    files = sandbox.workspace_files()
    assert await files.read_text("/workspace/README.md", limit=100) == "# staged\n"
    assert await files.read_text("README.md", limit=100) == "# staged\n"
    await files.write_text("/workspace/out/deep/new.txt", "written by the client\n")
    proc = await sandbox.spawn(["/bin/cat", "/workspace/out/deep/new.txt"], env={})
    proc.stdin.close()
    assert await asyncio.wait_for(proc.stdout.read(), 20) == b"written by the client\n"
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    # An artifact: not looked up yet, so refused without waiting, then answered.
    first = files.artifact("/workspace/.claude/notes.md")
    assert first.reason == "workspace_not_reachable"
    await files.lookups_done()
    known = files.artifact("/workspace/.claude/notes.md")
    assert (known.relative, known.size, known.reason) == (".claude/notes.md", 14, None)
    # A file the worker wrote itself is known at once.
    assert files.artifact("out/deep/new.txt").size == len("written by the client\n")
    await backend.destroy(sandbox.sandbox_id)
    assert (spec.workspace / "out" / "deep" / "new.txt").read_text() == "written by the client\n"


async def test_fs_refusals_through_the_file_api(tmp_path: Path, backend: DaytonaBackend) -> None:
    spec = _masked_workspace(tmp_path)
    sandbox = await backend.create(spec)
    script = (
        "import os\n"
        "os.symlink('/etc', '/workspace/etc-link')\n"
        "os.symlink('/workspace/README.md', '/workspace/readme-link')\n"
        "os.mkdir('/workspace/dir')\n"
        "open('/workspace/big', 'w').write('x' * 5000)\n"
    )
    proc = await sandbox.spawn(["/usr/bin/python3", "-c", script], env={})
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    files = sandbox.workspace_files()
    cases = {
        "/workspace/../etc/passwd": "traversal",
        "sub/../README.md": "traversal",
        "/etc/passwd": "outside_workspace",
        "/workspace/.claude/settings.json": "masked",
        ".codex/config.toml": "masked",
        "/workspace/etc-link/passwd": "symlink",
        "readme-link": "symlink",
        "dir": "not_regular_file",
        "/workspace": "not_regular_file",
        "nothing-here": "missing",
        "": "invalid_path",
    }
    for path, reason in cases.items():
        with pytest.raises(PathRefused) as refused:
            await files.read_text(path, limit=100)
        assert refused.value.reason == reason, path
    with pytest.raises(PathRefused, match="too_large"):
        await files.read_text("big", limit=4096)
    for path, reason in {
        "/workspace/etc-link/x": "symlink",
        "readme-link": "symlink",
        ".cursor/hooks.json": "masked",
        "dir": "not_regular_file",
        "/tmp/x": "outside_workspace",
    }.items():
        with pytest.raises(PathRefused) as refused:
            await files.write_text(path, "no")
        assert refused.value.reason == reason, path
    for path in ("readme-link", "dir", "nothing-here"):
        files.artifact(path)
    await files.lookups_done()
    assert files.artifact("readme-link").reason == "symlink"
    assert files.artifact("dir").reason == "not_regular_file"
    assert files.artifact("nothing-here").reason == "missing"
    assert files.artifact("/workspace/.claude/settings.json").reason == "masked"
    await backend.destroy(sandbox.sandbox_id)  # the agent's links come back as links
    assert os.readlink(spec.workspace / "etc-link") == "/etc"
