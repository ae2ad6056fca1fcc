"""Warm slots on Daytona (``SlotHost``): a sandbox made for no job, its agent started,
handed to one job attempt later.

- **Assign** replaces the sandbox's labels with the attempt's, exactly those ``create``
  would have written for it, through Daytona's label call (``PUT
  /sandbox/{sandboxIdOrName}/labels``, the SDK's ``AsyncSandbox.set_labels``: the whole
  set is replaced, so the slot's ``acpw.slot`` and token ``0`` are gone and any reaper
  listing by labels judges the sandbox by the attempt's lease from then on). The call
  is idempotent, so a 429/5xx is retried as any other. The answer is untrusted: labels
  other than those sent fail the assignment. The attempt's lease then bounds the agent
  already running: an ``L`` frame arms the relay's watchdog (the slot's header had no
  lease), and each renewal sends another, as for a sandbox ``create`` made with a lease.
- **Fill** moves the staged copy into the slot's host workspace (``hostfill``: it was
  empty; ``destroy`` brings the sandbox's ``/workspace`` back there, as a cold
  sandbox's comes back to its job's) and uploads it through the file API as ``create``
  does (one tar, masked paths left out, unpacked by a session command). The unpack
  merges into ``/workspace``: the anchor directories the relay made for its masks stay
  the very directories the agent's read-only mounts are on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from worker.errors import SandboxError
from worker.sandbox import hostfill
from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_SLOT, SandboxSpec

if TYPE_CHECKING:
    from daytona import AsyncSandbox

    from worker.sandbox.base import LeaseDeadline
    from worker.sandbox.daytona.api import Api


class SlotSandbox(Protocol):
    """What of ``DaytonaSandbox`` a slot's assignment and fill use (``backend.py``
    imports this module, so it is not named here)."""

    remote: AsyncSandbox

    @property
    def sandbox_id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    def stop_keeping_active(self) -> None: ...

    def adopt(self, spec: SandboxSpec) -> None: ...

    async def arm_lease(self, deadline: LeaseDeadline) -> None: ...

    def follow_lease(self, deadline: LeaseDeadline | None) -> None: ...


class SlotBackend(Protocol):
    """What of ``DaytonaBackend`` they use."""

    api: Api

    def labels(self, spec: SandboxSpec, sandbox_id: str) -> dict[str, str]: ...


#: Labels the SDK adds to every sandbox it creates; not ours, kept as they are.
SDK_LABELS = frozenset({"code-toolbox-language"})


def is_unclaimed_slot(spec: SandboxSpec) -> bool:
    """A slot's sandbox not yet assigned to a job (nothing of a job is in it)."""
    return LABEL_SLOT in spec.labels


async def assign(
    backend: SlotBackend,
    sandbox: SlotSandbox,
    labels: Mapping[str, str],
    lease_deadline: LeaseDeadline | None,
) -> None:
    """See the module docstring.

    Raises:
        SandboxError: Daytona refused the relabel (the sandbox is gone, a 403), answered
            other labels than those sent, or the first lease frame was not delivered.
    """
    spec = sandbox.spec
    job_spec = dataclasses.replace(
        spec,
        labels=dict(labels),
        job_id=labels.get(LABEL_JOB, spec.job_id),
        attempt=int(labels.get(LABEL_ATTEMPT, str(spec.attempt))),
        lease_deadline=lease_deadline,
    )
    remote = sandbox.remote
    kept = {str(k): str(v) for k, v in (remote.labels or {}).items() if k in SDK_LABELS}
    wanted = {**kept, **backend.labels(job_spec, sandbox.sandbox_id)}
    sandbox.stop_keeping_active()
    answer = await backend.api.call(
        "relabel sandbox", lambda: remote.set_labels(wanted), sandbox_id=sandbox.sandbox_id
    )
    got = {str(k): str(v) for k, v in (answer or {}).items()}
    if got != wanted:
        raise SandboxError(
            "daytona: the sandbox's labels were not replaced as asked",
            sandbox_id=sandbox.sandbox_id,
            missing=sorted(k for k in wanted if got.get(k) != wanted[k]),
        )
    sandbox.adopt(job_spec)
    if lease_deadline is not None:
        await sandbox.arm_lease(lease_deadline)
        sandbox.follow_lease(lease_deadline)


async def fill_host(sandbox: SlotSandbox, staged: Path) -> SandboxSpec:
    """The first half of a fill (the module docstring): the staged copy moved into the
    slot's host workspace. Returns the spec of what to upload: that workspace alone
    (the HOME mounts went in at ``create``).

    Raises:
        SandboxError: a staged entry collides with one of another kind.
    """
    await asyncio.to_thread(hostfill.move_into, staged, sandbox.spec.workspace)
    return dataclasses.replace(sandbox.spec, state_mounts=())


__all__ = ["SDK_LABELS", "SlotBackend", "SlotSandbox", "assign", "fill_host", "is_unclaimed_slot"]
