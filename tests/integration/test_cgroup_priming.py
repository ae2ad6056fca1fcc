"""Cgroup migration priming (``ACPW_CGROUP_PRIME``, worker/sandbox/local/dynmods.py) on
the real kernel: a real hello job (the Cursor emulator pack, real bubblewrap, in process)
gives the local backend its head start before the sandbox is made, and every hold it took
on the primer is released by the time the job settled (a sandbox destroyed before any
spawn lets go too), and the worker is still in the cgroup it started in. On a host whose
migrations are slow (cgroup2 without ``favordynmods``: these machines as they come) the
primer really rewrote the membership, and the kernel took every rewrite; on one where
they are fast it never ran.

How much the join gains is a figure, not a test: ``benchmarks/service_agent.py``
(docs/figures.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_cancel import _job, _settings, _types
from tests.sandbox_owner import chown_to_sandbox
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox import cgroups
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend, dynmods

pytestmark = pytest.mark.integration


class _Counted(LocalBackend):
    """The real backend, counting the head starts it gave and their releases."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.primes: list[str] = []

    def prime(self) -> Callable[[], None]:
        release = super().prime()
        self.primes.append("held")

        def counted() -> None:
            self.primes.append("released")
            release()

        return counted


def _slow_migrations() -> bool:
    """Whether this host's migrations wait out a grace period (what priming is for)."""
    favored = cgroups.dynmods_favored(Path("/proc/self/mountinfo").read_text())
    return favored is False and dynmods.own_procs_file() is not None


class _Holds:
    """The holds taken on the process's primer while a test runs, and their releases
    (other tests of the process may have left their own, lapsing by themselves)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        self.released: set[int] = set()
        real = dynmods.PRIMER.hold

        def hold(**kwargs: float) -> Callable[[], None]:
            release = real(**kwargs)
            self.taken += 1
            number = self.taken

            def counted() -> None:
                self.released.add(number)
                release()

            return counted

        monkeypatch.setattr(dynmods.PRIMER, "hold", hold)

    def all_released(self) -> bool:
        return self.released == set(range(1, self.taken + 1))


def test_a_cold_job_primes_its_sandbox_start_and_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewrites: list[float] = []
    real = dynmods.PRIMER._prime

    def counted() -> None:
        real()
        rewrites.append(time.monotonic())

    monkeypatch.setattr(dynmods.PRIMER, "_prime", counted)
    holds = _Holds(monkeypatch)
    before = Path("/proc/self/cgroup").read_text()
    settings = _settings(tmp_path)
    backend = _Counted(LocalConfig.from_settings(settings))
    memory = MemorySink()
    outcome = asyncio.run(
        run_job(
            parse_job(_job(tmp_path)),
            settings=settings,
            backend=backend,
            sinks=[memory],
            environ={},
            cancel=asyncio.Event(),
        )
    )
    events = [dict(e) for e in memory.events]
    assert outcome.status == "succeeded", events[-1]
    assert "sandbox.ready" in _types(events)
    # The pipeline's head start: given once, before the sandbox, and let go.
    assert backend.primes == ["held", "released"]
    # Every hold it took was released (none left to lapse): the job's, and the sandbox's
    # own at its agent's spawn.
    assert holds.all_released()
    assert Path("/proc/self/cgroup").read_text() == before  # moved nowhere
    if _slow_migrations():
        assert holds.taken == 2  # the job's head start, then the sandbox's own
        assert rewrites, "migrations are slow here, yet the primer never rewrote"
        assert not dynmods.PRIMER.broken  # the kernel took each rewrite
    else:
        assert holds.taken == 0


def test_a_sandbox_destroyed_before_its_spawn_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds = _Holds(monkeypatch)
    settings = _settings(tmp_path)
    backend = LocalBackend(LocalConfig.from_settings(settings))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    chown_to_sandbox(workspace, backend.config)
    (tmp_path / "pack").mkdir()
    spec = SandboxSpec(
        job_id="primed-unspawned",
        attempt=1,
        workspace=workspace,
        pack_closure=tmp_path / "pack",
        limits=ResourceLimits(memory_bytes=256 << 20, cpus=1.0, pids=64),
        labels={},
    )

    async def made_and_destroyed() -> None:
        box = await backend.create(spec)
        await backend.destroy(box.sandbox_id)

    asyncio.run(made_and_destroyed())
    assert holds.taken == (1 if _slow_migrations() else 0)
    assert holds.all_released()  # not left to lapse a second later


def test_with_priming_off_nothing_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holds = _Holds(monkeypatch)
    monkeypatch.setenv("ACPW_CGROUP_PRIME", "false")
    settings = _settings(tmp_path)
    config = LocalConfig.from_settings(settings)
    assert config.cgroup_prime is False
    outcome = asyncio.run(
        run_job(
            parse_job(_job(tmp_path)),
            settings=settings,
            backend=LocalBackend(config),
            sinks=[MemorySink()],
            environ={},
            cancel=asyncio.Event(),
        )
    )
    assert outcome.status == "succeeded"
    assert holds.taken == 0
