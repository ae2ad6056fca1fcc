"""An API double for the Kubernetes backend's tests: it stands in for a Kubernetes API
server, because none can run on the development machines or in CI.

A real HTTP server on loopback that the tests start, speaking exactly the subset the
backend uses, as the API does:

- pods: create, get, list (``labelSelector``, equality terms and existence), delete
  (with the API server's graceful semantics, below), patch (a JSON merge patch or a
  strategic merge patch, which are the same on metadata's maps: a null value removes a
  key; ``spec.activeDeadlineSeconds`` may be lowered, never raised nor removed, as the
  API server's pod update validation says, with its 422 ``Invalid`` and its cause; a
  patch that changes anything else but ``metadata.labels``/``annotations`` is a 422, as
  the API server refuses most of a running pod's changes, and every label must be a
  valid label);
- events: list (``fieldSelector`` on ``involvedObject``);
- ``pods/exec`` as a WebSocket with the real channel protocol: ``v5.channel.k8s.io``
  when the client offers it (the official client does), else ``v4.channel.k8s.io``
  (``protocols=(V4,)``: only v4, as API servers before 1.30 and proxies that do not
  know v5: the close message is then data nobody reads, stdin has no EOF);
  channel 0 stdin, 1 stdout, 2 stderr, 3 the final ``Status`` (JSON; a non-zero exit is
  ``NonZeroExitCode`` with the code as the ``ExitCode`` cause), 4 resize (ignored: no
  TTY), and in v5 the close message ``[255, channel]`` (stdin's EOF);
- NetworkPolicies: create, get, delete.

Every object created is checked twice, so that a request the real API would reject
fails here too: with the official client's own models (``V1Pod``/``V1NetworkPolicy``
``from_dict``) and against the Kubernetes OpenAPI schema in strict mode
(``kubernetes-validate``, the oldest minor the backend supports): a misspelt or unknown
field is a 422. Requests need the bearer token of the double's kubeconfig (401 without)
and are authorized as they arrive against the double's Role (``granted``; by default the
backend's ``RBAC_RULES``, which the chart renders): a verb the Role lacks is a 403
``Forbidden``, an exec's too (its WebSocket handshake is refused).

As a cluster under load does, it can fail and be slow on purpose (``ApiDouble.faults``,
``ApiDouble.gate``), deterministically: the next N calls of a route (``create pods``,
``get pods``, ``list pods``, ``delete pods``, ``get pods/exec``, ``list events``, …) are
answered 429 with ``Retry-After``, 500/502/503/504, or their connection reset (before the
request is served, or after: a create made whose answer is lost); pods created while a
``Gate`` is set wait unschedulable for some seconds, then fail their image pull some
times, before they run (``pods.Gate``).

Deletion is the API server's: a pod on a node deleted with a grace period (the
request's ``gracePeriodSeconds``, else its ``terminationGracePeriodSeconds``) is kept,
with ``deletionTimestamp`` and ``deletionGracePeriodSeconds``, while its containers get
SIGTERM and, past the grace, SIGKILL; it is removed once they stopped. Grace 0 (or a pod
never scheduled, or one already ended) removes the object at once, and a running pod's
containers are stopped only later (``force_lag_s``: the kubelet notices at its next
sync), so its name is free while they still run. With ``kubelet_down`` (a lost node)
nothing stops the containers of a graceful deletion: the pod stays until deleted with
grace 0.

Each pod is then run for real on the shared Podman service (``pods.PodmanPod``: ``podman
kube play``), and exec runs ``podman exec`` in its container: manifests, client and
containers are all real; only the API server is stood in for. As the kubelet does, it
ends a pod that passes its ``activeDeadlineSeconds`` (counted from its creation, a
patched value too):
``Failed``, reason ``DeadlineExceeded``, its containers stopped. A test can evict a pod
(``ApiDouble.evict``, standing in for the node's pressure; no request reaches it). What
the double does not do: watches, real scheduling (no node, quota, or eviction of its
own; ``Unschedulable`` only as a ``Gate`` says), NetworkPolicy enforcement (objects are
kept, not enforced). ``idle_cutoff_s`` puts a load balancer's idle timer in front
of every exec stream: one that carried no frame either way (data, ping or pong) for that
long is dropped, no close frame and no ``Status``, as a cloud load balancer drops an
idle connection.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import docker
import kubernetes_validate
from kubernetes import client as k8s

from tests.k8s_double import pods as podman_pods
from tests.k8s_double import rbac
from tests.k8s_double.patch import ApiError, deadline_errors, invalid, merged_metadata, patch_parts
from tests.k8s_double.websocket import Connection, ProtocolError, accept_key
from worker.sandbox.kubernetes.manifests import RBAC_RULES

SCHEMA_VERSION = "1.29"
V4, V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
_PODS = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+)(?:/(?P<sub>exec))?)?$"
)
#: What the kubelet says of a pod it ended, as it words it.
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
EVICTED_MESSAGE = "The node was low on resource: memory."
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
#: The ``reason`` the API server gives an answer of each status.
_REASONS = {429: "TooManyRequests", 500: "InternalError", 502: "BadGateway",
            503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip
#: The backend's Role: what the double grants by default.
ROLE: frozenset[rbac.Permission] = frozenset(
    (r.api_group, r.resource, v) for r in RBAC_RULES for v in r.verbs
)
_POLICIES = re.compile(
    r"^/apis/networking\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/networkpolicies(?:/(?P<name>[^/]+))?$"
)


class Fault:
    """What the next ``count`` calls of a route get instead of their answer: ``status``
    (with ``Retry-After: retry_after`` when given), or a connection reset (``reset``:
    before the request is served; ``"after"``: once it was, its answer lost)."""

    def __init__(
        self,
        count: int,
        *,
        status: int | None = None,
        retry_after: int | None = None,
        reset: bool | str = False,
    ) -> None:
        self.count, self.status, self.retry_after, self.reset = count, status, retry_after, reset


class Faults:
    """Faults by route (``rbac.route``: ``"create pods"``, ``"get pods/exec"``, …), each
    for its next calls, in order; ``served`` counts those answered so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[str, list[Fault]] = {}
        self.served: dict[str, int] = {}

    def inject(self, route: str, count: int, **how: Any) -> None:
        with self._lock:
            self._queued.setdefault(route, []).append(Fault(count, **how))

    def next(self, route: str) -> Fault | None:
        with self._lock:
            queued = self._queued.get(route) or []
            if not queued:
                return None
            fault = queued[0]
            fault.count -= 1
            if fault.count <= 0:
                queued.pop(0)
            self.served[route] = self.served.get(route, 0) + 1
            return fault


class ApiDouble:
    """The double's state: pods and NetworkPolicies by (namespace, name), every request
    seen (``requests``: method and path), the engine the pods run on."""

    def __init__(
        self,
        docker_host: str,
        *,
        protocols: tuple[str, ...] = (V5, V4),
        idle_cutoff_s: float | None = None,
        granted: set[rbac.Permission] | None = None,
    ) -> None:
        """``protocols``: the exec channel protocols negotiated, by preference;
        ``idle_cutoff_s``: drop an exec stream idle that long (None: never); ``granted``:
        the Role requests are authorized against (default ``ROLE``)."""
        self.docker_host = docker_host
        self.protocols, self.idle_cutoff_s = protocols, idle_cutoff_s
        self.token = secrets.token_hex(16)
        self.granted = set(ROLE if granted is None else granted)
        self.faults = Faults()
        #: What pods created from now on wait out before they run.
        self.gate = podman_pods.Gate()
        #: Events of pods (core/v1 ``Event`` objects), kept after the pods are gone.
        self.events: list[dict[str, Any]] = []
        #: Every delete of a pod: (name, the grace it asked for; None: the pod's own).
        self.deletions: list[tuple[str, int | None]] = []
        #: A lost node: nothing stops a gracefully deleted pod's containers.
        self.kubelet_down = False
        #: How long after a grace-0 deletion the kubelet stops the containers.
        self.force_lag_s = 3.0
        self.pods: dict[tuple[str, str], podman_pods.PodmanPod] = {}
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        #: Every pod spec the double accepted, as it was given (pods outlive no test).
        self.created: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._removals: list[threading.Thread] = []
        #: Set by ``close``: the kubelet's pending syncs (``force_lag_s``) happen at once.
        self._closing = threading.Event()
        #: Each pod's kubelet deadline timer and when the pod started (monotonic).
        self._deadlines: dict[tuple[str, str], tuple[threading.Timer | None, float]] = {}
        self.engine = docker.DockerClient(base_url=docker_host)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove every pod still on the engine."""
        self._server.shutdown()
        self._server.server_close()
        for timer, _ in self._deadlines.values():
            if timer is not None:
                timer.cancel()
        self._closing.set()  # no test is left to see the lag: no waiting it out either
        for thread in self._removals:
            thread.join()
        for pod in list(self.pods.values()):
            pod.remove()
        self.engine.close()

    def kubeconfig(self, path: Path, *, namespace: str) -> Path:
        """A kubeconfig for the double at ``path`` (bearer token, plain HTTP on loopback)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "worker", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "double",
                    "context": {"cluster": "double", "user": "worker", "namespace": namespace},
                }
            ],
            "current-context": "double",
        }
        path.write_text(json.dumps(config))
        return path

    # --- pods -----------------------------------------------------------------------

    def create_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        _validate(body, "Pod", k8s.V1Pod)
        metadata = body.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if metadata.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match")
        with self.lock:
            if (ns, name) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
            _stamp(metadata, ns)
            self.created.append(copy.deepcopy(body))

            def event(*args: str) -> None:
                self._event(ns, metadata, *args)

            pod = podman_pods.PodmanPod(self.docker_host, body, gate=self.gate, event=event)
            self.pods[(ns, name)] = pod
        pod.start()
        self._enforce_deadline(ns, name, pod, time.monotonic())
        return self.pod_object(pod)

    def _enforce_deadline(
        self, ns: str, name: str, pod: podman_pods.PodmanPod, started: float
    ) -> None:
        """End ``pod`` once its ``activeDeadlineSeconds`` have passed since ``started``
        (the kubelet counts from the pod's start; a patched deadline replaces the timer),
        as the kubelet does: ``Failed``, ``DeadlineExceeded``, its containers stopped
        within its grace period."""
        spec = pod.obj["spec"]
        deadline = spec.get("activeDeadlineSeconds")
        previous = self._deadlines.pop((ns, name), None)
        if previous is not None and previous[0] is not None:
            previous[0].cancel()
        if deadline is None:
            self._deadlines[(ns, name)] = (None, started)
            return
        grace = int(spec.get("terminationGracePeriodSeconds", 30))
        left = max(0.0, started + float(deadline) - time.monotonic())
        timer = threading.Timer(
            left, pod.end, args=("DeadlineExceeded", DEADLINE_MESSAGE), kwargs={"grace_s": grace}
        )
        timer.daemon = True
        self._deadlines[(ns, name)] = (timer, started)
        timer.start()

    def deadline_left(self, ns: str, name: str) -> float | None:
        """Test-only: seconds until the kubelet would end the pod for its deadline (None:
        it has none). A cluster shows no such thing; a test reads it on the double."""
        entry = self._deadlines.get((ns, name))
        deadline = self.pod(ns, name).obj["spec"].get("activeDeadlineSeconds")
        if entry is None or entry[0] is None or deadline is None:
            return None
        return entry[1] + float(deadline) - time.monotonic()

    def evict(self, ns: str, name: str, message: str = EVICTED_MESSAGE) -> None:
        """Test-only: evict the pod as the kubelet does under node pressure, which the
        double has none of (no node): ``Failed``, reason ``Evicted``, ``message``, its
        containers stopped at once (a hard eviction's grace is 0). Called by a test on
        the double itself, never through the API, which has no such request."""
        self.pod(ns, name).end("Evicted", message, grace_s=0)

    def pod(self, ns: str, name: str) -> podman_pods.PodmanPod:
        pod = self.pods.get((ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return pod

    def pod_object(self, pod: podman_pods.PodmanPod) -> dict[str, Any]:
        return {**pod.obj, "kind": "Pod", "apiVersion": "v1", "status": pod.status(self.engine)}

    def patch_pod(
        self, ns: str, name: str, patch: dict[str, Any], content_type: str
    ) -> dict[str, Any]:
        """Merge ``patch`` into the pod's labels and annotations, as the API server does
        for a merge patch or a strategic merge patch (the same on these maps: a null
        value removes the key), and its ``spec.activeDeadlineSeconds`` as the API
        server's pod update validation allows it: lowered (or set where there was none),
        never raised nor removed, at least 1 (``patch.deadline_errors``); the kubelet's timer
        then counts the new value from the pod's start. A change of anything else is a
        422 (the API server allows a few more spec fields the backend never patches); a
        JSON patch, which the double does not serve, a 415."""
        metadata, spec_patch = patch_parts(name, patch, content_type)
        pod = self.pod(ns, name)
        with self.lock:
            spec = pod.obj["spec"]
            if "activeDeadlineSeconds" in spec_patch:
                new = spec_patch["activeDeadlineSeconds"]
                errors = deadline_errors(spec.get("activeDeadlineSeconds"), new)
                if errors:
                    raise invalid(name, errors)
            merged = merged_metadata(pod.obj["metadata"], metadata)
            new_spec = {**spec, **spec_patch}
            _validate({**pod.obj, "metadata": merged, "spec": new_spec}, "Pod", k8s.V1Pod)
            merged["resourceVersion"] = str(int(merged.get("resourceVersion", "1")) + 1)
            pod.obj["metadata"] = merged
            if new_spec != spec:
                pod.obj["spec"] = new_spec
                self._enforce_deadline(ns, name, pod, self._deadlines[(ns, name)][1])
        return self.pod_object(pod)

    def list_pods(self, ns: str, selector: str) -> dict[str, Any]:
        match = _selector(selector)
        items = [
            self.pod_object(p)
            for (pod_ns, _), p in sorted(self.pods.items())
            if pod_ns == ns and match(p.obj["metadata"].get("labels") or {})
        ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def _event(
        self, ns: str, metadata: dict[str, Any], kind: str, reason: str, message: str, by: str
    ) -> None:
        """Record an event of a pod as the scheduler or the kubelet posts it (a repeat
        of one reason and message counts up, as the API's event aggregation does)."""
        now = _now()
        with self.lock:
            for seen in self.events:
                involved = seen["involvedObject"]
                same = (involved["uid"], seen["reason"], seen["message"])
                if same == (metadata["uid"], reason, message):
                    seen["count"] += 1
                    seen["lastTimestamp"] = now
                    return
            self.events.append(
                {
                    "kind": "Event",
                    "apiVersion": "v1",
                    "metadata": {
                        "name": f"{metadata['name']}.{secrets.token_hex(8)}",
                        "namespace": ns,
                    },
                    "involvedObject": {
                        "kind": "Pod",
                        "namespace": ns,
                        "name": metadata["name"],
                        "uid": metadata["uid"],
                        "apiVersion": "v1",
                    },
                    "reason": reason,
                    "message": message,
                    "type": kind,
                    "count": 1,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "source": {"component": by},
                }
            )

    def list_events(self, ns: str, selector: str) -> dict[str, Any]:
        """Events of the namespace matching a field selector on ``involvedObject``
        (``kind``, ``name``, ``namespace``, ``uid``; other fields are a 400, as the API
        answers for a field label it does not support)."""
        terms = {}
        for term in filter(None, (t.strip() for t in selector.split(","))):
            key, eq, value = term.replace("==", "=").partition("=")
            field = key.removeprefix("involvedObject.")
            if not eq or key == field or field not in {"kind", "name", "namespace", "uid"}:
                raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
            terms[field] = value
        with self.lock:
            items = [
                copy.deepcopy(e)
                for e in self.events
                if e["metadata"]["namespace"] == ns
                and all(e["involvedObject"].get(k) == v for k, v in terms.items())
            ]
        return {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}

    def delete_pod(self, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        """Delete the pod as the API server does (the module's docstring): gracefully,
        kept until its containers stopped; at once with grace 0, for a pod never
        scheduled or one that ended."""
        pod = self.pod(ns, name)
        self.deletions.append((name, grace))
        metadata = pod.obj["metadata"]
        grace_s = int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30))
        grace_s = grace_s if grace is None else max(0, grace)
        phase = pod.status(self.engine)["phase"]
        answer = self.pod_object(pod)
        if grace_s == 0 or not pod.scheduled or phase in {"Failed", "Succeeded"}:
            with self.lock:
                self.pods.pop((ns, name), None)
            lag = self.force_lag_s if phase not in {"Failed", "Succeeded"} else 0.0
            self._background(self._reap, pod, lag)
        elif metadata.get("deletionTimestamp") is None:
            metadata["deletionTimestamp"] = _now(grace_s)
            metadata["deletionGracePeriodSeconds"] = grace_s
            answer = self.pod_object(pod)
            if not self.kubelet_down:
                self._background(self._terminate, ns, name, pod, grace_s)
        return answer

    def _background(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._removals.append(thread)
        thread.start()

    def _reap(self, pod: podman_pods.PodmanPod, lag_s: float) -> None:
        """The kubelet, at its next sync, stopping what a removed pod still ran."""
        self._closing.wait(lag_s)
        pod.remove()

    def _terminate(self, ns: str, name: str, pod: podman_pods.PodmanPod, grace_s: int) -> None:
        """The kubelet's graceful stop: SIGTERM, SIGKILL past the grace; then the API
        removes the object (unless a grace-0 delete removed it already)."""
        pod.stop(grace_s)
        pod.remove()
        with self.lock:
            if self.pods.get((ns, name)) is pod:
                del self.pods[(ns, name)]

    # --- NetworkPolicies ------------------------------------------------------------

    def create_policy(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        _validate(body, "NetworkPolicy", k8s.V1NetworkPolicy)
        name = body["metadata"].get("name")
        with self.lock:
            if (ns, name) in self.policies:
                raise ApiError(409, "AlreadyExists", f'networkpolicies "{name}" already exists')
            _stamp(body["metadata"], ns)
            self.policies[(ns, name)] = body
        return body

    def policy(self, ns: str, name: str) -> dict[str, Any]:
        found = self.policies.get((ns, name))
        if found is None:
            raise ApiError(404, "NotFound", f'networkpolicies "{name}" not found')
        return found

    def delete_policy(self, ns: str, name: str) -> dict[str, Any]:
        found = self.policy(ns, name)
        with self.lock:
            del self.policies[(ns, name)]
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}} | {
            "details": {"name": found["metadata"]["name"], "kind": "networkpolicies"}
        }


def _stamp(metadata: dict[str, Any], ns: str) -> None:
    metadata["namespace"] = ns
    metadata["uid"] = str(uuid.uuid4())
    metadata["resourceVersion"] = "1"
    metadata["creationTimestamp"] = _now()


def _now(later_s: float = 0) -> str:
    return datetime.fromtimestamp(time.time() + later_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _validate(body: dict[str, Any], kind: str, model: Any) -> None:
    if body.get("kind", kind) != kind or not isinstance(body.get("metadata"), dict):
        raise ApiError(400, "BadRequest", f"not a {kind}")
    try:
        model.from_dict(body)
        kubernetes_validate.validate({"kind": kind, **body}, SCHEMA_VERSION, strict=True)
    except (ValueError, kubernetes_validate.ValidationError) as exc:
        raise ApiError(422, "Invalid", f"{kind} is invalid: {exc}") from exc


def _selector(selector: str) -> Any:
    """A label selector's test (equality terms and existence; others are a 400)."""
    terms: list[tuple[str, str | None]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, eq, value = term.replace("==", "=").partition("=")
        if not re.fullmatch(r"[A-Za-z0-9./_-]+", key) or "!" in term:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term}")
        terms.append((key, value if eq else None))

    def match(labels: dict[str, str]) -> bool:
        return all(k in labels and (v is None or labels[k] == v) for k, v in terms)

    return match


def _handler(api: ApiDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        double = api

    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    double: ApiDouble

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        del format, args  # quiet: pytest shows the test's own output

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        # A watch is its own RBAC verb: recorded with the marker tests/k8s_double/rbac.py reads.
        watch = "?watch" if query.get("watch") else ""
        self.double.requests.append((method, url.path + watch))
        try:
            self._authorize()
            route = self._authorize_rbac(method, url.path + watch)
            body = self._body()
            fault = None if route is None else self.double.faults.next(route)
            if fault is not None and fault.reset is True:
                self._reset()
                return
            if fault is not None and fault.status is not None:
                self._refuse(fault)
                return
            if self.headers.get("Upgrade", "").lower() == "websocket":
                self._exec(url.path, query)
                return
            answer = self._route(method, url.path, query, body)
            if fault is not None and fault.reset == "after":
                self._reset()
                return
            self._reply(200 if method != "POST" else 201, answer)
        except ApiError as exc:
            self._reply(exc.code, exc.status())

    def _authorize_rbac(self, method: str, path: str) -> str | None:
        """Refuse (403) a request whose verb the double's Role lacks, as the API
        server's authorizer does before anything is served; the request's route."""
        try:
            needed = rbac.needed(method, path)
        except ValueError:
            return None
        missing = sorted(needed - self.double.granted)
        if missing:
            group, resource, verb = missing[0]
            name = path.rsplit("/", 1)[-1]
            ns = found[1] if (found := re.search(r"/namespaces/([^/]+)", path)) else ""
            raise ApiError(
                403,
                "Forbidden",
                f'{resource} "{name}" is forbidden: User "system:serviceaccount:acp-worker:'
                f'acp-worker" cannot {verb} resource "{resource}" in API group "{group}" '
                f'in the namespace "{ns}"',
            )
        return rbac.route(method, path)

    def _refuse(self, fault: Fault) -> None:
        """A fault's answer: its status as the API words it (and ``Retry-After``)."""
        code = int(fault.status or 500)
        error = ApiError(code, _REASONS.get(code, "InternalError"), "injected by the double")
        data = json.dumps(error.status()).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if fault.retry_after is not None:
            self.send_header("Retry-After", str(fault.retry_after))
        self.end_headers()
        self.wfile.write(data)

    def _reset(self) -> None:
        """Reset the connection (RST, no answer)."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _authorize(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.double.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _body(self) -> dict[str, Any] | None:
        size = int(self.headers.get("Content-Length") or 0)
        if not size:
            return None
        try:
            body = json.loads(self.rfile.read(size))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body is not an object")
        return body

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> dict[str, Any]:
        if found := _PODS.match(path):
            answer = self._pods(method, found, query, body)
        elif (found := _EVENTS.match(path)) and method == "GET":
            answer = self.double.list_events(found["ns"], (query.get("fieldSelector") or [""])[0])
        elif found := _POLICIES.match(path):
            answer = self._policies(method, found, body)
        else:
            answer = None
        if answer is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource: {path}"
            )
        return answer

    def _pods(
        self,
        method: str,
        found: re.Match[str],
        query: dict[str, list[str]],
        body: dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        api, ns, name = self.double, found["ns"], found["name"]
        if name is None and method == "POST":
            return api.create_pod(ns, body or {})
        if name is None and method == "GET":
            if query.get("watch"):
                raise ApiError(405, "MethodNotAllowed", "the double serves no watch")
            return api.list_pods(ns, (query.get("labelSelector") or [""])[0])
        if name is None or found["sub"] is not None:
            return None
        if method == "GET":
            return api.pod_object(api.pod(ns, name))
        if method == "PATCH":
            return api.patch_pod(ns, name, body or {}, self.headers.get("Content-Type", ""))
        if method != "DELETE":
            return None
        return api.delete_pod(ns, name, _grace(query, body))

    def _policies(
        self, method: str, found: re.Match[str], body: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        api, ns, name = self.double, found["ns"], found["name"]
        if name is None:
            return api.create_policy(ns, body or {}) if method == "POST" else None
        if method == "GET":
            return api.policy(ns, name)
        return api.delete_policy(ns, name) if method == "DELETE" else None

    def _reply(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # --- exec -----------------------------------------------------------------------

    def _exec(self, path: str, query: dict[str, list[str]]) -> None:
        found = _PODS.match(path)
        if found is None or found["sub"] != "exec" or found["name"] is None:
            raise ApiError(404, "NotFound", f"no such stream: {path}")
        pod = self.double.pod(found["ns"], found["name"])
        container = (query.get("container") or [pod.containers[0]])[0]
        command = query.get("command") or []
        if container not in pod.containers or not command:
            raise ApiError(400, "BadRequest", "exec needs a command and a container of the pod")
        if pod.status(self.double.engine)["phase"] != "Running":
            raise ApiError(400, "BadRequest", f"container {container} is not running")
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        protocol = next((p for p in self.double.protocols if p in offered), None)
        if protocol is None:
            raise ApiError(400, "BadRequest", "no supported channel protocol offered")
        stdin = _flag(query, "stdin")
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept_key(self.headers["Sec-WebSocket-Key"]))
        self.send_header("Sec-WebSocket-Protocol", protocol)
        self.end_headers()
        self.close_connection = True
        with _session(self, pod.container_name(container), command, stdin=stdin) as session:
            session.run(v5=protocol == V5)


def _grace(query: dict[str, list[str]], body: dict[str, Any] | None) -> int | None:
    """A delete's grace period: the query's ``gracePeriodSeconds``, else its
    DeleteOptions body's; None: the pod's own."""
    value: Any = (query.get("gracePeriodSeconds") or [None])[0]
    if value is None and body is not None:
        value = body.get("gracePeriodSeconds")
    try:
        return None if value is None else int(value)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"gracePeriodSeconds: {value}") from exc


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[0].lower() in {"1", "true"}


@contextmanager
def _session(
    handler: _Handler, container: str, command: list[str], *, stdin: bool
) -> Iterator[_ExecSession]:
    proc = podman_pods.exec_process(handler.double.docker_host, container, command, stdin=stdin)
    conn = Connection(handler.rfile, handler.wfile, handler.connection)
    session = _ExecSession(conn, proc, handler.double.idle_cutoff_s)
    try:
        yield session
    finally:
        podman_pods.release(proc)


class _ExecSession:
    """One exec stream: the client's stdin to the process, its output and final status
    to the client."""

    def __init__(self, conn: Connection, proc: Any, idle_cutoff_s: float | None) -> None:
        self.conn, self.proc, self.idle_cutoff_s = conn, proc, idle_cutoff_s
        self._over = threading.Event()

    def run(self, *, v5: bool) -> None:
        pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, STDOUT), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, STDERR), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        ender = threading.Thread(target=self._end, args=(pumps,), daemon=True)
        ender.start()
        if self.idle_cutoff_s is not None:
            threading.Thread(
                target=self._idle_timer, args=(self.idle_cutoff_s,), daemon=True
            ).start()
        try:
            self._stdin(v5=v5)
        except ProtocolError:
            self.conn.close(1002)
        podman_pods.close_quietly(self.proc)
        ender.join()
        self._over.set()

    def _idle_timer(self, cutoff_s: float) -> None:
        while not self._over.wait(min(0.1, cutoff_s)) and not self.conn.closed:
            if time.monotonic() - self.conn.last_active > cutoff_s:
                self.conn.abort()
                return

    def _stdin(self, *, v5: bool) -> None:
        while (message := self.conn.recv()) is not None:
            if not message:
                continue
            channel, data = message[0], message[1:]
            if channel == STDIN and self.proc.stdin is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.write(data)
                    self.proc.stdin.flush()
                except OSError:
                    continue
            elif v5 and channel == CLOSE and data[:1] == bytes([STDIN]):
                podman_pods.close_quietly(self.proc)

    def _pump(self, stream: Any, channel: int) -> None:
        while chunk := stream.read1(65536):
            self.conn.send(bytes([channel]) + chunk)

    def _end(self, pumps: list[threading.Thread]) -> None:
        code = self.proc.wait()
        for pump in pumps:
            pump.join()
        self.conn.send(bytes([ERROR]) + json.dumps(_exit_status(code)).encode())
        self.conn.close()


def _exit_status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }
