"""What a cluster says, as a typed error with a stable code (``worker/sandbox/kubernetes/
api.py``). The pod statuses and API answers are the client's own models, built as the API
server sends them; the unpullable image also runs through the API double
(tests/integration/test_kubernetes_backend.py), and a pod evicted or past its deadline
mid-run too (tests/integration/test_kubernetes_midrun.py). A program whose pod ended under
it carries the pod's error in its diagnosis (``KubernetesProcess.exit_diagnosis``): here
over a stub of the one ``read_pod`` it makes."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3.exceptions
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from worker.errors import (
    BackendAuthFailed,
    BackendQuotaExceeded,
    BackendRateLimited,
    ImagePullFailed,
    SandboxDeadlineExceeded,
    SandboxError,
    SandboxEvicted,
    SandboxOomKilled,
    SandboxUnschedulable,
    WorkerError,
)
from worker.sandbox.base import ExitDiagnosis
from worker.sandbox.kubernetes.api import (
    PULL_FAILURES,
    PULL_RETRIED,
    PodApi,
    cluster_end,
    ended_failure,
    pending_failure,
    pending_wait,
    translate,
)
from worker.sandbox.kubernetes.backend import DIAGNOSIS_READ_S, KubernetesProcess, KubernetesSandbox


def _pod(status: dict[str, Any], memory: str = "536870912") -> client.V1Pod:
    body = {
        "metadata": {"name": "acpw-j-1-abc"},
        "spec": {
            "containers": [
                {"name": "agent", "image": "x", "resources": {"limits": {"memory": memory}}}
            ]
        },
        "status": status,
    }
    # As the client reads the API server's answer (its own deserializer).
    pod = client.ApiClient()._ApiClient__deserialize(body, "V1Pod")  # type: ignore[attr-defined]
    assert isinstance(pod, client.V1Pod)
    return pod


def _waiting(reason: str) -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": f"{reason} here"}}
    return {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "agent", "image": "x", "imageID": "", "ready": False,
             "restartCount": 0, "state": state}
        ],
    }  # fmt: skip


@pytest.mark.parametrize("reason", sorted(PULL_FAILURES - PULL_RETRIED))
def test_an_image_the_kubelet_cannot_have(reason: str) -> None:
    error = pending_failure(_pod(_waiting(reason)))
    assert isinstance(error, ImagePullFailed)
    assert (error.code, error.details["reason"]) == ("image_pull_failed", reason)


@pytest.mark.parametrize("reason", sorted(PULL_RETRIED))
def test_a_pull_the_kubelet_retries_is_waited_out(reason: str) -> None:
    """ErrImagePull and ImagePullBackOff are the kubelet between two tries: not a failure
    yet (``wait_running`` bounds them with k8s_image_pull_timeout_s)."""
    pod = _pod(_waiting(reason))
    assert pending_failure(pod) is None
    assert pending_wait(pod) == (reason, f"{reason} here")


def test_a_container_that_cannot_be_created_stays_sandbox_failed() -> None:
    error = pending_failure(_pod(_waiting("CreateContainerError")))
    assert error is not None
    assert (error.code, error.details["reason"]) == ("sandbox_failed", "CreateContainerError")


def test_unschedulable() -> None:
    condition = {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient memory.",
    }  # fmt: skip
    pod = _pod({"phase": "Pending", "conditions": [condition]})
    # A node may be on its way (cluster-autoscaler, Karpenter): waited out, not failed.
    assert pending_failure(pod) is None
    assert pending_wait(pod) == ("Unschedulable", condition["message"])


class _Waiting(PodApi):
    """A PodApi over a pod that stays pending as ``status`` says, with one event."""

    def __init__(self, status: dict[str, Any]) -> None:  # no client: no API
        self.pod = _pod(status)

    def read_pod(self, name: str, **_: Any) -> client.V1Pod:
        return self.pod

    def pod_events(self, name: str) -> list[dict[str, Any]]:
        return [{"type": "Warning", "reason": "FailedScheduling", "message": "no node"}]


@pytest.mark.parametrize(
    ("status", "kind", "code", "reason"),
    [
        ({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient memory."}]},
         SandboxUnschedulable, "sandbox_unschedulable", "Unschedulable"),
        ({**_waiting("ImagePullBackOff"), "conditions": [
            {"type": "PodScheduled", "status": "True"}]},
         ImagePullFailed, "image_pull_failed", "ImagePullBackOff"),
    ],
)  # fmt: skip
def test_a_wait_past_its_bound_fails_with_the_pods_conditions_and_events(
    monkeypatch: pytest.MonkeyPatch,
    status: dict[str, Any],
    kind: type[SandboxError],
    code: str,
    reason: str,
) -> None:
    stub = _Waiting(status)
    monkeypatch.setattr("worker.sandbox.kubernetes.api.POLL_S", 0.01)
    with pytest.raises(SandboxError) as caught:
        stub.wait_running("acpw-j-1-abc", 60.0, unschedulable_s=0.05, pull_s=0.05)
    error = caught.value
    assert type(error) is kind
    assert (error.code, error.details["reason"]) == (code, reason)
    assert error.details["conditions"][0]["type"] == "PodScheduled"
    assert error.details["events"] == stub.pod_events("")
    assert error.details["waited_s"] >= 0.05


@pytest.mark.parametrize(
    ("reason", "kind", "code"),
    [
        ("Evicted", SandboxEvicted, "sandbox_evicted"),
        ("DeadlineExceeded", SandboxDeadlineExceeded, "sandbox_deadline_exceeded"),
    ],
)
def test_a_pod_the_cluster_ended(reason: str, kind: type[SandboxError], code: str) -> None:
    pod = _pod({"phase": "Failed", "reason": reason, "message": "the node said so"})
    for error in (pending_failure(pod), ended_failure(pod)):
        assert isinstance(error, kind)
        assert (error.code, error.details["reason"]) == (code, reason)


def test_an_oom_killed_pod_names_its_limit() -> None:
    terminated = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "agent", "image": "x", "imageID": "", "ready": False,
             "restartCount": 0, "state": terminated}
        ],
    }  # fmt: skip
    error = ended_failure(_pod(status, memory="256Mi"))
    assert isinstance(error, SandboxOomKilled)
    assert error.code == "oom_killed"
    assert error.details["memory_limit"] == "256Mi"


def _refused(status: int, reason: str, message: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "reason": reason, "message": message})
    return exc


@pytest.mark.parametrize(
    ("exc", "kind", "code", "reason"),
    [
        (
            _refused(403, "Forbidden", 'pods "p" is forbidden: exceeded quota: q'),
            BackendQuotaExceeded, "backend_quota_exceeded", "QuotaExceeded",
        ),
        (
            _refused(403, "Forbidden", 'pods is forbidden: User "x" cannot create resource'),
            BackendAuthFailed, "backend_auth_failed", "Forbidden",
        ),
        (_refused(401, "Unauthorized", "Unauthorized"), BackendAuthFailed,
         "backend_auth_failed", "Unauthorized"),
        (_refused(409, "AlreadyExists", "exists"), SandboxError, "sandbox_failed", "AlreadyExists"),
        (_refused(429, "TooManyRequests", "slow down"), BackendRateLimited,
         "backend_rate_limited", "TooManyRequests"),
        # An exec whose WebSocket handshake the API refused: the client's status 0 with
        # the handshake's status line and body in its reason (websocket-client's words).
        (ApiException(status=0, reason=(
            "Handshake status 403 Forbidden -+-+- {'content-type': 'application/json'} "
            '-+-+- {"kind":"Status","reason":"Forbidden","message":"pods \\"p\\" is '
            'forbidden: cannot create resource \\"pods/exec\\""}')),
         BackendAuthFailed, "backend_auth_failed", "Forbidden"),
        (ApiException(status=0, reason="Handshake status 401 Unauthorized -+-+- {} -+-+- None"),
         BackendAuthFailed, "backend_auth_failed", "Unauthorized"),
        (ApiException(status=0, reason="[Errno 111] Connection refused"), SandboxError,
         "sandbox_failed", "Unreachable"),
        (urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104)),
         SandboxError, "sandbox_failed", "Unreachable"),
    ],
)  # fmt: skip
def test_what_the_api_refuses(
    exc: Exception, kind: type[SandboxError], code: str, reason: str
) -> None:
    with pytest.raises(WorkerError) as caught, translate("create pod", pod="p"):
        raise exc
    assert type(caught.value) is kind
    assert (caught.value.code, caught.value.details["reason"]) == (code, reason)
    assert caught.value.details["pod"] == "p"


# --- a pod the cluster ended under a program exec'd in it (the diagnosis) -------------


def _container(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": "agent", "image": "x", "imageID": "", "ready": False,
         "restartCount": 0, "state": state}
    ]  # fmt: skip


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
OOM = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}


@pytest.mark.parametrize(
    ("status", "kind", "code", "reason"),
    [
        # Ended: the kubelet's reason and phase.
        ({"phase": "Failed", "reason": "Evicted",
          "message": "The node was low on resource: memory."},
         SandboxEvicted, "sandbox_evicted", "Evicted"),
        ({"phase": "Failed", "reason": "DeadlineExceeded",
          "message": "Pod was active on the node longer than the specified deadline"},
         SandboxDeadlineExceeded, "sandbox_deadline_exceeded", "DeadlineExceeded"),
        # Ending: the reason is there while the containers are still being stopped.
        ({"phase": "Running", "reason": "DeadlineExceeded",
          "containerStatuses": _container(RUNNING)},
         SandboxDeadlineExceeded, "sandbox_deadline_exceeded", "DeadlineExceeded"),
        ({"phase": "Running", "reason": "Evicted"}, SandboxEvicted, "sandbox_evicted", "Evicted"),
        # The pod's container OOM-killed (the pod may still say Running a moment).
        ({"phase": "Running", "containerStatuses": _container(OOM)},
         SandboxOomKilled, "oom_killed", "OOMKilled"),
        # Failed for a reason of no class of its own: still typed, sandbox_failed.
        ({"phase": "Failed", "containerStatuses": _container(
            {"terminated": {"reason": "Error", "exitCode": 1}})},
         SandboxError, "sandbox_failed", "Error"),
    ],
)  # fmt: skip
def test_a_pod_the_cluster_ended_mid_run(
    status: dict[str, Any], kind: type[SandboxError], code: str, reason: str
) -> None:
    error = cluster_end(_pod(status, memory="256Mi"))
    assert type(error) is kind
    assert (error.code, error.details["reason"]) == (code, reason)
    assert error.details["pod"] == "acpw-j-1-abc"
    if code == "oom_killed":
        assert error.details["memory_limit"] == "256Mi"


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Running", "containerStatuses": _container(RUNNING)},
        {"phase": "Running"},
        {"phase": "Pending"},
        {},
    ],
)
def test_an_intact_pod_says_nothing(status: dict[str, Any]) -> None:
    assert cluster_end(_pod(status)) is None


class _Api:
    """``read_pod`` as the backend calls it, answering ``answer`` (raised if an error)."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, 0

    def read_pod(self, name: str, *, timeout_s: float | None = None) -> client.V1Pod | None:
        self.calls += 1
        assert name == "acpw-j-1-abc"
        assert timeout_s == DIAGNOSIS_READ_S  # bounded at the request too
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


def _sandbox(answer: Any) -> tuple[KubernetesSandbox, _Api]:
    api = _Api(answer)
    backend: Any = SimpleNamespace(api=api, config=SimpleNamespace(worker_id="w-1"))
    spec: Any = SimpleNamespace(labels={}, job_id="j", attempt=1, network="none")
    sandbox = KubernetesSandbox(backend, spec, "acpw-j-1-abc", deadline_s=60, begun=0.0)
    return sandbox, api


def _stream(status: int) -> Any:
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    done.set_result(status)
    return SimpleNamespace(stdin=None, stdout=None, stderr=None, status=done)


EVICTED = {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}


async def test_a_program_whose_pod_was_evicted_carries_the_pods_error() -> None:
    sandbox, api = _sandbox(_pod(EVICTED))
    process = KubernetesProcess(sandbox, _stream(137), 7)
    await process.wait()
    diagnosis = await process.exit_diagnosis()
    assert isinstance(diagnosis.sandbox_error, SandboxEvicted)
    # The SIGKILL was the eviction's, not the OOM killer's; the signal stays.
    assert (diagnosis.signal, diagnosis.oom_killed) == ("SIGKILL", False)
    assert api.calls == 1


async def test_a_program_on_an_intact_pod_is_diagnosed_as_before() -> None:
    sandbox, _ = _sandbox(_pod({"phase": "Running"}))
    process = KubernetesProcess(sandbox, _stream(3), 7)
    await process.wait()
    assert await process.exit_diagnosis() == ExitDiagnosis(3, None)
    killed = KubernetesProcess(sandbox, _stream(137), 8)
    await killed.wait()
    assert await killed.exit_diagnosis() == ExitDiagnosis(None, "SIGKILL", oom_killed=True)


@pytest.mark.parametrize(
    "answer",
    [
        SandboxError("kubernetes read pod failed", reason="Unreachable", status=0),
        RuntimeError("a bug in the client"),
        None,  # the pod is gone already
    ],
)
async def test_a_pod_that_cannot_be_read_gives_the_plain_diagnosis(answer: Any) -> None:
    sandbox, api = _sandbox(answer)
    process = KubernetesProcess(sandbox, _stream(3), 7)
    await process.wait()
    assert await process.exit_diagnosis() == ExitDiagnosis(3, None)
    assert api.calls == 1


async def test_an_end_of_ours_reads_no_pod() -> None:
    """terminate/kill/destroy explain the end: the pod is not asked."""
    sandbox, api = _sandbox(_pod(EVICTED))
    process = KubernetesProcess(sandbox, _stream(143), 7)
    process.signalled = True  # as terminate() sets it
    await process.wait()
    assert await process.exit_diagnosis() == ExitDiagnosis(None, "SIGTERM")
    sandbox.destroying = True
    other = KubernetesProcess(sandbox, _stream(137), 8)
    await other.wait()
    assert (await other.exit_diagnosis()).sandbox_error is None
    running = KubernetesProcess(sandbox, SimpleNamespace(
        stdin=None, stdout=None, stderr=None,
        status=asyncio.get_running_loop().create_future()), 9)  # fmt: skip
    assert await running.exit_diagnosis() == ExitDiagnosis(None, None)
    assert api.calls == 0
