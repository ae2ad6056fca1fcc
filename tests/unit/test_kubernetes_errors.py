"""What a cluster says, as a typed error with a stable code (``worker/sandbox/kubernetes/
api.py``). The pod statuses and API answers are the client's own models, built as the API
server sends them; the unpullable image also runs through the API double
(tests/integration/test_kubernetes_backend.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from worker.errors import (
    BackendAuthFailed,
    BackendQuotaExceeded,
    ImagePullFailed,
    SandboxDeadlineExceeded,
    SandboxError,
    SandboxEvicted,
    SandboxOomKilled,
    SandboxUnschedulable,
    WorkerError,
)
from worker.sandbox.kubernetes.api import PULL_FAILURES, ended_failure, pending_failure, translate


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


@pytest.mark.parametrize("reason", sorted(PULL_FAILURES))
def test_an_image_the_kubelet_cannot_have(reason: str) -> None:
    error = pending_failure(_pod(_waiting(reason)))
    assert isinstance(error, ImagePullFailed)
    assert (error.code, error.details["reason"]) == ("image_pull_failed", reason)


def test_a_container_that_cannot_be_created_stays_sandbox_failed() -> None:
    error = pending_failure(_pod(_waiting("CreateContainerError")))
    assert error is not None
    assert (error.code, error.details["reason"]) == ("sandbox_failed", "CreateContainerError")


def test_unschedulable() -> None:
    condition = {
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient memory.",
    }  # fmt: skip
    error = pending_failure(_pod({"phase": "Pending", "conditions": [condition]}))
    assert isinstance(error, SandboxUnschedulable)
    assert error.code == "sandbox_unschedulable"
    assert "Insufficient memory" in str(error)


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
    ],
)  # fmt: skip
def test_what_the_api_refuses(
    exc: ApiException, kind: type[SandboxError], code: str, reason: str
) -> None:
    with pytest.raises(WorkerError) as caught, translate("create pod", pod="p"):
        raise exc
    assert type(caught.value) is kind
    assert (caught.value.code, caught.value.details["reason"]) == (code, reason)
    assert caught.value.details["pod"] == "p"
