"""The API calls of the Kubernetes backend, through the official ``kubernetes`` client:
blocking calls, each translated at this seam (``translate``) into a ``SandboxError``
whose ``reason`` says what the cluster said (``Forbidden``, ``QuotaExceeded``,
``ImagePullBackOff``, ``Unschedulable``, ``Evicted``, …), never a traceback. The class
(its stable ``code``) follows that reason (``cluster_error``):

    ErrImagePull, ImagePullBackOff, InvalidImageName,
    ErrImageNeverPull                     → ImagePullFailed          image_pull_failed
    Unschedulable                         → SandboxUnschedulable     sandbox_unschedulable
    Evicted                               → SandboxEvicted           sandbox_evicted
    OOMKilled (``details.memory_limit``)  → SandboxOomKilled         oom_killed
    DeadlineExceeded                      → SandboxDeadlineExceeded  sandbox_deadline_exceeded
    QuotaExceeded (a 403 naming a quota)  → BackendQuotaExceeded     backend_quota_exceeded
    Forbidden, Unauthorized (401/403)     → BackendAuthFailed        backend_auth_failed
    StartTimeout                          → SandboxStartTimeout      sandbox_start_timeout
    anything else                         → SandboxError             sandbox_failed
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.stream import stream

from worker.errors import (
    BackendAuthFailed,
    BackendQuotaExceeded,
    ImagePullFailed,
    SandboxDeadlineExceeded,
    SandboxError,
    SandboxEvicted,
    SandboxOomKilled,
    SandboxStartTimeout,
    SandboxUnschedulable,
)

if TYPE_CHECKING:
    from worker.sandbox.config import KubernetesConfig

#: Waiting reasons of a container whose image the kubelet cannot have.
PULL_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: Waiting reasons that say the pod cannot start at all.
START_FAILURES = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
POLL_S = 0.25
#: The error class of each cluster reason (``details.reason`` keeps the reason itself).
REASON_ERRORS: dict[str, type[SandboxError]] = {
    **dict.fromkeys(PULL_FAILURES, ImagePullFailed),
    "Unschedulable": SandboxUnschedulable,
    "Evicted": SandboxEvicted,
    "OOMKilled": SandboxOomKilled,
    "DeadlineExceeded": SandboxDeadlineExceeded,
    "QuotaExceeded": BackendQuotaExceeded,
    "Forbidden": BackendAuthFailed,
    "Unauthorized": BackendAuthFailed,
    "StartTimeout": SandboxStartTimeout,
}


def cluster_error(message: str, *, reason: str, **details: Any) -> SandboxError:
    """The typed error of a cluster ``reason`` (``REASON_ERRORS``; else ``SandboxError``)."""
    return REASON_ERRORS.get(reason, SandboxError)(message, reason=reason, **details)


@contextlib.contextmanager
def translate(action: str, **details: Any) -> Iterator[None]:
    """``ApiException`` and connection failures as ``SandboxError`` (``reason``: the API's)."""
    try:
        yield
    except ApiException as exc:
        raise _api_error(action, exc, details) from exc
    except (OSError, ConfigException) as exc:
        raise SandboxError(
            f"kubernetes {action}: the API server is unreachable: {exc}",
            reason="Unreachable",
            **details,
        ) from exc


def _api_error(action: str, exc: ApiException, details: dict[str, Any]) -> SandboxError:
    status = _status(exc)
    reason = str(status.get("reason") or exc.reason or "Unknown")
    message = str(status.get("message") or exc.reason or "")
    if exc.status == 403 and "exceeded quota" in message:
        reason = "QuotaExceeded"
    if exc.status == 0:
        reason = "Unreachable"
    return cluster_error(
        f"kubernetes {action} failed: {message or reason}",
        reason=reason,
        status=exc.status,
        **details,
    )


def _status(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def connect(cfg: KubernetesConfig) -> client.ApiClient:
    """An API client: ``k8s_kubeconfig`` when set, else in-cluster when the worker runs
    in a pod (``KUBERNETES_SERVICE_HOST``), else ``$KUBECONFIG`` / ``~/.kube/config``.

    Raises:
        SandboxError: no usable configuration.
    """
    with translate("configuration"):
        if cfg.k8s_kubeconfig is not None:
            return _client(config.new_client_from_config(str(cfg.k8s_kubeconfig)))
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            incluster = client.Configuration()
            config.load_incluster_config(client_configuration=incluster)
            return client.ApiClient(incluster)
        return _client(config.new_client_from_config())


def _client(made: Any) -> client.ApiClient:
    if not isinstance(made, client.ApiClient):
        raise SandboxError("the kubernetes configuration gave no API client", reason="Config")
    return made


class PodApi:
    """The pod and NetworkPolicy calls of one namespace (blocking)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        exec_timeout_s: float = 60.0,
        copy_timeout_s: float = 1800.0,
        ping_s: float = 5.0,
    ) -> None:
        """``exec_timeout_s``: the deadline of a short exec (and of opening any);
        ``copy_timeout_s``: of a tree copied in or out; ``ping_s``: the exec streams'
        ping period."""
        self.api_client = api_client
        self.exec_timeout_s, self.copy_timeout_s, self.ping_s = (
            exec_timeout_s,
            copy_timeout_s,
            ping_s,
        )
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.namespace = namespace

    def close(self) -> None:
        self.api_client.close()

    def create_pod(self, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with translate("create pod", pod=name):
            self.core.create_namespaced_pod(self.namespace, _model(client.V1Pod, pod))

    def read_pod(self, name: str, *, timeout_s: float | None = None) -> client.V1Pod | None:
        """The pod, or None when it does not exist (``timeout_s``: the request's bound;
        None: the client's default, none)."""
        try:
            with translate("read pod", pod=name):
                if timeout_s is None:
                    return self.core.read_namespaced_pod(name, self.namespace)
                return self.core.read_namespaced_pod(
                    name, self.namespace, _request_timeout=timeout_s
                )
        except SandboxError as exc:
            if exc.details.get("status") == 404:
                return None
            raise

    def list_pods(self, selector: str) -> list[client.V1Pod]:
        with translate("list pods", selector=selector):
            found = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return list(found.items or [])

    def delete_pod(self, name: str, *, grace_s: int = 0) -> bool:
        """Delete the pod; False when it did not exist."""
        try:
            with translate("delete pod", pod=name):
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace_s)
        except SandboxError as exc:
            if exc.details.get("status") == 404:
                return False
            raise
        return True

    def wait_gone(self, name: str, timeout_s: float) -> bool:
        """Wait until the pod no longer exists; False when it still did at ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.read_pod(name) is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def wait_running(self, name: str, timeout_s: float) -> None:
        """Wait until the pod runs.

        Raises:
            SandboxError: the cluster says it cannot run (``reason``: its image cannot be
                pulled, it cannot be scheduled, it ended or was evicted), or it did not
                run within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            pod = self.read_pod(name)
            if pod is None:
                raise SandboxError(
                    "the sandbox pod vanished while starting", pod=name, reason="Gone"
                )
            failure = pending_failure(pod)
            if failure is not None:
                raise failure
            if pod.status is not None and pod.status.phase == "Running":
                return
            if time.monotonic() > deadline:
                raise SandboxStartTimeout(
                    "the sandbox pod did not start in time",
                    pod=name,
                    reason="StartTimeout",
                    timeout_s=timeout_s,
                )
            time.sleep(POLL_S)

    def exec(
        self, name: str, container: str, command: list[str], *, stdin: bool, timeout_s: float
    ) -> Any:
        """An exec WebSocket to ``command`` in the pod (binary channels), opened within
        ``timeout_s`` (its socket's sends bounded by it too).

        Each exec gets an ``ApiClient`` of its own (same configuration): the client's
        ``stream()`` swaps ``call_api`` on the client it is given for the length of the
        call, so two overlapping calls on one client can leave it in WebSocket mode for
        good, and a REST call made meanwhile (a read, the final delete) goes astray.

        Raises:
            SandboxError: the exec could not be opened (``reason`` ``ExecTimeout`` when
                the handshake did not finish in time).
        """
        opened: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        abandoned = threading.Event()

        def open_() -> None:
            own = client.ApiClient(self.api_client.configuration)
            try:
                ws: Any = stream(
                    client.CoreV1Api(own).connect_get_namespaced_pod_exec, name,
                    self.namespace, command=command, container=container, stdin=stdin,
                    stdout=True, stderr=True, tty=False, _preload_content=False, binary=True,
                )  # fmt: skip
            except BaseException as exc:  # handed to the caller
                opened.put((None, exc))
                return
            finally:
                own.close()
            if abandoned.is_set():  # too late: nobody reads it
                with contextlib.suppress(Exception):
                    ws.close()
                return
            with contextlib.suppress(Exception):
                ws.sock.settimeout(timeout_s)
            opened.put((ws, None))

        threading.Thread(target=open_, name="k8s-exec-open", daemon=True).start()
        try:
            ws, error = opened.get(timeout=timeout_s)
        except queue.Empty:
            abandoned.set()
            with contextlib.suppress(queue.Empty, Exception):  # opened as we gave up
                opened.get_nowait()[0].close()
            raise SandboxError(
                "kubernetes exec: the stream did not open in time",
                reason="ExecTimeout", pod=name, timeout_s=timeout_s,
            ) from None  # fmt: skip
        if error is not None:
            with translate("exec", pod=name):
                raise error
        return ws

    def ensure_policy(self, policy: Mapping[str, Any]) -> None:
        """Create the NetworkPolicy unless one of its name exists."""
        try:
            with translate("create NetworkPolicy", policy=policy["metadata"]["name"]):
                self.networking.create_namespaced_network_policy(
                    self.namespace, _model(client.V1NetworkPolicy, policy)
                )
        except SandboxError as exc:
            if exc.details.get("status") != 409:
                raise


def _model(model: Any, obj: Mapping[str, Any]) -> Any:
    """``obj`` as the client's model (its own validation first)."""
    try:
        made = model.from_dict(dict(obj))
    except ValueError as exc:
        raise SandboxError("the client refused the object", error=str(exc)) from exc
    if made is None:
        raise SandboxError("the client refused the object")
    return made


def pending_failure(pod: client.V1Pod) -> SandboxError | None:
    """Why a pod that is not running yet never will, as the cluster says it; None while
    it may still start."""
    status, name = pod.status, pod.metadata.name if pod.metadata else None
    if status is None:
        return None
    if status.phase in {"Failed", "Succeeded"}:
        return ended_failure(pod)
    for cond in status.conditions or []:
        if (
            cond.type == "PodScheduled"
            and cond.status == "False"
            and cond.reason == "Unschedulable"
        ):
            return SandboxUnschedulable(
                f"no node can run the sandbox pod: {cond.message or ''}".strip(),
                pod=name,
                reason="Unschedulable",
            )
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state is not None else None
        if waiting is not None and waiting.reason in PULL_FAILURES | START_FAILURES:
            what = "pulled" if waiting.reason in PULL_FAILURES else "started"
            return cluster_error(
                f"the sandbox pod's container could not be {what}: {waiting.message or ''}".strip(),
                pod=name,
                reason=waiting.reason,
            )
    return None


#: Pod reasons with which the kubelet ends a pod that was running (it may still be
#: stopping its containers when the reason is already there).
END_REASONS = frozenset({"Evicted", "DeadlineExceeded"})


def cluster_end(pod: client.V1Pod) -> SandboxError | None:
    """Why the cluster ended (or is ending) a pod that ran, as ``ended_failure`` says it:
    its reason is ``Evicted`` or ``DeadlineExceeded``, its phase is ``Failed``, or a
    container of it was ``OOMKilled``; None while the pod is intact (a program exec'd in
    it that ended did so on its own)."""
    status = pod.status
    if status is None:
        return None
    ending = status.reason in END_REASONS or status.phase == "Failed"
    if ending or _container_end(pod) == "OOMKilled":
        return ended_failure(pod)
    return None


def ended_failure(pod: client.V1Pod) -> SandboxError:
    """Why the pod ended, as the cluster says it: the pod's reason (``Evicted``,
    ``DeadlineExceeded``) or, failing one, its container's (``OOMKilled``, with the
    container's memory limit)."""
    status, name = pod.status, pod.metadata.name if pod.metadata else None
    reason = (status.reason if status is not None else None) or _container_end(pod) or "Ended"
    message = (status.message if status is not None else None) or reason
    details: dict[str, Any] = {"pod": name}
    if reason == "OOMKilled":
        details["memory_limit"] = _memory_limit(pod)
    return cluster_error(f"the sandbox pod ended: {message}", reason=reason, **details)


def _container_end(pod: client.V1Pod) -> str | None:
    statuses = (pod.status.container_statuses if pod.status is not None else None) or []
    for cs in statuses:
        terminated = cs.state.terminated if cs.state is not None else None
        if terminated is not None and terminated.reason:
            return str(terminated.reason)
    return None


def _memory_limit(pod: client.V1Pod) -> str | None:
    for container in (pod.spec.containers if pod.spec is not None else None) or []:
        limits = container.resources.limits if container.resources is not None else None
        if limits and "memory" in limits:
            return str(limits["memory"])
    return None
