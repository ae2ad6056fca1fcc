"""A sandbox pod that the cluster ends mid-run says why: the job fails with the
cluster's reason (``sandbox_evicted``, ``sandbox_deadline_exceeded``), not as an agent
that exited, and still settles and tears down.

Real client, real pods: the official ``kubernetes`` client against the API double
(``tests/k8s_double``, which stands in for an API server because none can run here), each
pod run on the shared Podman service, the emulator pack in its pack image. The double
ends a pod as the kubelet does: past its ``activeDeadlineSeconds`` on its own, evicted
when the test says so (``ApiDouble.evict``: node pressure, which the double has no node
to feel). The eviction needs the double; the deadline runs on a real cluster too
(``make test-k8s``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import _backend, _job, _settings
from tests.k8s_double.fixtures import Cluster, cluster, images
from worker.events.sinks import MemorySink
from worker.images.engine import EngineConfig
from worker.job import JobOutcome, run_job
from worker.sandbox.base import LABEL_JOB
from worker.sandbox.kubernetes.backend import KubernetesBackend

__all__ = ["base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_image")]

#: The emulator's scenario that keeps its turn open until cancelled: it says this first.
HANG = "scenario: hang"
WORKING = "Working on it..."
#: The pod's ``activeDeadlineSeconds`` in the deadline test: long enough for the pod to
#: start and the agent's turn to open on a loaded machine, short enough to wait for.
DEADLINE_S = 30


class Job:
    """``run_job`` in a task, its events readable while it runs."""

    def __init__(self, tmp_path: Path, backend: KubernetesBackend, prompt: str) -> None:
        self.sink = MemorySink()
        self.task = asyncio.ensure_future(
            run_job(
                _job(tmp_path, prompt, timeout_s=120),
                settings=_settings(tmp_path),
                backend=backend,
                sinks=[self.sink],
                environ={},
            )
        )

    @property
    def events(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.sink.events]

    async def until(self, found: Callable[[list[dict[str, Any]]], bool], timeout: float) -> None:
        """Wait (bounded) until the events so far are ``found``; fail if the job ended
        first."""
        deadline = time.monotonic() + timeout
        while not found(self.events):
            assert not self.task.done(), self.events[-1]
            seen = [e["type"] for e in self.sink.events]
            assert time.monotonic() < deadline, f"timed out waiting for the job's event: {seen}"
            await asyncio.sleep(0.1)

    async def settled(self, timeout: float) -> JobOutcome:
        return await asyncio.wait_for(self.task, timeout)


def _turn_open(events: list[dict[str, Any]]) -> bool:
    """The agent said what the hang scenario says first (in as many deltas as it likes)."""
    text = "".join(e["data"].get("text", "") for e in events if e["type"] == "message.delta")
    return WORKING in text


def _error(events: list[dict[str, Any]]) -> dict[str, Any]:
    last = events[-1]
    assert last["type"] == "job.completed"
    assert last["data"]["status"] == "failed"
    error: dict[str, Any] = last["data"]["error"]
    assert "Traceback" not in error["message"]
    return error


def _notices(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["code"] for e in events if e["type"] == "notice"]


async def _no_pod_left(backend: KubernetesBackend, cluster: Cluster, job_id: str) -> None:
    assert await backend.list({LABEL_JOB: job_id}) == []
    if cluster.double is not None:
        assert cluster.double.pods == {}


async def test_a_pod_evicted_mid_turn_fails_the_job_sandbox_evicted(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    if cluster.double is None:
        pytest.skip("evicting a pod on purpose needs the API double (a real node evicts)")
    backend = _backend(tmp_path, cluster, images)
    job = Job(tmp_path, backend, HANG)
    await job.until(_turn_open, timeout=120)
    pod = next(e["data"]["sandbox_id"] for e in job.events if e["type"] == "sandbox.ready")
    cluster.double.evict(cluster.namespace, pod)
    outcome = await job.settled(timeout=120)
    events = job.events
    error = _error(events)
    assert (outcome.status, error["code"]) == ("failed", "sandbox_evicted")
    assert error["details"]["reason"] == "Evicted"
    assert error["details"]["pod"] == pod
    assert "low on resource: memory" in error["message"]
    # The agent's own end stays in the details: its stream ended with the pod.
    assert "exit_code" in error["details"] or "signal" in error["details"]
    assert outcome.error is not None
    assert outcome.exit_code == outcome.error.exit_code
    assert "oom_killed" not in _notices(events)  # the SIGKILL was the eviction's
    assert "teardown_error" not in events[-1]["data"]
    await _no_pod_left(backend, cluster, events[0]["job_id"])


async def test_a_pod_past_its_deadline_mid_turn_fails_sandbox_deadline_exceeded(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    """``k8s_active_deadline_s`` caps the pod's ``activeDeadlineSeconds`` below the job's
    own timeout (120 s + the margin), so the cluster's deadline comes first."""
    backend = _backend(tmp_path, cluster, images, k8s_active_deadline_s=DEADLINE_S)
    job = Job(tmp_path, backend, HANG)
    await job.until(_turn_open, timeout=DEADLINE_S)
    outcome = await job.settled(timeout=DEADLINE_S + 120)
    events = job.events
    error = _error(events)
    assert (outcome.status, error["code"]) == ("failed", "sandbox_deadline_exceeded")
    assert error["details"]["reason"] == "DeadlineExceeded"
    assert "exit_code" in error["details"] or "signal" in error["details"]
    assert "oom_killed" not in _notices(events)
    assert "teardown_error" not in events[-1]["data"]
    if cluster.double is not None:
        (created,) = cluster.double.created
        assert created["spec"]["activeDeadlineSeconds"] == DEADLINE_S
        assert "longer than the specified deadline" in error["message"]
    await _no_pod_left(backend, cluster, events[0]["job_id"])


async def test_an_agent_that_exits_on_an_intact_pod_is_still_agent_exited(
    tmp_path: Path, cluster: Cluster, images: EngineConfig
) -> None:
    backend = _backend(tmp_path, cluster, images)
    job = Job(tmp_path, backend, "scenario: crash")
    outcome = await job.settled(timeout=180)
    events = job.events
    error = _error(events)
    assert (outcome.status, error["code"]) == ("failed", "agent_exited")
    assert error["details"]["exit_code"] == 3
    assert "reason" not in error["details"]
    assert "pod" not in error["details"]
    assert _notices(events).count("oom_killed") == 0
    await _no_pod_left(backend, cluster, events[0]["job_id"])
