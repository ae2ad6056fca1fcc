"""The pods of the API double, run for real on Podman (``podman kube play``).

Each pod the double accepts is played on the shared Podman service as it was given
(the one annotation Podman 4.3 refuses, a value over 63 characters, is left out of what
it plays: tests/integration/test_kubernetes_pod_podman.py says why; and each emptyDir is
renamed for the pod, as Podman would otherwise share one named volume between every pod
naming it alike). Its status is what
the engine says of its container: ``Pending`` while the play runs (or its image cannot
be had: ``ErrImagePull``), ``Running``, then ``Succeeded``/``Failed`` with the container's
exit code and ``OOMKilled`` as its reason when the engine says so. A pod the double ended
as the kubelet would (``end``: evicted, past its ``activeDeadlineSeconds``) is ``Failed``
with that reason and message from then on, whatever its containers say.

Before it is played, a pod may be made to wait as on a busy cluster (``Gate``): no node
for it for some seconds (``PodScheduled`` ``False``, ``Unschedulable``, with the
scheduler's message and a ``FailedScheduling`` event, as while cluster-autoscaler or
Karpenter adds a node), then scheduled (``spec.nodeName``); and its image pull failing a
number of times (the container waiting ``ErrImagePull`` right after a failed pull, then
``ImagePullBackOff`` until the kubelet's next try, with its ``Failed`` and ``BackOff``
events), then pulled and played.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

#: What ``podman kube play`` prints when the image cannot be had (no registry here).
_PULL_FAILURES = ("initializing source", "manifest unknown", "pull", "no such image", "unable to")
MAX_ANNOTATION = 63
#: The node the double "schedules" every pod on (it has none: a name for ``nodeName``).
NODE = "double-node"
#: What the scheduler says of a pod no node can take, as it words it.
UNSCHEDULABLE_MESSAGE = (
    "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
    "3 No preemption victims found for incoming pod."
)


@dataclass(frozen=True, slots=True)
class Gate:
    """How long a pod waits before it is played: ``unschedulable_s`` without a node,
    then ``pull_failures`` failed pulls, ``pull_backoff_s`` apart."""

    unschedulable_s: float = 0.0
    pull_failures: int = 0
    pull_backoff_s: float = 1.0


def podman(host: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--remote", "--url", host, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class PodmanPod:
    """One pod: its object as the API stores it, and its containers on Podman."""

    def __init__(
        self,
        host: str,
        obj: dict[str, Any],
        *,
        gate: Gate = Gate(),
        event: Callable[..., None] | None = None,
    ) -> None:
        """``gate``: what the pod waits out before it is played; ``event(pod, type,
        reason, message, component)``: records an event of the pod."""
        self.host = host
        self.obj = obj
        self.gate = gate
        self._event = event or (lambda *a, **k: None)
        #: While gated: what the pod waits on (``Unschedulable`` or a pull reason) and
        #: the cluster's message; None once played (or never gated).
        self.waiting: tuple[str, str] | None = None
        if gate.unschedulable_s > 0:
            self.waiting = ("Unschedulable", UNSCHEDULABLE_MESSAGE)
        else:
            obj["spec"]["nodeName"] = NODE
        self._cancelled = threading.Event()
        self.name: str = obj["metadata"]["name"]
        #: The pod's name on the engine: its own name and a suffix of its own, so two
        #: doubles (two test sessions on one Podman) never play pods of one name.
        self.engine_name = f"{self.name}-{secrets.token_hex(3)}"
        self.containers = [c["name"] for c in obj["spec"]["containers"]]
        self._played = threading.Event()
        self.volumes: list[str] = []
        self._play_error: str | None = None
        self._lock = threading.Lock()
        self._removed = False
        #: How the kubelet ended the pod (``reason``, ``message``), once it did.
        self.ended: tuple[str, str] | None = None

    def container_name(self, container: str) -> str:
        """The engine's name of one container of the pod (``podman kube play``'s)."""
        return f"{self.engine_name}-{container}"

    def start(self) -> None:
        """Play the pod in the background (the API answers before it runs)."""
        threading.Thread(target=self._run, name=f"play-{self.name}", daemon=True).start()

    @property
    def scheduled(self) -> bool:
        return bool(self.obj["spec"].get("nodeName"))

    def _run(self) -> None:
        gate = self.gate
        if gate.unschedulable_s > 0:
            self._event("Warning", "FailedScheduling", UNSCHEDULABLE_MESSAGE, "default-scheduler")
            if self._cancelled.wait(gate.unschedulable_s):
                self._played.set()
                return
        self.obj["spec"]["nodeName"] = NODE
        image = self.obj["spec"]["containers"][0].get("image", "")
        for _ in range(gate.pull_failures):
            failed = (
                f'Failed to pull image "{image}": rpc error: code = Unknown desc = failed '
                "to pull and unpack image: 503 Service Unavailable"
            )
            self.waiting = ("ErrImagePull", failed)
            self._event("Warning", "Failed", failed, "kubelet")
            half = gate.pull_backoff_s / 2
            if self._cancelled.wait(half):
                self._played.set()
                return
            backoff = f'Back-off pulling image "{image}"'
            self.waiting = ("ImagePullBackOff", backoff)
            self._event("Normal", "BackOff", backoff, "kubelet")
            if self._cancelled.wait(half):
                self._played.set()
                return
        self._play()

    def _play(self) -> None:
        played = copy.deepcopy(self.obj)
        played["spec"].pop("nodeName", None)
        annotations = played["metadata"].get("annotations") or {}
        for key in [k for k, v in annotations.items() if len(v) > MAX_ANNOTATION]:
            del annotations[key]
        played.pop("status", None)
        played["metadata"]["name"] = self.engine_name
        # The pod's hostname stays its API name, as a kubelet sets it.
        played.setdefault("spec", {}).setdefault("hostname", self.name)
        self._own_volumes(played)
        with tempfile.TemporaryDirectory(prefix="k8s-double-") as tmp:
            path = Path(tmp) / "pod.json"
            path.write_text(json.dumps(played))
            with self._lock:
                done = None if self._removed else podman(self.host, "kube", "play", str(path))
        if done is not None and done.returncode != 0:
            self._play_error = done.stderr.strip()[-2000:] or "podman kube play failed"
        self.waiting = None
        self._played.set()

    def _own_volumes(self, played: dict[str, Any]) -> None:
        """Give each emptyDir a name of this pod's own: Podman 4.3 plays an emptyDir as
        the *named* volume of its name, shared by every pod that names it alike (two
        sandbox pods would see one ``/workspace``), where Kubernetes gives each pod its
        own. Only the names change; the mounts follow them."""
        spec = played.get("spec") or {}
        renamed = {}
        for volume in spec.get("volumes") or []:
            if "emptyDir" in volume:
                renamed[volume["name"]] = f"{self.engine_name}-{volume['name']}"
                volume["name"] = renamed[volume["name"]]
        self.volumes = list(renamed.values())
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            for mount in container.get("volumeMounts") or []:
                mount["name"] = renamed.get(mount["name"], mount["name"])

    def wait_played(self, timeout: float) -> bool:
        return self._played.wait(timeout)

    def stop(self, grace_s: int) -> None:
        """Stop the pod's containers as the kubelet does for a deletion: SIGTERM, then
        SIGKILL after ``grace_s``; returns once they stopped. A pod not played yet is
        never played."""
        self._cancelled.set()
        if self._played.wait(60):
            podman(self.host, "pod", "stop", "--time", str(grace_s), self.engine_name)

    def end(self, reason: str, message: str, *, grace_s: int) -> None:
        """End the pod as the kubelet does (evicted, past its deadline): its status says
        so at once (``Failed``, ``reason``, ``message``), then its containers are stopped
        (SIGTERM, SIGKILL after ``grace_s``); it stays until deleted. Idempotent."""
        with self._lock:
            if self.ended is not None or self._removed:
                return
            self.ended = (reason, message)
        if self._played.wait(60):
            podman(self.host, "pod", "stop", "--time", str(grace_s), self.engine_name)

    def remove(self) -> None:
        """Remove the pod and its containers from the engine (idempotent)."""
        self._cancelled.set()
        with self._lock:
            self._removed = True
            podman(self.host, "pod", "rm", "--force", "--time", "0", self.engine_name)
            for volume in self.volumes:  # removed with the pod on 4.3; made sure of here
                podman(self.host, "volume", "rm", "--force", volume)

    def status(self, client: docker.DockerClient) -> dict[str, Any]:
        """The pod's ``status`` now."""
        waiting = self.waiting
        if waiting is not None and waiting[0] == "Unschedulable":
            return {"phase": "Pending", "conditions": [_scheduled("False", *waiting)]}
        if waiting is not None:
            return {**_pending(*waiting), "conditions": [_scheduled("True")]}
        if not self._played.is_set():
            return _pending("ContainerCreating", "the pod is being started")
        if self._play_error is not None:
            if any(word in self._play_error.lower() for word in _PULL_FAILURES):
                return _pending("ErrImagePull", self._play_error)
            return {"phase": "Failed", "reason": "Error", "message": self._play_error}
        states = {c: self._state(client, c) for c in self.containers}
        statuses = [_container_status(name, s) for name, s in states.items()]
        if self.ended is not None:
            reason, message = self.ended
            return {
                "phase": "Failed",
                "reason": reason,
                "message": message,
                "containerStatuses": statuses,
            }
        running = [s for s in states.values() if s.get("Running")]
        if running:
            phase = "Running"
        elif all(s.get("ExitCode") == 0 for s in states.values()):
            phase = "Succeeded"
        else:
            phase = "Failed"
        return {"phase": phase, "containerStatuses": statuses}

    def _state(self, client: docker.DockerClient, container: str) -> dict[str, Any]:
        try:
            state: dict[str, Any] = client.api.inspect_container(self.container_name(container))[
                "State"
            ]
        except docker.errors.APIError:  # NotFound, or Podman's 500 mid-removal
            return {"Running": False, "ExitCode": 137}
        return state


def _scheduled(
    status: str, reason: str | None = None, message: str | None = None
) -> dict[str, Any]:
    """The ``PodScheduled`` condition, as the scheduler writes it."""
    condition: dict[str, Any] = {"type": "PodScheduled", "status": status}
    if reason is not None:
        condition |= {"reason": reason, "message": message}
    return condition


def _pending(reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "agent",
                "ready": False,
                "restartCount": 0,
                "image": "",
                "imageID": "",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


def _container_status(name: str, state: dict[str, Any]) -> dict[str, Any]:
    if state.get("Running"):
        now: dict[str, Any] = {"running": {"startedAt": state.get("StartedAt")}}
    else:
        code = int(state.get("ExitCode") or 0)
        reason = "OOMKilled" if state.get("OOMKilled") else ("Completed" if code == 0 else "Error")
        now = {"terminated": {"exitCode": code, "reason": reason}}
    return {
        "name": name,
        "ready": bool(state.get("Running")),
        "restartCount": 0,
        "image": "",
        "imageID": "",
        "state": now,
    }


def exec_process(
    host: str, container: str, command: list[str], *, stdin: bool
) -> subprocess.Popen[bytes]:
    """``command`` in a running container, its stdio piped (``podman exec``)."""
    args = ["podman", "--remote", "--url", host, "exec"]
    if stdin:
        args.append("--interactive")
    return subprocess.Popen(
        [*args, container, *command],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def close_quietly(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()


def release(proc: subprocess.Popen[bytes]) -> None:
    """Close every pipe of an exec'd process that has ended (or been left)."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
