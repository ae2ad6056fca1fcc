"""The Kubernetes objects of the sandbox backend, as the JSON the API takes: pure
functions, no API call (docs/kubernetes.md says why each field is there).

- ``sandbox_pod``: one job attempt's pod: the pack image by digest, no service-account
  token, no service links, no host namespace, non-root uid/gid ``SANDBOX_UID``/``GID``,
  read-only root, drop ALL, no privilege escalation, ``RuntimeDefault`` seccomp, stdin
  held open for the agent's stdio, emptyDirs for the workspace (on disk) and for HOME
  and /tmp (in memory), requests equal to limits, ``activeDeadlineSeconds`` as the
  kubelet's backstop, the job's labels, the annotations that keep autoscalers from
  evicting it, and optionally an owner reference to the worker's pod (same namespace
  only) and where it may run (RuntimeClass, node selector, tolerations, affinity,
  priority, pull secrets, a service account whose token is not mounted).
- ``network_policies``: ``none`` denies every sandbox pod all ingress and egress;
  ``allowlist`` pods may, in addition, reach the worker's proxy and nothing else.
- ``role`` and ``role_binding``: exactly ``RBAC_RULES``, namespace-scoped, the data the
  Helm chart renders too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError
from worker.sandbox.base import (
    HOME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_TOKEN,
    LABEL_WORKER,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    SandboxSpec,
)
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.k8s_values import DISRUPTION_ANNOTATIONS
from worker.sandbox.kubernetes.names import (
    check_key,
    exact_labels,
    label_value,
    pod_labels,
    pod_name,
)

BACKEND_NAME = "kubernetes"
#: Carried by every pod this backend makes (value ``BACKEND_NAME``): what the
#: NetworkPolicies select.
LABEL_BACKEND = "acpw.backend"
#: The job's network mode (``none``/``allowlist``): what the proxy policy selects.
LABEL_NETWORK = "acpw.network"
#: The exact labels of the pod (JSON), which its labels may only carry encoded.
ANNOTATION_LABELS = "acpw.io/labels"
#: The job's ``limits.pids``: a pod spec has no field for it (``k8s_pids_limit_supported``).
ANNOTATION_PIDS = "acpw.io/pids-limit"
CONTAINER = "agent"
#: The empty read-only volume over every masked config file and directory.
MASK_VOLUME = "config-mask"
#: Prefix of the writable volume of each anchored config directory.
ANCHOR_VOLUME = "config-anchor"
HOSTNAME = "acpw"
SANDBOX_TMP = "/tmp"  # noqa: S108 - the pod's own memory-backed emptyDir
#: Room for the container's log files, which the kubelet keeps and counts as the pod's
#: ephemeral storage, beside the workspace.
LOG_BYTES = 64 * 1024 * 1024
TERMINATION_GRACE_S = 5
NETWORK_MODES = ("none", "allowlist")
_DIGEST_REF = re.compile(
    r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"@sha256:[0-9a-f]{64}$"
)
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_NETWORKING = "networking.k8s.io/v1"
_RBAC = "rbac.authorization.k8s.io/v1"
DENY_ALL_POLICY = "acpw-sandbox-deny-all"
PROXY_POLICY = "acpw-sandbox-proxy-only"
ROLE_NAME = "acp-worker-sandboxes"


def sandbox_pod(
    spec: SandboxSpec,
    *,
    image: str,
    config: KubernetesConfig,
    command: Sequence[str],
    deadline_s: int,
    disk_bytes: int | None = None,
    masks: Sequence[MaskEntry] = (),
) -> dict[str, Any]:
    """The pod of ``spec``'s job attempt, running ``command`` in ``image``
    (``name@sha256:<hex>``) with its stdin held open, stopped by the kubelet after
    ``deadline_s`` seconds, with a workspace of ``disk_bytes`` (default
    ``config.k8s_ephemeral_storage_bytes``) and ``masks`` (``mask_volumes``) mounted
    over it.

    Raises:
        SandboxError: the image is not named by digest; the deadline, disk size or
            command is empty or not positive; the spec asks for what a pod cannot carry
            (host mounts, a network mode other than ``none``/``allowlist``); a label
            cannot be represented.
    """
    _check_pod_inputs(spec, image=image, command=command, deadline_s=deadline_s)
    disk = config.k8s_ephemeral_storage_bytes if disk_bytes is None else disk_bytes
    if disk < 1:
        raise SandboxError("a workspace size is positive", disk_bytes=disk)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(spec, config),
        "spec": _pod_spec(spec, config, deadline_s=deadline_s)
        | {
            "containers": [
                _container(spec, image=image, config=config, command=command, disk=disk)
                | {"volumeMounts": _mounts() + mask_mounts(masks)}
            ],
            "volumes": _volumes(spec, disk) + mask_volumes(masks, disk),
        },
    }


def _check_pod_inputs(
    spec: SandboxSpec, *, image: str, command: Sequence[str], deadline_s: int
) -> None:
    if not _DIGEST_REF.match(image):
        raise SandboxError("a sandbox pod's image is named by digest (name@sha256:…)", image=image)
    if deadline_s < 1 or not command:
        raise SandboxError(
            "a sandbox pod needs a command and a positive deadline", deadline_s=deadline_s
        )
    if spec.network not in NETWORK_MODES:
        raise SandboxError("unknown network mode", network=spec.network)
    if spec.extra_mounts or spec.state_mounts:
        # A pod must not bind host paths; what they carry is copied in by the backend.
        raise SandboxError(
            "a sandbox pod cannot bind host paths (extra or state mounts)",
            extra_mounts=[m.target for m in spec.extra_mounts],
            state_mounts=[m.target for m in spec.state_mounts],
        )


def sandbox_labels(spec: SandboxSpec, config: KubernetesConfig) -> dict[str, str]:
    """The exact labels of ``spec``'s pod: the spec's, then job, attempt, token, worker,
    backend and network mode (these win over the spec's)."""
    return {
        **spec.labels,
        LABEL_JOB: spec.job_id,
        LABEL_ATTEMPT: str(spec.attempt),
        LABEL_TOKEN: spec.labels.get(LABEL_TOKEN, "0"),
        LABEL_WORKER: spec.labels.get(LABEL_WORKER, config.worker_id),
        LABEL_BACKEND: BACKEND_NAME,
        LABEL_NETWORK: spec.network,
    }


def _pod_metadata(spec: SandboxSpec, config: KubernetesConfig) -> dict[str, object]:
    labels = sandbox_labels(spec, config)
    # The operator's labels and annotations first: the backend's own always win (the
    # config refuses their keys anyway).
    annotations = dict(config.k8s_pod_annotations)
    if config.k8s_disruption_annotations:
        annotations |= DISRUPTION_ANNOTATIONS
    metadata: dict[str, object] = {
        "name": pod_name(spec.job_id, spec.attempt),
        "namespace": config.k8s_namespace,
        "labels": dict(config.k8s_pod_labels) | pod_labels(labels),
        "annotations": annotations
        | {
            ANNOTATION_LABELS: exact_labels(labels),
            ANNOTATION_PIDS: str(spec.limits.pids),
        },
    }
    if config.k8s_owner_pod_name is not None:
        metadata["ownerReferences"] = [_owner_reference(config)]
    return metadata


def _owner_reference(config: KubernetesConfig) -> dict[str, object]:
    """The worker's pod as the sandbox pod's owner.

    Raises:
        SandboxError: the owner is in another namespace (or unknown): an owner reference
            cannot cross namespaces, and the garbage collector would take one that does
            as an absent owner and delete the sandbox pod at once.
    """
    if config.k8s_owner_pod_namespace != config.k8s_namespace:
        raise SandboxError(
            "an owner reference cannot cross namespaces",
            owner_namespace=config.k8s_owner_pod_namespace,
            namespace=config.k8s_namespace,
        )
    # Not blockOwnerDeletion: that needs update on the owner's finalizers (more RBAC),
    # and the worker's pod going first is what this reference is for.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": config.k8s_owner_pod_name,
        "uid": config.k8s_owner_pod_uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def _pod_spec(spec: SandboxSpec, config: KubernetesConfig, *, deadline_s: int) -> dict[str, object]:
    pod: dict[str, object] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_s,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "hostname": HOSTNAME,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_GID,
            "fsGroup": SANDBOX_GID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return pod | _placement(config)


def _placement(config: KubernetesConfig) -> dict[str, object]:
    """Where the pod may run and as whom, from the config (each only when set)."""
    placement: dict[str, object] = {}
    if config.k8s_runtime_class_name is not None:
        placement["runtimeClassName"] = config.k8s_runtime_class_name
    if config.k8s_node_selector:
        placement["nodeSelector"] = dict(config.k8s_node_selector)
    if config.k8s_tolerations:
        placement["tolerations"] = [t.manifest() for t in config.k8s_tolerations]
    if config.k8s_affinity is not None:
        placement["affinity"] = config.k8s_affinity
    if config.k8s_priority_class_name is not None:
        placement["priorityClassName"] = config.k8s_priority_class_name
    if config.k8s_image_pull_secrets:
        placement["imagePullSecrets"] = [{"name": n} for n in config.k8s_image_pull_secrets]
    if config.k8s_service_account_name is not None:
        # Its token stays unmounted (automountServiceAccountToken false above).
        placement["serviceAccountName"] = config.k8s_service_account_name
    return placement


def _container(
    spec: SandboxSpec,
    *,
    image: str,
    config: KubernetesConfig,
    command: Sequence[str],
    disk: int,
) -> dict[str, object]:
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": config.k8s_image_pull_policy,
        "command": list(command),
        "workingDir": WORKSPACE,
        # The agent's stdio: attached once, and closing it ends the program's stdin.
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "securityContext": _container_security(),
        "resources": _resources(spec, disk),
    }


def _mounts() -> list[dict[str, object]]:
    return [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "home", "mountPath": HOME},
        {"name": "tmp", "mountPath": SANDBOX_TMP},
    ]


def _container_security() -> dict[str, object]:
    # The pod's identity and seccomp again: a container's own context takes precedence.
    return {
        "runAsNonRoot": True,
        "runAsUser": SANDBOX_UID,
        "runAsGroup": SANDBOX_GID,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(spec: SandboxSpec, disk: int) -> dict[str, object]:
    """Requests equal to limits: the pod is scheduled only where all of it fits, and its
    QoS class is Guaranteed (evicted last under node pressure)."""
    limits = spec.limits
    if limits.memory_bytes < 1 or limits.cpus <= 0:
        raise SandboxError(
            "memory and cpu limits are positive", memory=limits.memory_bytes, cpus=limits.cpus
        )
    quantities = {
        "memory": str(limits.memory_bytes),
        "cpu": f"{max(1, round(limits.cpus * 1000))}m",
        "ephemeral-storage": str(disk + LOG_BYTES),
    }
    return {"requests": dict(quantities), "limits": dict(quantities)}


def _volumes(spec: SandboxSpec, disk: int) -> list[dict[str, object]]:
    # HOME and /tmp are in memory (their pages count against the memory limit, as the
    # other backends' tmpfs do); the workspace is on the node's disk, bounded.
    in_memory = {"medium": "Memory", "sizeLimit": str(spec.tmpfs_bytes)}
    return [
        {"name": "workspace", "emptyDir": {"sizeLimit": str(disk)}},
        {"name": "home", "emptyDir": dict(in_memory)},
        {"name": "tmp", "emptyDir": dict(in_memory)},
    ]


def anchor_volume(index: int) -> str:
    return f"{ANCHOR_VOLUME}-{index}"


def mask_mounts(masks: Sequence[MaskEntry]) -> list[dict[str, object]]:
    """The container's mounts for ``masks`` (``worker.admission.mask_plan``), in order:
    each anchor directory a writable volume of its own (a mount point cannot be renamed
    or removed: EBUSY), each config file and directory the one empty read-only volume
    (so a config file reads as an empty directory nothing can be written in). A pod
    has no ``/dev/null`` bind; the runtime makes the missing mount points."""
    mounts: list[dict[str, object]] = []
    anchors = 0
    for entry in masks:
        path = f"{WORKSPACE}/{entry.path}"
        if entry.kind is MaskKind.ANCHOR:
            mounts.append({"name": anchor_volume(anchors), "mountPath": path})
            anchors += 1
        else:
            mounts.append({"name": MASK_VOLUME, "mountPath": path, "readOnly": True})
    return mounts


def mask_volumes(masks: Sequence[MaskEntry], disk: int) -> list[dict[str, object]]:
    """The volumes ``mask_mounts`` names: the anchors' on disk (bounded as the
    workspace is), the empty one in memory (nothing is ever written to it)."""
    anchors = sum(1 for e in masks if e.kind is MaskKind.ANCHOR)
    volumes: list[dict[str, object]] = [
        {"name": anchor_volume(i), "emptyDir": {"sizeLimit": str(disk)}} for i in range(anchors)
    ]
    if anchors < len(masks):
        volumes.append({"name": MASK_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}})
    return volumes


@dataclass(frozen=True, slots=True)
class ProxyPeer:
    """Where the worker's allowlist proxy listens, as a NetworkPolicy names it."""

    #: Labels of the proxy's pods (at least one: an empty selector is every pod).
    pod_labels: Mapping[str, str]
    #: Labels of the proxy's namespace; ``None``: the sandbox namespace itself.
    namespace_labels: Mapping[str, str] | None
    port: int


def network_policies(config: KubernetesConfig, proxy: ProxyPeer | None) -> list[dict[str, object]]:
    """The sandbox namespace's NetworkPolicies the backend creates: deny-all for every
    sandbox pod, and, with a ``proxy``, egress from ``allowlist`` pods to it alone (TCP,
    its port; no DNS: the proxy resolves names). None when ``k8s_network_policies`` is
    ``external`` (they are in place, e.g. the chart's).

    Raises:
        SandboxError: ``proxy`` has no pod labels, a label a selector cannot match, or
            a port outside 1-65535.
    """
    if config.k8s_network_policies == "external":
        return []  # in place already (the chart's): the backend creates none
    policies = [_deny_all(config)]
    if proxy is not None:
        policies.append(_proxy_only(config, proxy))
    return policies


def _policy(config: KubernetesConfig, name: str, spec: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": _NETWORKING,
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": config.k8s_namespace,
            "labels": {LABEL_BACKEND: BACKEND_NAME},
        },
        "spec": spec,
    }


def _deny_all(config: KubernetesConfig) -> dict[str, object]:
    # Both types listed and no rule of either: nothing in, nothing out.
    selector = {"matchLabels": {LABEL_BACKEND: BACKEND_NAME}}
    return _policy(
        config, DENY_ALL_POLICY, {"podSelector": selector, "policyTypes": ["Ingress", "Egress"]}
    )


def _proxy_only(config: KubernetesConfig, proxy: ProxyPeer) -> dict[str, object]:
    peer: dict[str, object] = {"podSelector": {"matchLabels": _selector(proxy.pod_labels)}}
    if proxy.namespace_labels is not None:
        # One peer with both selectors: pods with these labels in such namespaces only.
        peer["namespaceSelector"] = {"matchLabels": _selector(proxy.namespace_labels)}
    if not proxy.pod_labels or not 0 < proxy.port < 65536:
        raise SandboxError("a proxy peer needs pod labels and a port", port=proxy.port)
    selected = {LABEL_BACKEND: BACKEND_NAME, LABEL_NETWORK: "allowlist"}
    return _policy(
        config,
        PROXY_POLICY,
        {
            "podSelector": {"matchLabels": selected},
            "policyTypes": ["Egress"],
            "egress": [{"to": [peer], "ports": [{"protocol": "TCP", "port": proxy.port}]}],
        },
    )


def _selector(labels: Mapping[str, str]) -> dict[str, str]:
    """Labels a selector matches exactly: an encoded value would match nothing."""
    for key, value in labels.items():
        check_key(key, to_set=False)
        if label_value(value) != value:
            raise SandboxError("a selector's label value must be valid as it is", key=key)
    return dict(labels)


@dataclass(frozen=True, slots=True)
class RbacRule:
    """One rule of the backend's Role, and why the backend needs it."""

    api_group: str  # "" is the core group
    resource: str
    verbs: tuple[str, ...]
    why: str


RBAC_RULES: tuple[RbacRule, ...] = (
    RbacRule(
        "",
        "pods",
        ("create", "get", "list", "delete", "patch"),
        "one pod per job attempt, read until it runs and until it is gone; the reaper "
        "lists sandbox pods by label and deletes orphans; a warm slot's pod is "
        "relabelled to the job attempt that claims it and its `activeDeadlineSeconds` "
        "lowered to the job's bound (labels, annotations and that field only)",
    ),
    RbacRule(
        "",
        "pods/exec",
        ("create", "get"),
        "every program of the sandbox, the workspace and session store copied in and "
        "changes out (tar), admission in the pod's own view (a WebSocket upgrade is a "
        "GET; API servers from 1.30 also check create)",
    ),
    RbacRule(
        "",
        "events",
        ("list",),
        "what the scheduler and the kubelet said of a pod that stayed unschedulable or "
        "failed its image pull past its bound, carried in the job's error",
    ),
    RbacRule(
        _NETWORKING.split("/", 1)[0],
        "networkpolicies",
        ("create",),
        "the sandbox namespace's deny-all policy, created once (an existing one is kept)",
    ),
)
"""Exactly what the backend needs, in its sandbox namespace only."""


def role(config: KubernetesConfig, *, name: str = ROLE_NAME) -> dict[str, object]:
    """The namespace-scoped Role granting ``RBAC_RULES`` in the sandbox namespace (less
    NetworkPolicy ``create`` when ``k8s_network_policies`` is ``external``)."""
    external = config.k8s_network_policies == "external"
    return {
        "apiVersion": _RBAC,
        "kind": "Role",
        "metadata": {"name": name, "namespace": config.k8s_namespace},
        "rules": [
            {"apiGroups": [rule.api_group], "resources": [rule.resource], "verbs": list(rule.verbs)}
            for rule in RBAC_RULES
            if not (external and rule.resource == "networkpolicies")
        ],
    }


def role_binding(
    config: KubernetesConfig,
    *,
    service_account: str,
    service_account_namespace: str,
    name: str = ROLE_NAME,
) -> dict[str, object]:
    """Binds the Role ``name`` in the sandbox namespace to the worker's ServiceAccount
    (which may live in another namespace).

    Raises:
        SandboxError: the ServiceAccount's name or namespace is not a valid name.
    """
    if not (_DNS_NAME.match(service_account) and _DNS_NAME.match(service_account_namespace)):
        raise SandboxError(
            "not a ServiceAccount name and namespace",
            service_account=service_account,
            namespace=service_account_namespace,
        )
    return {
        "apiVersion": _RBAC,
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": config.k8s_namespace},
        "roleRef": {"apiGroup": _RBAC.split("/", 1)[0], "kind": "Role", "name": name},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": service_account,
                "namespace": service_account_namespace,
            }
        ],
    }
