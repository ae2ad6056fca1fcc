"""Cgroup migration priming (``ACPW_CGROUP_PRIME``, worker/sandbox/local/dynmods.py) on
the real kernel: a real hello job (the Cursor emulator pack, real bubblewrap, in process)
gives the local backend its head start before the sandbox is made, and every hold on the
primer is released by the time the job settled: the primer's thread has ended and the
worker is still in the cgroup it started in. On a host whose migrations are slow (cgroup2
without ``favordynmods``: these machines as they come) the primer really rewrote the
membership, and the kernel took every rewrite; on one where they are fast it never ran.

How much the join gains is a figure, not a test: ``benchmarks/service_agent.py``
(docs/figures.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.test_cancel import _job, _settings, _types
from worker.events.sinks import MemorySink
from worker.job import run_job
from worker.jobs.spec import parse_job
from worker.sandbox import cgroups
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


def test_a_cold_job_primes_its_sandbox_start_and_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewrites: list[float] = []
    real = dynmods.PRIMER._prime

    def counted() -> None:
        real()
        rewrites.append(time.monotonic())

    monkeypatch.setattr(dynmods.PRIMER, "_prime", counted)
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
    # Every hold was released (none left to lapse): the job's, and the sandbox's own at
    # its agent's spawn; then the primer's thread ends.
    assert dynmods.PRIMER._holds == {}
    deadline = time.monotonic() + 5
    while dynmods.PRIMER._thread is not None:
        assert time.monotonic() < deadline, "the primer still runs after the job"
        time.sleep(0.01)
    assert Path("/proc/self/cgroup").read_text() == before  # moved nowhere
    if _slow_migrations():
        assert rewrites, "migrations are slow here, yet the primer never rewrote"
        assert not dynmods.PRIMER.broken  # the kernel took each rewrite
    else:
        assert rewrites == []


def test_with_priming_off_nothing_rewrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rewrites: list[int] = []
    monkeypatch.setattr(dynmods.PRIMER, "_prime", lambda: rewrites.append(1))
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
    assert rewrites == []
