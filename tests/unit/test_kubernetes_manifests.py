"""The Kubernetes manifests of the sandbox backend: hardening, limits, labels, network
policies and RBAC, each checked for what it means, and every one validated against the
Kubernetes OpenAPI schemas of the oldest and newest minor we support.

No API server runs here: the schemas are the ones ``kubernetes-validate`` bundles (it
works offline, which one test proves by refusing every connection), in strict mode, so
an unknown or misspelt field fails. The pod runs for real on Podman in
tests/integration/test_kubernetes_pod_podman.py.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
from pydantic import TypeAdapter, ValidationError

from tests.k8s_double import rbac
from worker.admission import MaskEntry, MaskKind, mask_plan
from worker.errors import InvalidSettings, SandboxError
from worker.sandbox import BackendConfig, backend_config
from worker.sandbox.base import (
    HOME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_TOKEN,
    LABEL_WORKER,
    SANDBOX_DEADLINE_MARGIN_S,
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    ReadOnlyMount,
    ResourceLimits,
    SandboxSpec,
    WritableMount,
    sandbox_deadline,
)
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes import manifests
from worker.sandbox.kubernetes.backend import pod_deadline
from worker.sandbox.kubernetes.manifests import ProxyPeer
from worker.sandbox.kubernetes.netproxy import PodNetwork
from worker.sandbox.registry import REGISTRY
from worker.settings import Settings

#: The oldest Kubernetes minor we claim to support, and the newest kubernetes-validate
#: bundles (docs/kubernetes.md says the same).
K8S_VERSIONS = ("1.29", "1.37")
REPO = Path(__file__).resolve().parents[2]
IMAGE = "registry.example:5000/acpw/pack-cursor@sha256:" + "ab" * 32
OWNER_UID = "0f6c1e0a-3b3e-4a59-9d7e-2a1c0de1f00d"
PROXY = ProxyPeer(
    pod_labels={"app.kubernetes.io/name": "acp-worker"},
    namespace_labels={"kubernetes.io/metadata.name": "acp-system"},
    port=3128,
)


def make_spec(**overrides: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "job_id": "job-1",
        "attempt": 2,
        "workspace": Path("/nonexistent/workspace"),
        "pack_closure": Path("/nonexistent/closure"),
        "limits": ResourceLimits(memory_bytes=768 * 1024**2, cpus=1.5, pids=512),
        "labels": {LABEL_TOKEN: "41", LABEL_WORKER: "worker-a"},
    }
    return SandboxSpec(**(fields | overrides))


def full_config() -> KubernetesConfig:
    return KubernetesConfig(
        worker_id="w-cfg",
        k8s_namespace="sandboxes",
        k8s_runtime_class_name="gvisor",
        k8s_image_pull_policy="Always",
        k8s_owner_pod_name="acp-worker-0",
        k8s_owner_pod_uid=OWNER_UID,
        k8s_owner_pod_namespace="sandboxes",
    )


#: Every placement setting, as the chart passes them: JSON in ``ACPW_K8S_*``.
PLACEMENT_ENV = {
    "ACPW_K8S_NODE_SELECTOR": '{"acpw.example/sandbox": "true", "kubernetes.io/arch": "amd64"}',
    "ACPW_K8S_TOLERATIONS": json.dumps(
        [
            {"key": "acpw.example/sandbox", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 30,
            },
        ]
    ),
    "ACPW_K8S_AFFINITY": json.dumps(
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "topology.kubernetes.io/zone",
                                    "operator": "In",
                                    "values": ["eu-west-1a"],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    ),
    "ACPW_K8S_RUNTIME_CLASS_NAME": "gvisor",
    "ACPW_K8S_PRIORITY_CLASS_NAME": "acpw-sandboxes",
    "ACPW_K8S_IMAGE_PULL_SECRETS": '["registry-pull"]',
    "ACPW_K8S_SERVICE_ACCOUNT_NAME": "acpw-sandbox",
    "ACPW_K8S_POD_LABELS": '{"team": "agents", "example.com/cost-center": "ai-7"}',
    "ACPW_K8S_POD_ANNOTATIONS": '{"example.com/owner": "platform team"}',
}


def placed_config(monkeypatch: pytest.MonkeyPatch | None = None) -> KubernetesConfig:
    """A config with every placement setting, read from the environment."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in PLACEMENT_ENV.items():
            (monkeypatch or patch).setenv(name, value)
        return KubernetesConfig(k8s_namespace="sandboxes")


def build_pod(
    spec: SandboxSpec | None = None, config: KubernetesConfig | None = None, **kw: Any
) -> dict[str, Any]:
    args: dict[str, Any] = {"image": IMAGE, "command": ["/bin/true"], "deadline_s": 900}
    return manifests.sandbox_pod(
        spec or make_spec(), config=config or KubernetesConfig(), **(args | kw)
    )


def container_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    return dict(container)


def quantity(text: str) -> float:
    """A Kubernetes quantity as the API reads it (the forms these manifests use)."""
    match = re.fullmatch(r"(\d+)(m|Ki|Mi|Gi)?", text)
    assert match, f"unexpected quantity {text!r}"
    scale = {None: 1, "m": 0.001, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[match.group(2)]
    return int(match.group(1)) * scale


def selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return all(labels.get(key) == value for key, value in wanted.items())


# -- the pod ------------------------------------------------------------------------------


def test_the_pod_is_locked_down() -> None:
    pod = build_pod()
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert not any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": SANDBOX_UID,
        "runAsGroup": SANDBOX_GID,
        "fsGroup": SANDBOX_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    context = container_of(pod)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert (context["runAsUser"], context["runAsGroup"]) == (SANDBOX_UID, SANDBOX_GID)
    assert not any("hostPath" in volume for volume in spec["volumes"])


def test_the_container_keeps_stdin_for_the_agent() -> None:
    container = container_of(build_pod(command=["/usr/bin/python3", "-I", "-c", "pass"]))
    assert (container["stdin"], container["stdinOnce"], container["tty"]) == (True, True, False)
    assert container["workingDir"] == WORKSPACE
    assert container["command"] == ["/usr/bin/python3", "-I", "-c", "pass"]
    assert container["image"] == IMAGE
    assert "env" not in container  # the environment goes over stdin, never into the spec


def test_requests_and_limits_follow_the_job() -> None:
    limits = ResourceLimits(memory_bytes=3 * 1024**3 + 5, cpus=0.25, pids=64)
    disk = 2 * 1024**3
    pod = build_pod(make_spec(limits=limits), disk_bytes=disk)
    resources = container_of(pod)["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    assert quantity(resources["limits"]["memory"]) == limits.memory_bytes
    assert quantity(resources["limits"]["cpu"]) == pytest.approx(limits.cpus)
    ephemeral = quantity(resources["limits"]["ephemeral-storage"])
    assert ephemeral == disk + manifests.LOG_BYTES
    volumes = {volume["name"]: volume["emptyDir"] for volume in pod["spec"]["volumes"]}
    assert quantity(volumes["workspace"]["sizeLimit"]) == disk
    assert "medium" not in volumes["workspace"]  # on disk, not in the job's memory
    pids = pod["metadata"]["annotations"][manifests.ANNOTATION_PIDS]
    assert int(pids) == limits.pids


def test_a_tiny_cpu_limit_is_still_a_limit() -> None:
    pod = build_pod(make_spec(limits=ResourceLimits(memory_bytes=1 << 20, cpus=1e-6, pids=8)))
    assert quantity(container_of(pod)["resources"]["limits"]["cpu"]) > 0


def test_the_workspace_defaults_to_the_configured_size() -> None:
    config = KubernetesConfig(k8s_ephemeral_storage_bytes=5 * 1024**3)
    volumes = {v["name"]: v["emptyDir"] for v in build_pod(config=config)["spec"]["volumes"]}
    assert quantity(volumes["workspace"]["sizeLimit"]) == config.k8s_ephemeral_storage_bytes


def test_home_and_tmp_are_in_memory_and_bounded() -> None:
    spec = make_spec(tmpfs_bytes=32 * 1024**2)
    pod = build_pod(spec)
    volumes = {volume["name"]: volume["emptyDir"] for volume in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container_of(pod)["volumeMounts"]}
    assert set(mounts) == {WORKSPACE, HOME, "/tmp"}
    for path in (HOME, "/tmp"):
        volume = volumes[mounts[path]]
        assert volume["medium"] == "Memory"
        assert quantity(volume["sizeLimit"]) == spec.tmpfs_bytes


def test_the_deadline_is_the_kubelets_backstop() -> None:
    assert build_pod(deadline_s=1234)["spec"]["activeDeadlineSeconds"] == 1234


@pytest.mark.parametrize(
    ("timeout_s", "cap", "expected"),
    [
        (600, 6 * 3600, 600 + SANDBOX_DEADLINE_MARGIN_S),
        (0.5, 6 * 3600, 1 + SANDBOX_DEADLINE_MARGIN_S),  # rounded up, never below
        (24 * 3600, 6 * 3600, 6 * 3600),  # ACPW_K8S_ACTIVE_DEADLINE_S caps it
        (None, 7200, 7200),  # a spec with no deadline: the cap alone
    ],
)
def test_the_pods_deadline_is_the_jobs_timeout_and_a_margin(
    timeout_s: float | None, cap: int, expected: int
) -> None:
    deadline = None if timeout_s is None else sandbox_deadline(timeout_s)
    spec = make_spec(deadline_s=deadline)
    config = KubernetesConfig(k8s_active_deadline_s=cap)
    pod = build_pod(spec, config, deadline_s=pod_deadline(spec, config))
    assert pod["spec"]["activeDeadlineSeconds"] == expected


def test_optional_fields_appear_only_when_configured() -> None:
    bare = build_pod()
    assert "runtimeClassName" not in bare["spec"]
    assert "ownerReferences" not in bare["metadata"]
    full = build_pod(config=full_config())
    assert full["spec"]["runtimeClassName"] == "gvisor"
    assert full["metadata"]["namespace"] == "sandboxes"
    assert container_of(full)["imagePullPolicy"] == "Always"
    (owner,) = full["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "acp-worker-0", OWNER_UID)
    assert owner["blockOwnerDeletion"] is False


def test_the_pod_carries_the_jobs_labels() -> None:
    spec = make_spec(job_id="Nightly:Build/7", labels={"acpw.owner": "b:4026531836:9:10"})
    config = KubernetesConfig(worker_id="w-from-config")
    metadata = build_pod(spec, config)["metadata"]
    exact = json.loads(metadata["annotations"][manifests.ANNOTATION_LABELS])
    assert exact[LABEL_JOB] == "Nightly:Build/7"
    assert exact[LABEL_ATTEMPT] == str(spec.attempt)
    assert exact[LABEL_TOKEN] == "0"  # no lease
    assert exact[LABEL_WORKER] == "w-from-config"
    assert exact["acpw.owner"] == "b:4026531836:9:10"
    assert set(metadata["labels"]) == set(exact)
    assert metadata["labels"][LABEL_ATTEMPT] == exact[LABEL_ATTEMPT]  # valid: kept
    assert metadata["labels"][LABEL_JOB] != exact[LABEL_JOB]  # invalid: encoded


def test_the_spec_cannot_unset_what_the_policies_select() -> None:
    spec = make_spec(labels={manifests.LABEL_BACKEND: "other", manifests.LABEL_NETWORK: "x"})
    labels = build_pod(spec)["metadata"]["labels"]
    assert labels[manifests.LABEL_BACKEND] == manifests.BACKEND_NAME
    assert labels[manifests.LABEL_NETWORK] == "none"


def test_the_pod_is_the_same_for_the_same_attempt() -> None:
    first, second = build_pod(), build_pod()
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert build_pod(make_spec(attempt=3))["metadata"]["name"] != first["metadata"]["name"]


@pytest.mark.parametrize(
    "image",
    [
        "acpw/pack:latest",
        "acpw/pack@sha256:" + "ab" * 31,
        "acpw/pack:v1@sha256:" + "ab" * 32,
        "ACPW/Pack@sha256:" + "ab" * 32,
        "acpw/pack@sha256:" + "AB" * 32,
        " acpw/pack@sha256:" + "ab" * 32,
    ],
)
def test_an_image_not_named_by_digest_is_refused(image: str) -> None:
    with pytest.raises(SandboxError, match="digest"):
        build_pod(image=image)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"deadline_s": 0}, "deadline"),
        ({"command": []}, "command"),
        ({"disk_bytes": 0}, "workspace size"),
    ],
)
def test_a_pod_without_a_bound_is_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(SandboxError, match=match):
        build_pod(**kw)


@pytest.mark.parametrize(
    "overrides",
    [
        {"network": "host"},
        {"extra_mounts": (ReadOnlyMount(Path("/etc"), "/host-etc"),)},
        {"state_mounts": (WritableMount(Path("/srv/s"), f"{HOME}/.cursor/s"),)},
        {"limits": ResourceLimits(memory_bytes=0, cpus=1, pids=8)},
    ],
)
def test_a_spec_a_pod_cannot_carry_is_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(SandboxError):
        build_pod(make_spec(**overrides))


def test_the_owner_pod_is_named_whole() -> None:
    with pytest.raises(ValidationError, match="together"):
        KubernetesConfig(k8s_owner_pod_name="acp-worker-0")
    with pytest.raises(ValidationError, match="together"):  # its namespace is needed too
        KubernetesConfig(k8s_owner_pod_name="acp-worker-0", k8s_owner_pod_uid=OWNER_UID)
    with pytest.raises(ValidationError):
        KubernetesConfig(k8s_namespace="Not_A_Namespace")


def test_kubernetes_is_selectable_now_its_backend_exists() -> None:
    parsed = TypeAdapter(BackendConfig).validate_python({"type": "kubernetes"})
    assert isinstance(parsed, KubernetesConfig)
    assert REGISTRY["kubernetes"].selectable
    assert isinstance(backend_config(Settings(), "kubernetes"), KubernetesConfig)


def test_the_config_reads_its_k8s_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACPW_K8S_NAMESPACE", "ns-from-env")
    monkeypatch.setenv("ACPW_K8S_RUNTIME_CLASS_NAME", "kata")
    monkeypatch.setenv("ACPW_K8S_PIDS_LIMIT_SUPPORTED", "true")
    config = KubernetesConfig()
    assert (config.k8s_namespace, config.k8s_runtime_class_name) == ("ns-from-env", "kata")
    assert config.k8s_pids_limit_supported is True


def test_an_owner_reference_across_namespaces_is_refused() -> None:
    """The garbage collector takes an owner in another namespace for an absent one and
    deletes the dependent at once: the config refuses it, and so does the pod builder
    (for a config that skipped validation)."""
    owner = {
        "k8s_owner_pod_name": "acp-worker-0",
        "k8s_owner_pod_uid": OWNER_UID,
        "k8s_owner_pod_namespace": "acp-system",
    }
    with pytest.raises(ValidationError, match="cannot cross namespaces"):
        KubernetesConfig(k8s_namespace="acp-sandboxes", **owner)
    unchecked = KubernetesConfig.model_construct(
        **(KubernetesConfig().model_dump() | owner | {"k8s_namespace": "acp-sandboxes"})
    )
    with pytest.raises(SandboxError, match="cannot cross namespaces"):
        build_pod(config=unchecked)
    same = KubernetesConfig(k8s_namespace="acp-system", **owner)
    assert build_pod(config=same)["metadata"]["ownerReferences"][0]["name"] == "acp-worker-0"


def test_placement_from_the_settings_lands_on_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = build_pod()["spec"]
    pod = build_pod(make_spec(network="allowlist"), placed_config(monkeypatch))
    spec, metadata = pod["spec"], pod["metadata"]
    assert spec["nodeSelector"] == {"acpw.example/sandbox": "true", "kubernetes.io/arch": "amd64"}
    assert spec["tolerations"] == json.loads(PLACEMENT_ENV["ACPW_K8S_TOLERATIONS"])
    assert spec["affinity"] == json.loads(PLACEMENT_ENV["ACPW_K8S_AFFINITY"])
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("gvisor", "acpw-sandboxes")
    assert spec["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert spec["serviceAccountName"] == "acpw-sandbox"
    assert spec["automountServiceAccountToken"] is False  # a service account, no token
    assert metadata["labels"]["team"] == "agents"
    assert metadata["labels"]["example.com/cost-center"] == "ai-7"
    assert metadata["annotations"]["example.com/owner"] == "platform team"
    # What the NetworkPolicies select is still the backend's.
    assert metadata["labels"][manifests.LABEL_BACKEND] == manifests.BACKEND_NAME
    assert metadata["labels"][manifests.LABEL_NETWORK] == "allowlist"
    placed = {"nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"}
    assert not placed & set(bare)
    assert "serviceAccountName" not in bare


def test_sandbox_pods_are_not_disrupted_by_autoscalers_by_default() -> None:
    annotations = build_pod()["metadata"]["annotations"]
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    off = build_pod(config=KubernetesConfig(k8s_disruption_annotations=False))
    assert "karpenter.sh/do-not-disrupt" not in off["metadata"]["annotations"]
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in off["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("k8s_node_selector", {"not a key": "x"}, "not a qualified name"),
        ("k8s_node_selector", {"disk": "ssd only"}, "not a label value"),
        ("k8s_pod_labels", {"acpw.job": "other"}, "backend's"),
        ("k8s_pod_labels", {"acpw.backend": "none"}, "backend's"),
        ("k8s_pod_labels", {"node-role.kubernetes.io/x": ""}, "Kubernetes' own"),
        ("k8s_pod_labels", {"team": "-bad-"}, "not a label value"),
        ("k8s_pod_labels", {"/x": "y"}, "not a qualified name"),
        ("k8s_pod_annotations", {"acpw.io/labels": "{}"}, "backend's"),
        ("k8s_pod_annotations", {"karpenter.sh/do-not-disrupt": "false"}, "disruption"),
        (
            "k8s_pod_annotations",
            {"container.apparmor.security.beta.kubernetes.io/agent": "unconfined"},
            "Kubernetes' own",
        ),
        ("k8s_pod_annotations", {"example.com/big": "x" * 70_000}, "bytes"),
        ("k8s_image_pull_secrets", ["Registry_Pull"], "DNS subdomain"),
        ("k8s_service_account_name", "Sandbox SA", "pattern"),
        ("k8s_priority_class_name", "-high", "pattern"),
        ("k8s_runtime_class_name", "gVisor", "pattern"),
        ("k8s_tolerations", [{"key": "a", "operator": "Exists", "value": "b"}], "no value"),
        ("k8s_tolerations", [{"operator": "Equal", "value": "b"}], "no key"),
        ("k8s_tolerations", [{"key": "a", "tolerationSeconds": 5}], "NoExecute"),
        ("k8s_tolerations", [{"key": "a", "effect": "NoRun"}], "effect"),
        ("k8s_tolerations", [{"key": "a", "tolerationSecond": 5}], "tolerationSecond"),
        ("k8s_tolerations", [{"key": "a b"}], "qualified name"),
        ("k8s_affinity", {"nodeAfinity": {}}, "nodeAfinity"),
        ("k8s_affinity", {"nodeAffinity": []}, "objects under"),
    ],
)
def test_bad_placement_values_are_refused(setting: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        KubernetesConfig(**{setting: value})


def test_bad_placement_from_the_environment_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chart's values arrive as JSON: the backend's config refuses a bad one when
    the worker starts, naming the variable's setting."""
    monkeypatch.setenv("ACPW_K8S_POD_LABELS", '{"acpw.network": "allowlist"}')
    with pytest.raises(InvalidSettings, match="ACPW_K8S_POD_LABELS") as refused:
        backend_config(Settings(), "kubernetes")
    assert refused.value.exit_code == 2


# -- network policies ---------------------------------------------------------------------


def test_policies_in_place_are_not_created_and_not_granted() -> None:
    """``k8s_network_policies=external`` (the chart renders them): the backend creates
    none, and its Role has no NetworkPolicy verb."""
    external = KubernetesConfig(k8s_network_policies="external")
    assert manifests.network_policies(external, PROXY) == []
    rules = manifests.role(external)["rules"]
    assert not [r for r in rules if "networkpolicies" in r["resources"]]
    assert len(rules) == len(manifests.RBAC_RULES) - 1


def test_none_pods_get_nothing_and_allowlist_pods_only_the_proxy() -> None:
    deny, proxy_only = manifests.network_policies(KubernetesConfig(), PROXY)
    none_pod = build_pod(make_spec(network="none"))["metadata"]["labels"]
    allow_pod = build_pod(make_spec(network="allowlist"))["metadata"]["labels"]
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not deny["spec"].get("ingress")
    assert not deny["spec"].get("egress")
    assert selects(deny, none_pod)
    assert selects(deny, allow_pod)
    assert not selects(proxy_only, none_pod)
    assert selects(proxy_only, allow_pod)
    assert proxy_only["spec"]["policyTypes"] == ["Egress"]
    (rule,) = proxy_only["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": PROXY.port}]  # no DNS (53)
    (peer,) = rule["to"]
    assert peer["podSelector"]["matchLabels"] == PROXY.pod_labels
    assert peer["namespaceSelector"]["matchLabels"] == PROXY.namespace_labels


def test_without_a_proxy_there_is_only_deny_all() -> None:
    (deny,) = manifests.network_policies(KubernetesConfig(), None)
    assert deny["metadata"]["name"] == manifests.DENY_ALL_POLICY


def test_a_proxy_in_the_sandbox_namespace_has_no_namespace_selector() -> None:
    peer = ProxyPeer(pod_labels={"app": "acpw-proxy"}, namespace_labels=None, port=8080)
    _, policy = manifests.network_policies(KubernetesConfig(), peer)
    (to,) = policy["spec"]["egress"][0]["to"]
    assert set(to) == {"podSelector"}


@pytest.mark.parametrize(
    "peer",
    [
        ProxyPeer(pod_labels={}, namespace_labels=None, port=3128),
        ProxyPeer(pod_labels={"app": "p"}, namespace_labels=None, port=0),
        ProxyPeer(pod_labels={"app": "p"}, namespace_labels=None, port=65536),
        ProxyPeer(pod_labels={"app": "not valid!"}, namespace_labels=None, port=3128),
        ProxyPeer(pod_labels={"app": "p"}, namespace_labels={"-bad": "x"}, port=3128),
    ],
)
def test_a_proxy_peer_that_would_match_too_much_or_nothing_is_refused(peer: ProxyPeer) -> None:
    with pytest.raises(SandboxError):
        manifests.network_policies(KubernetesConfig(), peer)


# -- config masks -------------------------------------------------------------------------


def test_config_masks_are_mounted_over_the_workspace() -> None:
    plan = [
        MaskEntry(PurePosixPath(".claude"), MaskKind.ANCHOR),
        MaskEntry(PurePosixPath(".claude/settings.json"), MaskKind.FILE),
        MaskEntry(PurePosixPath(".cursor/plugins"), MaskKind.DIR),
        MaskEntry(PurePosixPath(".cursor"), MaskKind.ANCHOR),
    ]
    pod = build_pod(masks=plan)
    mounts = {m["mountPath"]: m for m in container_of(pod)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    anchors = [mounts[f"{WORKSPACE}/.claude"], mounts[f"{WORKSPACE}/.cursor"]]
    # Each anchor is a writable volume of its own: a mount point, on disk, bounded.
    assert len({a["name"] for a in anchors}) == 2
    for anchor in anchors:
        assert not anchor.get("readOnly")
        assert volumes[anchor["name"]]["emptyDir"] == {
            "sizeLimit": str(KubernetesConfig().k8s_ephemeral_storage_bytes)
        }
    # A config file or directory: the one empty read-only volume, tiny and in memory.
    for path in (".claude/settings.json", ".cursor/plugins"):
        mount = mounts[f"{WORKSPACE}/{path}"]
        assert mount["readOnly"] is True
        assert mount["name"] == manifests.MASK_VOLUME
    assert volumes[manifests.MASK_VOLUME]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Ki"}
    # The workspace, HOME and /tmp are still there, first.
    assert [m["mountPath"] for m in container_of(pod)["volumeMounts"][:3]] == [
        WORKSPACE, HOME, "/tmp",
    ]  # fmt: skip


def test_without_masks_the_pod_has_no_mask_volumes() -> None:
    names = {v["name"] for v in build_pod()["spec"]["volumes"]}
    assert names == {"workspace", "home", "tmp"}


def test_every_mask_of_the_plan_is_mounted() -> None:
    plan = mask_plan(Path("/"))
    mounts = [m["mountPath"] for m in container_of(build_pod(masks=plan))["volumeMounts"]]
    assert mounts[3:] == [f"{WORKSPACE}/{e.path}" for e in plan]


# -- RBAC ---------------------------------------------------------------------------------


def test_the_role_grants_exactly_what_the_backend_needs() -> None:
    rules = manifests.role(KubernetesConfig())["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {
        *(("", "pods", v) for v in ("create", "get", "list", "delete")),
        ("", "pods", "patch"),  # a warm slot's pod relabelled to the attempt claiming it
        *(("", "pods/exec", v) for v in ("create", "get")),
        ("", "events", "list"),  # a failed scheduling or pull carries the pod's events
        ("networking.k8s.io", "networkpolicies", "create"),
    }
    assert granted == needed
    assert not any("*" in item for item in granted)


def test_the_binding_names_the_role_and_the_service_account() -> None:
    config = KubernetesConfig(k8s_namespace="sandboxes")
    role = manifests.role(config)
    binding = manifests.role_binding(
        config, service_account="acp-worker", service_account_namespace="acp-system"
    )
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == "sandboxes"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["roleRef"]["kind"] == "Role"  # never a ClusterRole
    (subject,) = binding["subjects"]
    assert (subject["kind"], subject["name"], subject["namespace"]) == (
        "ServiceAccount",
        "acp-worker",
        "acp-system",
    )


@pytest.mark.parametrize(("account", "namespace"), [("", "ns"), ("Bad_Name", "ns"), ("sa", "")])
def test_a_binding_to_an_invalid_name_is_refused(account: str, namespace: str) -> None:
    with pytest.raises(SandboxError):
        manifests.role_binding(
            KubernetesConfig(), service_account=account, service_account_namespace=namespace
        )


def _doc_rbac_rows() -> set[tuple[str, str, tuple[str, ...], str]]:
    text = (REPO / "docs" / "kubernetes.md").read_text()
    table = text.split("<!-- rbac-table -->", 2)[1]
    rows = set()
    for line in table.splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in {"API group", ""} or set(cells[0]) <= {"-", " "}:
            continue
        group = "" if cells[0] == "core" else cells[0]
        verbs = tuple(verb.strip().strip("`") for verb in cells[2].split(","))
        rows.add((group, cells[1], verbs, cells[3]))
    return rows


def test_the_docs_rbac_table_is_the_role() -> None:
    documented = _doc_rbac_rows()
    assert documented  # the markers are there and the table was read
    rules = manifests.RBAC_RULES
    assert documented == {(r.api_group, r.resource, r.verbs, r.why) for r in rules}


# -- schemas ------------------------------------------------------------------------------


def proxy_from_config() -> ProxyPeer | None:
    """The proxy peer the backend names from ``ACPW_K8S_PROXY_*``."""
    config = KubernetesConfig(
        k8s_proxy_address="10.0.0.7",
        k8s_proxy_pod_labels={"app.kubernetes.io/name": "acp-worker"},
        k8s_proxy_namespace_labels={"kubernetes.io/metadata.name": "acp-system"},
    )
    return PodNetwork(config).peer()


def every_manifest() -> dict[str, dict[str, Any]]:
    config, full = KubernetesConfig(), full_config()
    sandbox_local = ProxyPeer(pod_labels={"app": "acpw-proxy"}, namespace_labels=None, port=1)
    return {
        "pod": build_pod(),
        "pod-full": build_pod(make_spec(network="allowlist"), full, disk_bytes=1 << 30),
        "pod-hostile-id": build_pod(make_spec(job_id="a" * 100 + ":$(x)", attempt=10**6)),
        "pod-masked": build_pod(masks=mask_plan(Path("/"))),
        "pod-placed": build_pod(make_spec(network="allowlist"), placed_config()),
        "deny-all": manifests.network_policies(config, None)[0],
        "proxy-only": manifests.network_policies(full, PROXY)[1],
        "proxy-only-same-namespace": manifests.network_policies(config, sandbox_local)[1],
        "proxy-only-from-config": manifests.network_policies(full, proxy_from_config())[1],
        "role": manifests.role(full),
        "role-external-policies": manifests.role(KubernetesConfig(k8s_network_policies="external")),
        "role-binding": manifests.role_binding(
            full, service_account="acp-worker", service_account_namespace="acp-system"
        ),
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(every_manifest()))
def test_every_manifest_validates_against_the_kubernetes_schemas(name: str, version: str) -> None:
    manifest = every_manifest()[name]
    assert kubernetes_validate.validate(manifest, version, strict=True) == version


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_validator_refuses_a_misspelt_field(version: str) -> None:
    pod = build_pod()
    pod["spec"]["automountServiceAcountToken"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, version, strict=True)


def test_the_validator_works_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for version in K8S_VERSIONS:
        assert kubernetes_validate.validate(build_pod(), version, strict=True) == version


def test_the_newest_version_tested_is_bundled() -> None:
    assert kubernetes_validate.latest_version() >= K8S_VERSIONS[-1]


# -- what the double's requests need ---------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "needs"),
    [
        ("POST", "/api/v1/namespaces/ns/pods", {("", "pods", "create")}),
        ("GET", "/api/v1/namespaces/ns/pods", {("", "pods", "list")}),
        ("GET", "/api/v1/namespaces/ns/pods?watch", {("", "pods", "watch")}),
        ("GET", "/api/v1/namespaces/ns/pods/p", {("", "pods", "get")}),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", {("", "pods", "delete")}),
        (
            "GET",
            "/api/v1/namespaces/ns/pods/p/exec",
            {("", "pods/exec", "get"), ("", "pods/exec", "create")},
        ),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {("", "pods/log", "get")}),
        (
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
            {("networking.k8s.io", "networkpolicies", "create")},
        ),
        (
            "PATCH",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/x",
            {("networking.k8s.io", "networkpolicies", "patch")},
        ),
    ],
)
def test_each_request_needs_its_permission(method: str, path: str, needs: set[Any]) -> None:
    assert rbac.needed(method, path) == needs
    granted = {(r.api_group, r.resource, v) for r in manifests.RBAC_RULES for v in r.verbs}
    # The backend's calls are within the Role; what it never calls is outside it.
    within = not rbac.outside([(method, path)], granted)
    assert within is (path.endswith(("/pods", "/pods/p", "/exec", "/networkpolicies")))


def test_a_request_outside_a_namespace_is_not_mapped() -> None:
    with pytest.raises(ValueError, match="namespaced"):
        rbac.needed("GET", "/api/v1/nodes")
