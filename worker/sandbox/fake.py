"""A test double of ``SandboxBackend``: plain subprocesses, NO isolation.

For unit tests of code that drives a backend (the runner, the reaper) without
bubblewrap or cgroups. Processes run as the calling user on the host, with exactly the
given env; a ``cwd`` under ``WORKSPACE``, ``PACK_ROOT`` or a ``state_mounts`` target is
mapped to the spec's host directory (argv and env are not rewritten: nothing is mounted,
so an agent finds its state mounts only if a test points its HOME at them). It is
not selectable (``worker.sandbox.registry``), so settings cannot select it in
production; ``get_backend(FakeConfig())`` builds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    PACK_ROOT,
    WORKSPACE,
    Capabilities,
    PipedProcess,
    SandboxInfo,
    SandboxSpec,
)
from worker.sandbox.config import FakeConfig
from worker.sandbox.hostfiles import HostWorkspaceFiles


class FakeProcess(PipedProcess):
    """A host subprocess in its own process group."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, what="fake spawn")

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)


class FakeSandbox:
    """Records its spawns so tests can inspect them."""

    def __init__(self, sandbox_id: str, spec: SandboxSpec) -> None:
        self._id = sandbox_id
        self._spec = spec
        self.processes: list[FakeProcess] = []
        self.spawned: list[tuple[tuple[str, ...], dict[str, str], str]] = []

    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    def host_path(self, path: str) -> Path:
        """Where a sandbox path lives on the host in this fake."""
        states = [(m.target, m.source) for m in self._spec.state_mounts]
        for inside, outside in (
            (WORKSPACE, self._spec.workspace),
            (PACK_ROOT, self._spec.pack_closure),
            *states,
        ):
            if path == inside or path.startswith(inside + "/"):
                return outside / path[len(inside) :].lstrip("/")
        return Path(path)

    def workspace_files(self) -> HostWorkspaceFiles:
        """The workspace at its host path (the fake runs there), masks unapplied: the
        fake mounts none."""
        return HostWorkspaceFiles(self._spec.workspace)

    def admission_view(self, *, provider: str) -> None:
        """The fake shows no view of its own: it runs on the host."""
        del provider

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> FakeProcess:
        """Start ``argv`` as a host subprocess with exactly ``env``.

        Raises:
            SandboxError: the program could not be started.
        """
        self.spawned.append((tuple(argv), dict(env), cwd))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=stdout_limit,
                env=dict(env),
                cwd=self.host_path(cwd),
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError("fake spawn failed", argv=list(argv)) from exc
        self.processes.append(FakeProcess(proc))
        return self.processes[-1]


class FakeBackend:
    """In-memory ``SandboxBackend``; ``destroy`` kills what the sandbox spawned."""

    name = "fake"
    capabilities = Capabilities(runs_host_usr=True)

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.destroyed: list[str] = []
        self._ids = itertools.count(1)

    def stage_owner(self) -> tuple[int, int]:
        return self.config.host_owner()

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox_id = f"fake-{spec.job_id}-{spec.attempt}-{next(self._ids)}"
        self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id, spec)
        labels = {**spec.labels, LABEL_JOB: spec.job_id, LABEL_ATTEMPT: str(spec.attempt)}
        self.labels[sandbox_id] = labels
        return self.sandboxes[sandbox_id]

    async def destroy(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        self.labels.pop(sandbox_id, None)
        if sandbox is None:
            return
        self.destroyed.append(sandbox_id)
        for proc in sandbox.processes:
            proc.kill()
            await proc.wait()

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        wanted = dict(labels).items()
        return [
            SandboxInfo(sid, self.name, dict(have))
            for sid, have in self.labels.items()
            if wanted <= have.items()
        ]
