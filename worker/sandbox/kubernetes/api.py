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
    Forbidden, Unauthorized (401/403,
      an exec handshake's too)            → BackendAuthFailed        backend_auth_failed
    TooManyRequests (429, retries spent)  → BackendRateLimited       backend_rate_limited
    StartTimeout                          → SandboxStartTimeout      sandbox_start_timeout
    anything else                         → SandboxError             sandbox_failed

Transient answers are retried (``retrying``, tenacity), bounded, for the calls that may
be repeated: reads, lists, deletes, the exec handshake (the command has not run), the
NetworkPolicy create (an existing one is kept) and the pod create (an ``AlreadyExists``
whose pod carries our labels is our own create that answered late): 429 (its
``Retry-After`` honoured), 500, 502, 503, 504 and connections reset or refused.

Scheduling and pulling are slow, not failed: ``wait_running`` waits out an
``Unschedulable`` pod and a pull in back-off, each up to its own bound, and only then
fails, with the pod's last conditions and events in the error's details.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import tenacity
import urllib3.exceptions
from kubernetes import client, config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.stream import stream

from worker.errors import (
    BackendAuthFailed,
    BackendQuotaExceeded,
    BackendRateLimited,
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

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Waiting reasons of a container whose image the kubelet cannot have.
PULL_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: Of those, the ones the kubelet retries (with back-off): transient, waited out.
PULL_RETRIED = frozenset({"ErrImagePull", "ImagePullBackOff"})
#: API answers worth another try, as client-go retries them.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Bounds of those tries: attempts, the whole time, one wait (a longer Retry-After is cut).
RETRY_ATTEMPTS = 6
RETRY_BUDGET_S = 60.0
RETRY_WAIT_MAX_S = 10.0
#: How many of the pod's events a scheduling or pull failure carries.
EVENTS_KEPT = 10
_MESSAGE_KEPT = 1024
_HANDSHAKE = re.compile(r"Handshake status (\d{3})")
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
    "TooManyRequests": BackendRateLimited,
    "StartTimeout": SandboxStartTimeout,
}


def cluster_error(message: str, *, reason: str, **details: object) -> SandboxError:
    """The typed error of a cluster ``reason`` (``REASON_ERRORS``; else ``SandboxError``)."""
    return REASON_ERRORS.get(reason, SandboxError)(message, reason=reason, **details)


@contextlib.contextmanager
def translate(action: str, **details: object) -> Iterator[None]:
    """``ApiException`` and connection failures as ``SandboxError`` (``reason``: the API's)."""
    try:
        yield
    except ApiException as exc:
        raise _api_error(action, exc, details) from exc
    except (OSError, ConfigException, urllib3.exceptions.HTTPError) as exc:
        raise SandboxError(
            f"kubernetes {action}: the API server is unreachable: {exc}",
            reason="Unreachable",
            **details,
        ) from exc


def _api_error(action: str, exc: ApiException, details: dict[str, object]) -> SandboxError:
    code, status = _answer(exc)
    reason = str(status.get("reason") or _REASONS.get(code) or exc.reason or "Unknown")
    message = str(status.get("message") or reason)
    if code == 403 and "exceeded quota" in message:
        reason = "QuotaExceeded"
    if code == 0:
        reason, message = "Unreachable", str(exc.reason or "")
    return cluster_error(
        f"kubernetes {action} failed: {message or reason}",
        reason=reason,
        status=code,
        **details,
    )


#: The ``reason`` the API server gives each status, for an answer without a Status body.
_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "AlreadyExists",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
            504: "Timeout"}  # fmt: skip


def _answer(exc: ApiException) -> tuple[int, dict[str, object]]:
    """The HTTP status and ``Status`` body of an API answer. An exec whose WebSocket
    handshake was refused comes from the client as status 0 with the handshake's
    status line and body in its reason (``Handshake status 403 Forbidden -+-+- …``):
    read from there, so a refused exec is what the API said, not "unreachable"."""
    code = int(exc.status or 0)
    body: Any = exc.body
    if code == 0 and (found := _HANDSHAKE.search(str(exc.reason or ""))):
        code = int(found.group(1))
        body = str(exc.reason).rsplit("-+-+-", 1)[-1].strip()
    try:
        status = json.loads(body or "{}")
    except (TypeError, ValueError):
        status = {}
    return code, status if isinstance(status, dict) else {}


def _transient(exc: BaseException) -> bool:
    """An answer worth another try (``RETRY_STATUSES``, a connection reset or refused)."""
    if isinstance(exc, ApiException):
        code = _answer(exc)[0]
        return code in RETRY_STATUSES
    return isinstance(exc, (ConnectionError, urllib3.exceptions.HTTPError))


def _retry_after(exc: BaseException | None) -> float | None:
    """A 429's (or 503's) ``Retry-After`` in seconds, if it gave one."""
    headers = getattr(exc, "headers", None) if isinstance(exc, ApiException) else None
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None


class _Wait(tenacity.wait.wait_base):
    """``Retry-After`` when the API gave one, else exponential back-off with jitter."""

    _backoff = tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        after = _retry_after(outcome.exception() if outcome is not None else None)
        wait = self._backoff(retry_state) if after is None else after
        return float(min(wait, RETRY_WAIT_MAX_S))


def _log_retry(retry_state: tenacity.RetryCallState) -> None:
    outcome = retry_state.outcome
    log.warning(
        "kubernetes API call failed (attempt %d), retrying: %r",
        retry_state.attempt_number,
        outcome.exception() if outcome is not None else None,
    )


def retrying(call: Callable[..., _T], *args: object, **kwargs: object) -> _T:
    """``call(*args, **kwargs)``, tried again on a transient answer (``_transient``),
    at most ``RETRY_ATTEMPTS`` times within ``RETRY_BUDGET_S``; the last failure is
    raised as it was. Only for calls that may be repeated."""
    retryer = tenacity.Retrying(
        retry=tenacity.retry_if_exception(_transient),
        stop=tenacity.stop_after_attempt(RETRY_ATTEMPTS)
        | tenacity.stop_after_delay(RETRY_BUDGET_S),
        wait=_Wait(),
        before_sleep=_log_retry,
        reraise=True,
    )
    return retryer(call, *args, **kwargs)


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
            return _own_retries(client.ApiClient(incluster))
        return _client(config.new_client_from_config())


def _client(made: Any) -> client.ApiClient:
    if not isinstance(made, client.ApiClient):
        raise SandboxError("the kubernetes configuration gave no API client", reason="Config")
    return _own_retries(made)


def _own_retries(api_client: client.ApiClient) -> client.ApiClient:
    """The client's transport without urllib3's own wait for ``Retry-After``, which has
    no bound (a server saying 3600 would hold a worker thread an hour): ``retrying``
    honours it, cut at ``RETRY_WAIT_MAX_S``. urllib3 still retries a connection that
    failed before a request was sent, as it does by default."""
    configuration = api_client.configuration
    configuration.retries = urllib3.util.Retry(total=3, respect_retry_after_header=False)
    api_client.rest_client.close()
    api_client.rest_client = rest.RESTClientObject(configuration)
    return api_client


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
        """Create the pod, retried on a transient answer: an ``AlreadyExists`` for a pod
        that carries exactly our labels is our own create answered late (the first try
        made it, its answer was lost), so success; any other is the error it is."""
        name = pod["metadata"]["name"]
        try:
            with translate("create pod", pod=name):
                retrying(self.core.create_namespaced_pod, self.namespace, _model(client.V1Pod, pod))
        except SandboxError as exc:
            if exc.details.get("status") != 409:
                raise
            found = self.read_pod(name)
            labels = found.metadata.labels if found is not None and found.metadata else None
            if labels != dict(pod["metadata"].get("labels") or {}):
                raise
            log.info("the sandbox pod %s already exists with our labels: our own create", name)

    def read_pod(self, name: str, *, timeout_s: float | None = None) -> client.V1Pod | None:
        """The pod, or None when it does not exist (``timeout_s``: the request's bound,
        and no retry then: a bounded read claims less instead; None: the client's
        default, none, and transient answers retried)."""
        try:
            with translate("read pod", pod=name):
                if timeout_s is None:
                    return retrying(self.core.read_namespaced_pod, name, self.namespace)
                return self.core.read_namespaced_pod(
                    name, self.namespace, _request_timeout=timeout_s
                )
        except SandboxError as exc:
            if exc.details.get("status") == 404:
                return None
            raise

    def patch_pod_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str],
        active_deadline_s: int | None = None,
    ) -> None:
        """Merge ``labels`` (a None value removes that label) and ``annotations`` into
        the pod's metadata, and set its ``spec.activeDeadlineSeconds`` to
        ``active_deadline_s`` when given (the API server takes only a lower value on a
        running pod: a raise is a 422): one JSON merge patch, the one pod change the
        backend makes, retried on a transient answer (the same patch twice is the same
        pod)."""
        body: dict[str, object] = {
            "metadata": {"labels": dict(labels), "annotations": dict(annotations)}
        }
        if active_deadline_s is not None:
            body["spec"] = {"activeDeadlineSeconds": active_deadline_s}
        with translate("patch pod", pod=name):
            retrying(
                self.core.patch_namespaced_pod,
                name,
                self.namespace,
                body,
                _content_type="application/merge-patch+json",
            )

    def list_pods(self, selector: str) -> list[client.V1Pod]:
        with translate("list pods", selector=selector):
            found = retrying(self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        return list(found.items or [])

    def pod_events(self, name: str) -> list[dict[str, object]]:
        """The pod's last events (``EVENTS_KEPT``, oldest first): what the scheduler and
        the kubelet said of it (``FailedScheduling``, ``Failed``, ``BackOff``, …)."""
        with translate("list events", pod=name):
            found = retrying(
                self.core.list_namespaced_event,
                self.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}",
            )
        events = sorted(found.items or [], key=_event_time)
        return [_event(e) for e in events[-EVENTS_KEPT:]]

    def delete_pod(self, name: str, *, grace_s: int) -> bool:
        """Delete the pod with ``grace_s`` (the API keeps it, ``deletionTimestamp`` set,
        while the kubelet stops its containers; 0 removes the object at once, whatever
        its containers still do); False when it did not exist."""
        try:
            with translate("delete pod", pod=name):
                retrying(
                    self.core.delete_namespaced_pod,
                    name,
                    self.namespace,
                    grace_period_seconds=grace_s,
                )
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

    def wait_running(
        self,
        name: str,
        timeout_s: float,
        *,
        unschedulable_s: float | None = None,
        pull_s: float | None = None,
    ) -> None:
        """Wait until the pod runs. Slow is not failed: an ``Unschedulable`` pod (a
        node may be on its way) is waited for up to ``unschedulable_s``, an image pull
        the kubelet retries (``ErrImagePull``, ``ImagePullBackOff``) up to ``pull_s``
        from its first failure; ``timeout_s`` bounds the rest, counted from the end of
        the last such wait (None: ``timeout_s`` for those too).

        Raises:
            SandboxError: the cluster says it cannot run (it ended, its image name is
                invalid, its container cannot be created), a wait above ran out
                (``sandbox_unschedulable``, ``image_pull_failed``, with the pod's last
                conditions and events in ``details``), or it did not run in time.
        """
        bounds = {"Unschedulable": unschedulable_s or timeout_s, "pull": pull_s or timeout_s}
        since: dict[str, float] = {}
        start = time.monotonic()
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
            now = time.monotonic()
            waiting = pending_wait(pod)
            if waiting is not None:
                kind = "Unschedulable" if waiting[0] == "Unschedulable" else "pull"
                first = since.setdefault(kind, now)
                if now - first > bounds[kind]:
                    raise self._waited_out(pod, waiting, now - first)
                start = now
            elif now - start > timeout_s:
                raise SandboxStartTimeout(
                    "the sandbox pod did not start in time",
                    pod=name,
                    reason="StartTimeout",
                    timeout_s=timeout_s,
                )
            time.sleep(POLL_S)

    def _waited_out(
        self, pod: client.V1Pod, waiting: tuple[str, str], waited_s: float
    ) -> SandboxError:
        """The error of a pod still unschedulable, or still failing its pull, after
        its bound: the cluster's reason, its last conditions and events."""
        reason, message = waiting
        name = pod.metadata.name if pod.metadata is not None else None
        try:
            events: list[dict[str, object]] | str = self.pod_events(str(name))
        except SandboxError as exc:  # the error says what it can without them
            events = f"unreadable: {exc.details.get('reason', exc)}"
        what = (
            "no node can run the sandbox pod"
            if reason == "Unschedulable"
            else "the sandbox pod's image could not be pulled"
        )
        return cluster_error(
            f"{what} (for {waited_s:.0f} s): {message}".strip(),
            reason=reason,
            pod=name,
            waited_s=round(waited_s, 1),
            conditions=_conditions(pod),
            events=events,
        )

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
                # A refused handshake ran nothing: tried again (``retrying``).
                ws: Any = retrying(
                    stream, client.CoreV1Api(own).connect_get_namespaced_pod_exec, name,
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
                retrying(
                    self.networking.create_namespaced_network_policy,
                    self.namespace,
                    _model(client.V1NetworkPolicy, policy),
                )
        except SandboxError as exc:
            if exc.details.get("status") != 409:
                raise


def _model(model: Any, obj: Mapping[str, object]) -> Any:
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
    it may still start (an ``Unschedulable`` pod and a pull in back-off may: see
    ``pending_wait``)."""
    status, name = pod.status, pod.metadata.name if pod.metadata else None
    if status is None:
        return None
    if status.phase in {"Failed", "Succeeded"}:
        return ended_failure(pod)
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state is not None else None
        if waiting is None or waiting.reason in PULL_RETRIED:
            continue
        if waiting.reason in PULL_FAILURES | START_FAILURES:
            what = "pulled" if waiting.reason in PULL_FAILURES else "started"
            return cluster_error(
                f"the sandbox pod's container could not be {what}: {waiting.message or ''}".strip(),
                pod=name,
                reason=waiting.reason,
                conditions=_conditions(pod),
            )
    return None


def pending_wait(pod: client.V1Pod) -> tuple[str, str] | None:
    """What a pending pod waits out (``reason``, the cluster's message): the scheduler
    found no node for it (``Unschedulable``: a node may be on its way), or the kubelet
    failed to pull its image and will try again (``ErrImagePull``,
    ``ImagePullBackOff``); None when it waits for nothing of the kind."""
    status = pod.status
    if status is None:
        return None
    for cond in status.conditions or []:
        if (
            cond.type == "PodScheduled"
            and cond.status == "False"
            and cond.reason == "Unschedulable"
        ):
            return "Unschedulable", str(cond.message or "")
    for cs in status.container_statuses or []:
        waiting = cs.state.waiting if cs.state is not None else None
        if waiting is not None and waiting.reason in PULL_RETRIED:
            return str(waiting.reason), str(waiting.message or "")
    return None


def _conditions(pod: client.V1Pod) -> list[dict[str, object]]:
    """The pod's conditions as the API gives them (type, status, reason, message)."""
    found = (pod.status.conditions if pod.status is not None else None) or []
    return [
        {
            "type": c.type,
            "status": c.status,
            "reason": c.reason,
            "message": (c.message or "")[:_MESSAGE_KEPT] or None,
        }
        for c in found
    ]


def _event_time(event: Any) -> str:
    when = event.last_timestamp or event.event_time or event.first_timestamp
    return "" if when is None else str(when.isoformat() if hasattr(when, "isoformat") else when)


def _event(event: Any) -> dict[str, object]:
    """One event of the pod, as ``kubectl describe`` shows it."""
    return {
        "type": event.type,
        "reason": event.reason,
        "message": (event.message or "")[:_MESSAGE_KEPT],
        "count": event.count,
        "last_seen": _event_time(event) or None,
    }


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
    details: dict[str, object] = {"pod": name}
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
