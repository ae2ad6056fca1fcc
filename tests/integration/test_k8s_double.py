"""The API double speaks the subset of the Kubernetes API the backend uses, to the
official ``kubernetes`` client, and runs what it is given on Podman.

There is no Kubernetes API server on this machine (nor in CI): ``tests/k8s_double``
stands in for one. These tests pin what the backend's tests rely on: a request the real
API would reject is rejected (the client's models and the OpenAPI schema), the token is
required, the exec WebSocket carries stdin (with v5's close as its EOF), stdout,
stderr and the exit status as the API's channel protocol does, pods are listed by
label selector and deleted, and a pod past its ``activeDeadlineSeconds`` or evicted ends
as the kubelet ends it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import urllib3.exceptions
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from websocket import WebSocketConnectionClosedException

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.k8s_double import server
from tests.k8s_double.fixtures import NAMESPACE, base_by_digest, k8s_double, kubeconfig
from tests.k8s_double.pods import Gate, podman
from tests.k8s_double.server import V4, ApiDouble

__all__ = [
    "base_by_digest",
    "base_image",
    "docker_host",
    "engine_config",
    "k8s_double",
    "kubeconfig",
]

pytestmark = pytest.mark.integration

KEEPER = ["/usr/bin/python3", "-I", "-S", "-c", "import signal; signal.pause()"]
#: A main process that outlives SIGTERM (it traps it and sleeps on): only SIGKILL ends it.
DEAF = [
    "/usr/bin/python3", "-I", "-S", "-c",
    "import signal,time; signal.signal(signal.SIGTERM, lambda *a: None); time.sleep(600)",
]  # fmt: skip


@contextmanager
def _api(kubeconfig: Path) -> Iterator[client.CoreV1Api]:
    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()


@pytest.fixture
def core(kubeconfig: Path) -> Iterator[client.CoreV1Api]:
    with _api(kubeconfig) as api:
        yield api


def _pod(name: str, image: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"acpw.test": "double", **labels}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "agent", "image": image, "command": KEEPER}],
        },
    }


def _running(core: client.CoreV1Api, name: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        if pod.status.phase != "Pending":
            return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} still pending")


def _exec(
    core: client.CoreV1Api, name: str, command: list[str], stdin: bytes
) -> tuple[bytes, bytes, dict[str, Any]]:
    ws = stream(
        core.connect_get_namespaced_pod_exec, name, NAMESPACE, command=command,
        stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
    )  # fmt: skip
    assert ws.subprotocol == "v5.channel.k8s.io"
    ws.write_stdin(stdin)
    ws.close_channel(0)
    out, err, status = b"", b"", b""
    while ws.is_open():
        ws.update(timeout=5)
        out += ws.read_channel(1)
        err += ws.read_channel(2)
        status += ws.read_channel(3)
    ws.close()
    ws.sock.shutdown()  # close() leaves the socket open once the server closed first
    return out, err, json.loads(status)


def test_a_request_the_api_would_reject_is_rejected(core: client.CoreV1Api) -> None:
    pod = _pod("misspelt", "localhost/x@sha256:" + "0" * 64)
    pod["spec"]["containers"][0]["comand"] = ["true"]  # unknown field: strict schema
    api = core.api_client
    # Through the client's own transport: its models would refuse the field themselves.
    response = api.call_api(
        *api.param_serialize(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=pod,
            header_params={"Content-Type": "application/json"}, auth_settings=["BearerToken"],
        )
    )  # fmt: skip
    response.read()
    assert response.status == 422
    assert b"comand" in response.data


def test_a_pods_labels_and_annotations_are_merge_patched_and_nothing_else(
    core: client.CoreV1Api, base_by_digest: str
) -> None:
    """A merge patch and a strategic merge patch change a running pod's labels and
    annotations (a null removes a key), as the API server does; a change of its spec or
    an invalid label value is a 422 and changes nothing."""
    core.create_namespaced_pod(NAMESPACE, _pod("patched", base_by_digest, gone="x"))
    _running(core, "patched")
    merge = "application/merge-patch+json"
    body = {"metadata": {"labels": {"gone": None, "new": "v"}, "annotations": {"a": "b"}}}
    core.patch_namespaced_pod("patched", NAMESPACE, body, _content_type=merge)
    strategic = {"metadata": {"labels": {"more": "w"}}}
    core.patch_namespaced_pod(
        "patched", NAMESPACE, strategic, _content_type="application/strategic-merge-patch+json"
    )
    pod = core.read_namespaced_pod("patched", NAMESPACE)
    assert pod.metadata.labels == {"acpw.test": "double", "new": "v", "more": "w"}
    assert pod.metadata.annotations == {"a": "b"}
    for refused in (
        {"spec": {"containers": [{"name": "agent", "command": ["true"]}]}},
        {"metadata": {"labels": {"new": "not a label value"}}},
    ):
        with pytest.raises(ApiException) as caught:
            core.patch_namespaced_pod("patched", NAMESPACE, refused, _content_type=merge)
        assert caught.value.status == 422
    assert core.read_namespaced_pod("patched", NAMESPACE).metadata.labels == pod.metadata.labels
    core.delete_namespaced_pod("patched", NAMESPACE, grace_period_seconds=0)


def test_a_running_pods_deadline_may_be_lowered_never_raised(
    core: client.CoreV1Api, base_by_digest: str, k8s_double: ApiDouble
) -> None:
    """``spec.activeDeadlineSeconds`` of a running pod, as the API server's pod update
    validation rules it: lowered, the kubelet ends the pod by the new value (counted from
    its start); raised or removed, a 422 ``Invalid`` whose cause names the field, in the
    API server's words, and the pod keeps its deadline."""
    pod = _pod("deadline", base_by_digest)
    pod["spec"] |= {"activeDeadlineSeconds": 600, "terminationGracePeriodSeconds": 1}
    core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(pod))
    assert _running(core, "deadline").status.phase == "Running"
    merge = "application/merge-patch+json"
    for value, detail in (
        (601, "Invalid value: 601: must be less than or equal to previous value"),
        (None, "Invalid value: null: must not update from a positive integer to nil value"),
    ):
        body = {"spec": {"activeDeadlineSeconds": value}}
        with pytest.raises(ApiException) as caught:
            core.patch_namespaced_pod("deadline", NAMESPACE, body, _content_type=merge)
        status = json.loads(caught.value.body)
        assert (caught.value.status, status["reason"]) == (422, "Invalid")
        assert status["details"]["causes"] == [
            {
                "reason": "FieldValueInvalid",
                "message": detail,
                "field": "spec.activeDeadlineSeconds",
            }
        ]
        assert status["message"] == (
            f'Pod "deadline" is invalid: spec.activeDeadlineSeconds: {detail}'
        )
    assert core.read_namespaced_pod("deadline", NAMESPACE).spec.active_deadline_seconds == 600
    left = k8s_double.deadline_left(NAMESPACE, "deadline")
    assert left is not None
    assert left > 500
    body = {"spec": {"activeDeadlineSeconds": 3}}
    core.patch_namespaced_pod("deadline", NAMESPACE, body, _content_type=merge)
    assert core.read_namespaced_pod("deadline", NAMESPACE).spec.active_deadline_seconds == 3
    ended = _ended(core, "deadline")
    assert ended.status.reason == "DeadlineExceeded"
    core.delete_namespaced_pod("deadline", NAMESPACE, grace_period_seconds=0)


def test_the_token_is_required(k8s_double: ApiDouble, tmp_path: Path) -> None:
    path = k8s_double.kubeconfig(tmp_path / "kc", namespace=NAMESPACE)
    data = json.loads(path.read_text())
    data["users"][0]["user"]["token"] = "wrong"
    path.write_text(json.dumps(data))
    with _api(path) as api, pytest.raises(ApiException) as refused:
        api.list_namespaced_pod(NAMESPACE)
    assert refused.value.status == 401


def test_exec_carries_stdio_eof_and_exit_status(
    core: client.CoreV1Api, base_by_digest: str, k8s_double: ApiDouble
) -> None:
    core.create_namespaced_pod(
        NAMESPACE, client.V1Pod.from_dict(_pod("exec-probe", base_by_digest))
    )
    assert _running(core, "exec-probe").status.phase == "Running"
    # cat ends only at stdin's EOF (v5 close); its output, then stderr, then the status.
    script = "cat; echo to-stderr >&2; exit 3"
    out, err, status = _exec(core, "exec-probe", ["/bin/sh", "-c", script], b"x" * 70000)
    assert (out, err) == (b"x" * 70000, b"to-stderr\n")
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    out, _, status = _exec(core, "exec-probe", ["/bin/echo", "done"], b"")
    assert (out, status["status"]) == (b"done\n", "Success")
    listed = core.list_namespaced_pod(NAMESPACE, label_selector="acpw.test=double")
    assert [p.metadata.name for p in listed.items] == ["exec-probe"]
    assert core.list_namespaced_pod(NAMESPACE, label_selector="acpw.test=other").items == []
    core.delete_namespaced_pod("exec-probe", NAMESPACE)
    assert ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/exec-probe") in k8s_double.requests


def _ended(core: client.CoreV1Api, name: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        if pod.status.phase == "Failed":
            return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {name} did not end")


def test_the_kubelet_ends_pods_past_their_deadline_and_evicted_ones(
    core: client.CoreV1Api, base_by_digest: str, k8s_double: ApiDouble
) -> None:
    """As the kubelet: a pod past ``activeDeadlineSeconds`` is ``Failed``,
    ``DeadlineExceeded``; one evicted (the test's control: the double has no node to be
    short of memory) is ``Failed``, ``Evicted``. Both stop their containers (no exec
    any more) and stay until deleted; an intact pod beside them runs on."""
    expiring = _pod("expiring", base_by_digest)
    expiring["spec"] |= {"activeDeadlineSeconds": 3, "terminationGracePeriodSeconds": 1}
    for pod in (expiring, _pod("evicted", base_by_digest), _pod("intact", base_by_digest)):
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(pod))
    for name in ("evicted", "intact"):
        assert _running(core, name).status.phase == "Running"
    k8s_double.evict(NAMESPACE, "evicted")
    evicted = _ended(core, "evicted")
    assert (evicted.status.reason, evicted.status.message) == (
        "Evicted",
        "The node was low on resource: memory.",
    )
    expired = _ended(core, "expiring")
    assert expired.status.reason == "DeadlineExceeded"
    assert "longer than the specified deadline" in expired.status.message
    for name in ("evicted", "expiring"):
        with pytest.raises(ApiException) as refused:
            _exec(core, name, ["/bin/true"], b"")
        assert "400" in str(refused.value)  # the handshake's answer, as the client words it
        terminated = core.read_namespaced_pod(name, NAMESPACE).status.container_statuses
        assert terminated[0].state.terminated is not None
    assert core.read_namespaced_pod("intact", NAMESPACE).status.phase == "Running"
    # The eviction was the test's own call: the API saw only reads of that pod.
    assert {m for m, p in k8s_double.requests if p.endswith("/pods/evicted")} == {"GET"}


def _open(core: client.CoreV1Api, name: str, command: list[str]) -> Any:
    return stream(
        core.connect_get_namespaced_pod_exec, name, NAMESPACE, command=command,
        stdin=True, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
    )  # fmt: skip


def _to_end(ws: Any, ping_s: float | None = None) -> tuple[bytes, bytes]:
    """stdout and the status channel until the stream ends or drops (pinging every
    ``ping_s``)."""
    out, status, pinged = b"", b"", time.monotonic()
    with contextlib.suppress(WebSocketConnectionClosedException):
        while ws.is_open():
            if ping_s is not None and time.monotonic() - pinged > ping_s:
                ws.sock.ping()
                pinged = time.monotonic()
            ws.update(timeout=0.2)
            out += ws.read_channel(1)
            status += ws.read_channel(3)
    ws.close()
    ws.sock.shutdown()
    return out, status


def test_a_v4_only_double_has_no_eof_and_its_idle_cut_off_drops_silent_streams(
    core: client.CoreV1Api, base_by_digest: str, k8s_double: ApiDouble
) -> None:
    """``protocols=(V4,)``: v4 is negotiated and v5's close message is data nobody reads
    (no EOF); ``idle_cutoff_s``: a stream with no frame either way for that long is
    dropped without a Status, and pings keep one alive."""
    k8s_double.protocols, k8s_double.idle_cutoff_s = (V4,), 1.5
    core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(_pod("v4-probe", base_by_digest)))
    assert _running(core, "v4-probe").status.phase == "Running"
    ws = _open(core, "v4-probe", ["cat"])
    assert ws.subprotocol == V4
    ws.write_stdin(b"x")
    ws.sock.send(bytes([255, 0]), opcode=0x2)  # v5's close of stdin, sent anyway
    began = time.monotonic()
    out, status = _to_end(ws)  # cat never sees an EOF: the idle cut-off ends the stream
    assert (out, status) == (b"x", b"")
    assert time.monotonic() - began >= 1.5
    # Silent for twice the cut-off: pinged, the stream lasts to its Status.
    out, status = _to_end(_open(core, "v4-probe", ["/bin/sh", "-c", "sleep 3; echo ok"]), 0.5)
    assert (out, json.loads(status)["status"]) == (b"ok\n", "Success")
    out, status = _to_end(_open(core, "v4-probe", ["/bin/sh", "-c", "sleep 3; echo ok"]))
    assert (out, status) == (b"", b"")
    core.delete_namespaced_pod("v4-probe", NAMESPACE)


# --- a cluster under load, as the double plays one -----------------------------------


def _double_api(double: ApiDouble, tmp_path: Path) -> Any:
    return _api(double.kubeconfig(tmp_path / "kc-own", namespace=NAMESPACE))


def test_rbac_is_enforced_as_requests_arrive(
    docker_host: str, base_by_digest: str, tmp_path: Path
) -> None:
    """A verb the Role lacks is a 403 when it is asked, as the API server's authorizer
    answers (not found afterwards in the log): a delete, and an exec, whose WebSocket
    handshake is refused."""
    granted = set(server.ROLE) - {("", "pods", "delete"), ("", "pods/exec", "create")}
    double = ApiDouble(docker_host, granted=granted)
    double.start()
    try:
        with _double_api(double, tmp_path) as core:
            core.create_namespaced_pod(
                NAMESPACE, client.V1Pod.from_dict(_pod("rbac", base_by_digest))
            )
            _running(core, "rbac")
            with pytest.raises(ApiException) as refused:
                core.delete_namespaced_pod("rbac", NAMESPACE)
            assert refused.value.status == 403
            answer = json.loads(refused.value.body)
            assert answer["reason"] == "Forbidden"
            assert 'cannot delete resource "pods"' in answer["message"]
            with pytest.raises(ApiException) as handshake:
                _exec(core, "rbac", ["/bin/true"], b"")
            assert "Handshake status 403" in str(handshake.value.reason)
            assert core.read_namespaced_pod("rbac", NAMESPACE).metadata.deletion_timestamp is None
    finally:
        double.close()


def test_faults_are_injected_per_route_deterministically(
    core: client.CoreV1Api, k8s_double: ApiDouble
) -> None:
    """The next N calls of a route fail as told (503; 429 with Retry-After; a reset),
    then it answers again; other routes are untouched."""
    k8s_double.faults.inject("list pods", 2, status=503)
    k8s_double.faults.inject("list pods", 1, status=429, retry_after=1)
    answers = []
    for _ in range(3):
        # Raw HTTP: urllib3 under the client would itself wait out a 429's Retry-After.
        connection = http.client.HTTPConnection(urlsplit(k8s_double.url).netloc)
        connection.request(
            "GET",
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            headers={"Authorization": f"Bearer {k8s_double.token}"},
        )
        response = connection.getresponse()
        answer = json.loads(response.read())
        answers.append((response.status, answer["reason"], response.getheader("Retry-After")))
        connection.close()
    assert answers == [
        (503, "ServiceUnavailable", None),
        (503, "ServiceUnavailable", None),
        (429, "TooManyRequests", "1"),
    ]
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert k8s_double.faults.served == {"list pods": 3}
    # A reset: no answer at all (urllib3 gives up on a POST at once).
    k8s_double.faults.inject("create pods", 1, reset=True)
    absent = _pod("reset", "localhost/x@sha256:" + "0" * 64)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(absent))
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert k8s_double.faults.served == {"list pods": 3, "create pods": 1}


def test_a_reset_after_serving_loses_only_the_answer(
    core: client.CoreV1Api, k8s_double: ApiDouble, base_by_digest: str
) -> None:
    k8s_double.faults.inject("create pods", 1, reset="after")
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(_pod("late", base_by_digest)))
    assert [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items] == ["late"]
    with pytest.raises(ApiException) as again:
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(_pod("late", base_by_digest)))
    assert again.value.status == 409


def _phases(core: client.CoreV1Api, name: str, timeout: float = 90) -> list[str]:
    """What the pod waited on, in order (each change once), until it ran."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = core.read_namespaced_pod(name, NAMESPACE).status
        if status.phase == "Running":
            return seen
        now = "?"
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                now = cond.reason
        for cs in status.container_statuses or []:
            if cs.state.waiting is not None and now == "?":
                now = cs.state.waiting.reason
        if not seen or seen[-1] != now:
            seen.append(now)
        time.sleep(0.1)
    raise AssertionError(f"pod {name} did not run: {seen}: {status}")


def test_a_pod_waits_unschedulable_then_fails_its_pulls_then_runs(
    core: client.CoreV1Api, k8s_double: ApiDouble, base_by_digest: str
) -> None:
    """As on a cluster adding a node: Unschedulable (the scheduler's condition and its
    FailedScheduling event) for a while, then scheduled; the pull fails twice (the
    container waiting ErrImagePull, then ImagePullBackOff, with the kubelet's events),
    then the pod runs."""
    k8s_double.gate = Gate(unschedulable_s=2, pull_failures=2, pull_backoff_s=2)
    core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(_pod("slow", base_by_digest)))
    pod = core.read_namespaced_pod("slow", NAMESPACE)
    assert pod.spec.node_name is None
    (condition,) = pod.status.conditions
    assert (condition.type, condition.status, condition.reason) == (
        "PodScheduled", "False", "Unschedulable",
    )  # fmt: skip
    assert "nodes are available" in condition.message
    phases = _phases(core, "slow")
    assert [p for p in phases if p != "ContainerCreating"] == [
        "Unschedulable", "ErrImagePull", "ImagePullBackOff", "ErrImagePull", "ImagePullBackOff",
    ]  # fmt: skip
    assert core.read_namespaced_pod("slow", NAMESPACE).spec.node_name == "double-node"
    events = core.list_namespaced_event(
        NAMESPACE, field_selector="involvedObject.kind=Pod,involvedObject.name=slow"
    ).items
    # A repeat of one reason and message counts up (the API's event aggregation).
    assert [(e.reason, e.count) for e in events] == [
        ("FailedScheduling", 1), ("Failed", 2), ("BackOff", 2),
    ]  # fmt: skip
    assert all(e.involved_object.name == "slow" for e in events)
    with pytest.raises(ApiException) as unsupported:
        core.list_namespaced_event(NAMESPACE, field_selector="reason=Failed")
    assert unsupported.value.status == 400


def _engine_running(double: ApiDouble, name: str) -> bool:
    pod = double.pods.get((NAMESPACE, name)) or _gone[name]
    state = podman(double.docker_host, "inspect", "--format", "{{.State.Running}}",
                   pod.container_name("agent"))  # fmt: skip
    assert state.returncode == 0 or "no such" in state.stderr.lower(), state.stderr
    return state.stdout.strip() == "true"


_gone: dict[str, Any] = {}


#: The graceful deletion's grace, waited out in full (its container ignores SIGTERM): long
#: enough to read the pod back while it terminates.
GRACE_S = 5


def test_deletion_is_graceful_and_grace_zero_leaves_containers_running(
    core: client.CoreV1Api, k8s_double: ApiDouble, base_by_digest: str
) -> None:
    """A graceful delete keeps the pod (deletionTimestamp, deletionGracePeriodSeconds)
    while its container gets SIGTERM, here ignored, until SIGKILL at the grace's end;
    only then is it gone. Grace 0 removes the object at once
    and its container is still running after that."""
    k8s_double.force_lag_s = 15
    for name in ("graceful", "forced"):
        pod = _pod(name, base_by_digest)
        pod["spec"]["containers"][0]["command"] = DEAF
        core.create_namespaced_pod(NAMESPACE, client.V1Pod.from_dict(pod))
        _running(core, name)
        _gone[name] = k8s_double.pods[(NAMESPACE, name)]
    core.delete_namespaced_pod("graceful", NAMESPACE, grace_period_seconds=GRACE_S)
    terminating = core.read_namespaced_pod("graceful", NAMESPACE)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == GRACE_S
    deadline = time.monotonic() + 120
    while (NAMESPACE, "graceful") in k8s_double.pods and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("graceful", NAMESPACE)
    assert gone.value.status == 404
    assert not _engine_running(k8s_double, "graceful")
    core.delete_namespaced_pod("forced", NAMESPACE, grace_period_seconds=0)
    with pytest.raises(ApiException) as removed:
        core.read_namespaced_pod("forced", NAMESPACE)
    assert removed.value.status == 404
    assert _engine_running(k8s_double, "forced")  # the name is free, the container not yet
    assert k8s_double.deletions == [("graceful", GRACE_S), ("forced", 0)]
