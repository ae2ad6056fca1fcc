"""The daytona backend against a real Daytona account (``make test-daytona``).

Skipped unless ``DAYTONA_API_KEY`` is set, with ``DAYTONA_API_URL`` (default: Daytona's
hosted API), ``ACPW_DAYTONA_IMAGE_REGISTRY`` and ``ACPW_DAYTONA_BASE_IMAGE_ID`` naming where
the pack images were pushed, and ``DAYTONA_TEST_CLOSURE``: a pack-cache closure
(``<cache>/closures/<hex>``) whose pack image is there. Daytona's hosted service cannot
be reached from the machines this project is developed and tested on, so these tests
have not run here: ``tests/integration/test_daytona_backend.py`` runs the same backend
against the local double of Daytona's API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from worker.errors import BackendAuthFailed
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SLOT,
    LABEL_TOKEN,
    LeaseDeadline,
    ResourceLimits,
    SandboxSpec,
)
from worker.sandbox.config import DaytonaConfig
from worker.sandbox.daytona import DaytonaBackend
from worker.sandbox.files import PathRefused

_NEEDED = (
    "DAYTONA_API_KEY",
    "ACPW_DAYTONA_IMAGE_REGISTRY",
    "ACPW_DAYTONA_BASE_IMAGE_ID",
    "DAYTONA_TEST_CLOSURE",
)
_MISSING = [name for name in _NEEDED if not os.environ.get(name)]

pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"live Daytona suite: {', '.join(_MISSING)} not set (the double's suite runs instead)",
)


def _config(**overrides: object) -> DaytonaConfig:
    closure = Path(os.environ.get("DAYTONA_TEST_CLOSURE", "/nonexistent"))
    values: dict[str, object] = {
        "worker_id": "w-daytona-live",
        "cache_dir": closure.parent.parent,
        "daytona_api_url": os.environ.get("DAYTONA_API_URL", "https://app.daytona.io/api"),
        "daytona_api_key": os.environ.get("DAYTONA_API_KEY"),
        "daytona_ttl_minutes": 30,
    }
    values.update(overrides)
    return DaytonaConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def backend() -> AsyncIterator[DaytonaBackend]:
    made = DaytonaBackend(_config())
    try:
        yield made
    finally:
        await made.aclose()


def _spec(tmp_path: Path) -> SandboxSpec:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "README.md").write_text("# live\n")
    return SandboxSpec(
        job_id="live-1",
        attempt=1,
        workspace=tmp_path / "ws",
        pack_closure=Path(os.environ["DAYTONA_TEST_CLOSURE"]),
        limits=ResourceLimits(memory_bytes=1024**3, cpus=1.0, pids=256),
        labels={LABEL_JOB: "live-1"},
    )


async def test_live_stdio_workspace_and_cleanup(tmp_path: Path, backend: DaytonaBackend) -> None:
    spec = _spec(tmp_path)
    sandbox = await backend.create(spec)
    try:
        script = (
            "import sys;d=sys.stdin.read();open('/workspace/out.txt','w').write(d);print(len(d))"
        )
        proc = await sandbox.spawn(["python3", "-c", script], env={"A": "1"})
        proc.stdin.write(b"hello over input calls\n")
        proc.stdin.close()
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"23\n"
        assert await asyncio.wait_for(proc.wait(), 120) == 0
        assert [i.sandbox_id for i in await backend.list({LABEL_JOB: "live-1"})] == [
            sandbox.sandbox_id
        ]
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert (spec.workspace / "out.txt").read_text() == "hello over input calls\n"
    assert await backend.list({LABEL_JOB: "live-1"}) == []


async def test_live_wrong_key_is_backend_auth_failed() -> None:
    wrong = DaytonaBackend(_config(daytona_api_key="dtn_" + "0" * 40))
    with pytest.raises(BackendAuthFailed):
        await wrong.list({})


async def test_live_file_info_shows_links_and_fs_refuses_them(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    """What the double assumes of the real daemon: file info describes a link itself
    (mode ``L…``), so ``fs/*`` and the admission view refuse links; and the view of a
    clean workspace is admitted."""
    sandbox = await backend.create(_spec(tmp_path))
    try:
        proc = await sandbox.spawn(
            ["python3", "-c", "import os; os.symlink('/etc', '/workspace/l')"], env={}
        )
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 120) == 0
        info = await sandbox.remote.fs.get_file_info("/workspace/l")
        assert info.mode.startswith("L"), info.mode
        files = sandbox.workspace_files()
        with pytest.raises(PathRefused, match="symlink"):
            await files.read_text("/workspace/l/hostname", limit=100)
        assert await files.read_text("README.md", limit=100) == "# live\n"
        view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
        assert view.admitted, view.to_dict()
        proc = await sandbox.spawn(["rm", "/workspace/l"], env={})
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 120)
    finally:
        await backend.destroy(sandbox.sandbox_id)


async def test_live_echo_carries_no_credential(tmp_path: Path, backend: DaytonaBackend) -> None:
    """The echo check: the environment's credential reaches the program but neither its
    output as followed nor the command's log as Daytona keeps it (read back after the
    end), whatever the runner does with ``suppressInputEcho``; the header file is gone."""
    secret = "acpw-live-secret-" + os.urandom(8).hex()
    sandbox = await backend.create(_spec(tmp_path))
    try:
        script = "import os,sys;sys.stdin.read();print(len(os.environ['TOKEN']))"
        proc = await sandbox.spawn(["python3", "-c", script], env={"TOKEN": secret})
        proc.stdin.write(b"some input\n")
        proc.stdin.close()
        out = await asyncio.wait_for(proc.stdout.read(), 120)
        err = await asyncio.wait_for(proc.stderr.read(), 120)
        assert await asyncio.wait_for(proc.wait(), 120) == 0
        assert str(len(secret)).encode() in out
        assert secret.encode() not in out + err
        control = sandbox._controls[0]
        logs = await sandbox.remote.process.get_session_command_logs(control._session, control._cmd)
        assert secret not in f"{logs.stdout}{logs.stderr}{logs.output}"
        listing = await sandbox.remote.fs.list_files("/tmp")
        assert not [f.name for f in listing if f.name.startswith("acpw-launch-")]
    finally:
        await backend.destroy(sandbox.sandbox_id)


async def test_live_a_repeated_input_call_reaches_the_program_once(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    """The 504-on-input check. The hosted service cannot be made to answer 504 on
    purpose, so the retry it would cause is made by hand: every input call goes to the
    real daemon twice, as a retry after a lost answer would send it again; the real relay
    drops the copies and the program reads each message once. (The double injects the
    504 itself: ``test_an_input_applied_then_lost_reaches_the_program_once``.)"""
    sandbox = await backend.create(_spec(tmp_path))
    try:
        process = sandbox.remote.process
        send = process.send_session_command_input

        async def twice(session: str, cmd: str, data: str) -> None:
            await send(session, cmd, data)
            if data.startswith("D"):
                await send(session, cmd, data)

        process.send_session_command_input = twice  # type: ignore[method-assign]
        script = "import sys;print(repr(sys.stdin.read()))"
        proc = await sandbox.spawn(["python3", "-c", script], env={})
        for i in range(3):
            proc.stdin.write(b'{"id":%d}\n' % i)
            await proc.stdin.drain()
            await asyncio.sleep(0.5)  # one frame each
        proc.stdin.close()
        out = await asyncio.wait_for(proc.stdout.read(), 120)
        assert await asyncio.wait_for(proc.wait(), 120) == 0
        assert out.decode().strip() == repr('{"id":0}\n{"id":1}\n{"id":2}\n')
    finally:
        await backend.destroy(sandbox.sandbox_id)


async def test_live_a_snapshot_is_reused(tmp_path: Path, backend: DaytonaBackend) -> None:
    """Two sandboxes of one pack image and resources share one snapshot: the second finds
    it (same id) instead of making another."""
    spec = _spec(tmp_path)
    first = await backend.create(spec)
    try:
        name, _, _ = backend.snapshot_plan(spec)
        made = await first.client.snapshot.get(name)
    finally:
        await backend.destroy(first.sandbox_id)
    second = await backend.create(spec)
    try:
        again = await second.client.snapshot.get(name)
        assert again.id == made.id
        assert again.created_at == made.created_at
    finally:
        await backend.destroy(second.sandbox_id)


async def test_live_masked_paths_are_read_only(tmp_path: Path, backend: DaytonaBackend) -> None:
    """The relay's masks on a real runner (it needs user namespaces in the sandbox): a
    write at a masked path fails, one beside it works."""
    spec = _spec(tmp_path)
    (spec.workspace / ".cursor").mkdir()
    (spec.workspace / ".cursor" / "rules.md").write_text("rules\n")
    sandbox = await backend.create(spec)
    try:
        script = (
            "import sys\n"
            "try:\n open('/workspace/.cursor/hooks.json','w').write('{}');print('written')\n"
            "except OSError as e:\n print('refused', e.errno)\n"
            "open('/workspace/.cursor/notes.md','w').write('ok')\n"
        )
        proc = await sandbox.spawn(["python3", "-c", script], env={})
        proc.stdin.close()
        out = await asyncio.wait_for(proc.stdout.read(), 120)
        err = await asyncio.wait_for(proc.stderr.read(), 120)
        assert await asyncio.wait_for(proc.wait(), 120) == 0, err.decode()
        assert out.startswith(b"refused"), out
    finally:
        await backend.destroy(sandbox.sandbox_id)


async def test_live_a_warm_slot_is_relabelled_filled_and_bounded(
    tmp_path: Path, backend: DaytonaBackend
) -> None:
    """Warm slots on a real account (``tests/integration/test_warm_daytona.py`` runs the
    pool and real jobs against the double): a slot sandbox made with the slot's labels,
    its program started with no lease; ``assign`` replaces the labels through Daytona's
    label call (listed by the attempt's job label, ``acpw.slot`` gone, the token the
    attempt's) and arms the relay's watchdog; ``fill`` uploads the staged workspace the
    program then reads; the view admits the relay's mask points; the program dies with
    the lease once renewals stop; what it wrote comes back on ``destroy``."""
    slot_spec = _spec(tmp_path)
    slot_labels = {LABEL_JOB: "live-warm-slot", LABEL_ATTEMPT: "1", LABEL_TOKEN: "0"}
    slot = dataclasses.replace(
        slot_spec, job_id="live-warm-slot", labels={**slot_labels, LABEL_SLOT: "live-slot"}
    )
    (slot.workspace / "README.md").unlink()  # a slot's workspace is empty
    sandbox = await backend.create(slot)
    try:
        script = (
            "import sys,time\nprint('up',flush=True)\nsys.stdin.readline()\n"
            "print(open('/workspace/README.md').read().strip(),flush=True)\n"
            "open('/workspace/out.txt','w').write('warm')\ntime.sleep(300)"
        )
        proc = await sandbox.spawn(["python3", "-c", script], env={})
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"up\n"
        deadline = LeaseDeadline(time.monotonic() + 600)
        labels = {LABEL_JOB: "live-warm-1", LABEL_ATTEMPT: "1", LABEL_TOKEN: "42"}
        await backend.assign(sandbox, labels=labels, lease_deadline=deadline)
        [info] = await backend.list({LABEL_JOB: "live-warm-1"})
        assert info.sandbox_id == sandbox.sandbox_id
        assert LABEL_SLOT not in info.labels
        assert info.labels[LABEL_TOKEN] == "42"
        assert await backend.list({LABEL_SLOT: "live-slot"}) == []
        staged = tmp_path / "staged"
        staged.mkdir()
        (staged / "README.md").write_text("# warm\n")
        await backend.fill(sandbox, staged)
        view = await asyncio.to_thread(sandbox.admission_view, provider="cursor")
        assert view.admitted, view.to_dict()
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b"# warm\n"
        deadline.extend(time.monotonic() + 5)  # then never again
        assert await asyncio.wait_for(proc.wait(), 120) == -9
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert (slot.workspace / "out.txt").read_text() == "warm"
