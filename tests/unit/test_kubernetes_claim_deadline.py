"""A claimed warm slot pod's ``activeDeadlineSeconds`` (``KubernetesBackend.assign``):
the seconds it has been active, counted by the worker's clock from before its create
request (never fewer than the kubelet counts), plus the job's bound, sent in the one
merge patch that relabels it; never more than the deadline it has (the API server
takes only a lower value): a slot too old for the job's whole bound keeps its own, and
the patch leaves the field out. The pod API is a recording stand-in; the integration
tests run the same against the API double and a real cluster."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_TOKEN, ResourceLimits, SandboxSpec
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.backend import KubernetesBackend, KubernetesSandbox, claimed_deadline

CAP = 21600


class _Api:
    """Records each pod patch the backend sends."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_pod_metadata(self, name: str, **patch: Any) -> None:
        self.patches.append({"name": name, **patch})


def _claim(
    tmp_path: Path, *, active_s: float, deadline_s: int | None
) -> tuple[_Api, KubernetesSandbox, float]:
    api = _Api()
    config = KubernetesConfig(worker_id="w-1", k8s_active_deadline_s=CAP)
    backend = KubernetesBackend(config, api=api)  # type: ignore[arg-type]
    spec = SandboxSpec(
        job_id="warm-s1", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64),
        labels={LABEL_JOB: "warm-s1", LABEL_ATTEMPT: "1", LABEL_TOKEN: "0"},
    )  # fmt: skip
    begun = time.monotonic() - active_s
    sandbox = KubernetesSandbox(backend, spec, "acpw-warm-s1", deadline_s=CAP, begun=begun)
    labels = {LABEL_JOB: "j-1", LABEL_ATTEMPT: "1", LABEL_TOKEN: "7"}
    asyncio.run(backend.assign(sandbox, labels=labels, lease_deadline=None, deadline_s=deadline_s))
    return api, sandbox, time.monotonic() - begun


def test_a_claimed_pod_gets_its_seconds_active_plus_the_jobs_bound(tmp_path: Path) -> None:
    api, sandbox, active_after = _claim(tmp_path, active_s=120.2, deadline_s=960)
    [patch] = api.patches
    assert 121 + 960 <= patch["active_deadline_s"] <= math.ceil(active_after) + 960
    assert sandbox.deadline_s == patch["active_deadline_s"]
    assert patch["labels"][LABEL_JOB] == "j-1"  # in the same patch as the relabelling


@pytest.mark.parametrize("deadline_s", [CAP, None])
def test_a_slot_too_old_for_the_jobs_bound_keeps_its_deadline(
    tmp_path: Path, deadline_s: int | None
) -> None:
    """A job bound at the cap (or with none: the cap) cannot be added to a pod that has
    run: the API server would refuse the raise, so the field is not sent."""
    api, sandbox, _ = _claim(tmp_path, active_s=30, deadline_s=deadline_s)
    [patch] = api.patches
    assert patch["active_deadline_s"] is None
    assert sandbox.deadline_s == CAP


def test_the_claimed_bound_is_the_cold_pods() -> None:
    config = KubernetesConfig(k8s_active_deadline_s=CAP)
    assert claimed_deadline(960, config) == 960
    assert claimed_deadline(CAP * 2, config) == CAP
    assert claimed_deadline(None, config) == CAP
    assert claimed_deadline(0, config) == 1
