"""The Helm chart (helm/acp-worker): rendered by Helm's own engine, linted, and every
manifest validated, across the value profiles an operator installs.

No cluster and no ``helm`` binary exist on these machines. ``helm-python-sdk`` binds
Helm v4's Go SDK (a shared library in the wheel): it renders templates and applies
``values.schema.json`` exactly as ``helm install``/``helm template`` do, and lints as
``helm lint`` does, offline. Built-in kinds are validated against the Kubernetes OpenAPI
schemas of 1.29 and 1.37 (``kubernetes-validate``, strict); the CRD kinds (ScaledObject,
ServiceMonitor, PrometheusRule) against the minimal hand-written JSON schemas in
tests/unit/fixtures/crds/ (each says what it covers). What is not tested here: the
one-node install run for real (tests/integration/test_chart_podman.py, `make
chart-podman`), a cluster, and the drain itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import REGISTRY
from pydantic import ValidationError

from worker import metrics
from worker.images.build import PinStore
from worker.images.identity import ImageIdentity, PinnedImage, PushedImage
from worker.sandbox.config import DockerConfig, KubernetesConfig
from worker.sandbox.kubernetes import manifests
from worker.sandbox.kubernetes.images import pack_image
from worker.sandbox.kubernetes.manifests import RBAC_RULES, ProxyPeer
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "acp-worker"
CRDS = Path(__file__).parent / "fixtures" / "crds"
K8S_VERSIONS = ("1.29", "1.37")
RELEASE, NAMESPACE = "acpw", "acp-system"
IMAGE = "registry.example:5000/acp/worker@sha256:" + "ab" * 32
REDIS_IMAGE = "docker.io/library/redis@sha256:" + "cd" * 32
BASE_IMAGE_ID = "sha256:" + "b" * 64
#: What every kubernetes-backend install needs: the pack images' pins.
PINS: dict[str, Any] = {
    "sandbox": {"kubernetes": {"images": {"baseImageId": BASE_IMAGE_ID, "pinsConfigMap": "pins"}}}
}
BASE: dict[str, Any] = {
    "image": {"ref": IMAGE},
    "redis": {"url": "redis://redis.example:6379/0"},
    **PINS,
}
#: The labels the API server sets on every namespace (NamespaceDefaultLabelName, 1.21+).
NAMESPACE_LABELS = {"kubernetes.io/metadata.name": NAMESPACE}
#: Every placement value of the sandbox pods.
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"acpw.example/sandbox": "true", "kubernetes.io/arch": "amd64"},
    "tolerations": [
        {"key": "acpw.example/sandbox", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 60,
        },
    ],
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["eu-west-1a"],
                            }
                        ]
                    },
                }
            ]
        }
    },
    "priorityClassName": "acpw-sandboxes",
    "imagePullSecrets": ["registry-pull"],
    "serviceAccountName": "acpw-sandbox",
    "labels": {"team": "agents"},
    "annotations": {"example.com/owner": "platform team"},
    "disruptionAnnotations": False,
}
CRD_SCHEMAS = {
    "ScaledObject": "scaledobject",
    "ServiceMonitor": "servicemonitor",
    "PrometheusRule": "prometheusrule",
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _single_node() -> dict[str, Any]:
    text = (CHART / "values-single-node.yaml").read_text(encoding="utf-8")
    return _merge(helm.values_from_yaml(text), BASE)


PROFILES: dict[str, dict[str, Any]] = {
    "default": BASE,
    "keda": _merge(
        BASE,
        {
            "autoscaling": {"keda": {"enabled": True}},
            "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        },
    ),
    "hpa": _merge(
        BASE, {"autoscaling": {"hpa": {"enabled": True}}, "workerNetworkPolicy": {"enabled": False}}
    ),
    "single-node": _single_node(),
    "dev-redis": {
        "image": {"ref": IMAGE},
        "devRedis": {"enabled": True, "image": REDIS_IMAGE},
        **PINS,
    },
    # Every value of the sandbox pods' placement, the backend creating the policies
    # itself, the worker's own policy narrowed, KEDA's fallback without behavior.
    "placement": _merge(
        BASE,
        {
            "sandbox": {
                "kubernetes": {
                    "runtimeClassName": "kata",
                    "pods": PLACEMENT,
                    "networkPolicies": {"enabled": False},
                    # A namespace of the operator's, their policy enforcing restricted.
                    "createNamespace": False,
                    "podSecurity": {"external": True},
                }
            },
            "workerNetworkPolicy": {
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                "redis": {"ports": [6380], "to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
                "external": {"ports": [443, 8443], "to": []},
                "extraEgress": [{"ports": [{"protocol": "TCP", "port": 22}]}],
                "apiServer": {"ports": [443], "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}]},
                "dns": {
                    "ports": [53],
                    "to": [{"namespaceSelector": {"matchLabels": NAMESPACE_LABELS}}],
                },
                "extraIngress": [{"ports": [{"protocol": "TCP", "port": 8080}]}],
            },
            "autoscaling": {"keda": {"enabled": True, "fallback": {"replicas": 4, "behavior": ""}}},
            "metrics": {"prometheusRule": {"enabled": True, "sandboxPendingFor": "5m"}},
        },
    ),
    "sandbox-namespace": _merge(
        BASE,
        {
            "redis": {
                "url": "",
                "existingSecret": "acpw-redis",
                "existingSecretKeys": {"brokerUrl": "broker"},
            },
            "sandbox": {
                "kubernetes": {
                    "namespace": NAMESPACE,
                    "createNamespace": True,
                    "ownerReferences": True,
                    "runtimeClassName": "gvisor",
                    "images": {
                        "baseImageId": "sha256:" + "b" * 64,
                        "pinsConfigMap": "",
                        "pins": {"c" * 64 + ".json": '{"image_id": "sha256:' + "e" * 64 + '"}'},
                    },
                    "networkPolicies": {
                        "proxy": {
                            "enabled": True,
                            "podLabels": {"app.kubernetes.io/name": "acp-egress-proxy"},
                            "namespaceLabels": {"kubernetes.io/metadata.name": "acp-proxy"},
                        }
                    },
                }
            },
        },
    ),
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values`` (release acpw in acp-system)."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(docs, kind)
    return found


def worker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [
        d for d in by_kind(docs, "Deployment") if "dev-redis" not in d["metadata"]["name"]
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        entry["name"]: entry.get("value", entry.get("valueFrom"))
        for entry in worker_container(docs)["env"]
    }


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in PROFILES.items()}


# --- rendering, lint, validation ---------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_lints_without_errors_or_warnings(profile: str) -> None:
    report = helm.lint(CHART, PROFILES[profile], namespace=NAMESPACE, kube_version="v1.29.0")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert serious == [], serious


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_built_in_manifest_validates_strictly(
    rendered: dict[str, list[dict[str, Any]]], profile: str, version: str
) -> None:
    built_in = [doc for doc in rendered[profile] if doc["kind"] not in CRD_SCHEMAS]
    assert {"Deployment", "Service", "ServiceAccount"} <= {doc["kind"] for doc in built_in}
    for doc in built_in:
        assert kubernetes_validate.validate(doc, version, strict=True) == version, doc["kind"]


def _crds(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    for docs in rendered.values():
        yield from (doc for doc in docs if doc["kind"] in CRD_SCHEMAS)


def test_crd_kinds_validate_against_their_schemas(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    seen = set()
    for doc in _crds(rendered):
        schema = json.loads((CRDS / f"{CRD_SCHEMAS[doc['kind']]}.schema.json").read_text())
        jsonschema.validate(doc, schema)
        seen.add(doc["kind"])
    assert seen == set(CRD_SCHEMAS)


def test_a_crd_schema_refuses_a_misplaced_field(rendered: dict[str, list[dict[str, Any]]]) -> None:
    scaled = one(rendered["keda"], "ScaledObject")
    scaled["spec"]["minReplicas"] = 1  # HPA's spelling, not KEDA's
    schema = json.loads((CRDS / "scaledobject.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, schema)


# --- bad values fail at install time with the schema's (or the chart's) message ---------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_merge(BASE, {"image": {"ref": "registry.example/acp/worker:1.2.3"}}), "/image/ref"),
        (_merge(BASE, {"image": {"ref": IMAGE.replace("@", ":1.2.3@")}}), "/image/ref"),
        ({"redis": BASE["redis"]}, "at '/image/ref': '' does not match pattern"),
        (_merge(BASE, {"replicas": -1}), "/replicas"),
        (_merge(BASE, {"concurrency": 0}), "/concurrency"),
        (_merge(BASE, {"sandbox": {"backend": "daytona"}}), "/sandbox/backend"),
        (_merge(BASE, {"replica": 3}), "additional properties 'replica' not allowed"),
        (
            _merge(BASE, {"autoscaling": {"keda": {"enabled": True, "minReplicas": 0}}}),
            "/autoscaling/keda/minReplicas",
        ),
        (_merge(BASE, {"devRedis": {"enabled": True, "image": "redis:7"}}), "/devRedis/image"),
        (
            _merge(BASE, {"sandbox": {"docker": {"workHostPath": "jobs"}}}),
            "/sandbox/docker/workHostPath",
        ),
        (_merge(BASE, {"extraVolumeMounts": [{"name": "packs"}]}), "/extraVolumeMounts/0"),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"images": {"baseImageId": "abc"}}}}),
            "/sandbox/kubernetes/images/baseImageId",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"images": {"pins": {"x.json": "{}"}}}}}),
            "'x.json' does not match pattern",
        ),
    ],
)
def test_bad_values_fail_with_the_schemas_message(values: dict[str, Any], message: str) -> None:
    with (
        helm.Chart.load(CHART) as chart,
        pytest.raises(helm.HelmValuesError, match=re.escape(message)),
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"image": {"ref": IMAGE}}, "set redis.url, redis.existingSecret, or devRedis.enabled"),
        (
            _merge(BASE, {"drain": {"graceSeconds": 950}}),
            "drain.terminationGracePeriodSeconds (960) must be at least 970",
        ),
        (
            _merge(BASE, {"env": {"ACPW_CANCEL_GRACE": "60"}}),
            "drain.terminationGracePeriodSeconds (960) must be at least 970",
        ),
        (
            _merge(BASE, {"autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}}),
            "are exclusive",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"ownerReferences": True}}}),
            "owner references cannot cross namespaces",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"images": {"baseImageId": ""}}}}),
            "pins need .baseImageId",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"images": {"pinsConfigMap": ""}}}}),
            "the kubernetes backend needs its pack images' pins, or no job can run",
        ),
        (
            {"image": {"ref": IMAGE}, "redis": BASE["redis"]},
            "set sandbox.kubernetes.images.baseImageId",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"createNamespace": False}}}),
            "must enforce Pod Security `restricted`",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"podSecurity": {"level": "baseline"}}}}),
            "podSecurity.external=true",
        ),
        (
            _merge(
                BASE,
                {
                    "sandbox": {
                        "kubernetes": {
                            "images": {
                                "baseImageId": "sha256:" + "0" * 64,
                                "pinsConfigMap": "pins",
                                "pins": {"0" * 64 + ".json": "{}"},
                            }
                        }
                    }
                },
            ),
            "are exclusive: give the pin files one way",
        ),
        (
            _merge(BASE, {"sandbox": {"kubernetes": {"copyOutMaxGi": 10}}}),
            "stateVolume.sizeLimit (20Gi) must hold twice sandbox.kubernetes.copyOutMaxGi (10 Gi",
        ),
        (
            _merge(BASE, {"stateVolume": {"sizeLimit": "8G"}}),
            'stateVolume.sizeLimit "8G": give it in Mi, Gi or Ti',
        ),
    ],
)
def test_inconsistent_values_fail_with_the_charts_message(
    values: dict[str, Any], message: str
) -> None:
    with (
        helm.Chart.load(CHART) as chart,
        pytest.raises(helm.HelmRenderError, match=re.escape(message)),
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(
    ("values", "bound"),
    [
        ({}, 8 * 2**30),  # the default: 8 Gi of the default 20Gi state volume
        (
            {"stateVolume": {"sizeLimit": "1Ti"}, "sandbox": {"kubernetes": {"copyOutMaxGi": 500}}},
            500 * 2**30,
        ),
        (
            {
                "stateVolume": {"sizeLimit": "20480Mi"},
                "sandbox": {"kubernetes": {"copyOutMaxGi": 9}},
            },
            9 * 2**30,
        ),
    ],
)
def test_the_copy_out_bound_fits_the_state_volume(values: dict[str, Any], bound: int) -> None:
    """The worker's copy-out bound reaches it, sized against its state volume (where the
    copy-outs spool), so a copy-out past it fails one job instead of the kubelet evicting
    the worker pod with every job on it."""
    docs = render(_merge(BASE, values))
    assert env_of(docs)["ACPW_K8S_COPY_OUT_MAX_BYTES"] == str(bound)
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    state = next(v for v in volumes if v["name"] == "state")
    assert state["emptyDir"]["sizeLimit"] == (values.get("stateVolume") or {}).get(
        "sizeLimit", "20Gi"
    )


def test_the_values_schema_is_draft_07() -> None:
    """Draft-07, which Helm 3 before 3.18 (gojsonschema) validates too, not only Helm 4."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    with helm.Chart.load(CHART) as chart:  # Helm validates the values merged with defaults
        merged = chart.merge_values(PROFILES["keda"])
    jsonschema.Draft7Validator(schema).validate(merged)


def test_the_schema_takes_digests_as_the_kubernetes_backend_does() -> None:
    """One rule for "named by digest": the schema's pattern is manifests' own."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert (
        schema["properties"]["image"]["properties"]["ref"]["pattern"]
        == manifests._DIGEST_REF.pattern
    )


# --- the worker Deployment ---------------------------------------------------------------


def test_the_worker_runs_serve_from_the_digest_hardened(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    container = worker_container(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert container["image"] == IMAGE
    assert container["args"][:3] == ["serve", "--concurrency", "2"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # Liveness is the process alone; readiness its dependencies (both on the metrics port,
    # served by serve itself: tests/integration/test_service.py runs them through a Redis
    # outage).
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9464}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 9464}
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 9464)
    assert "--metrics-port" in container["args"]
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/var/lib/acp-worker",
        "/tmp",
        "/etc/acp-worker/images/pins",
    }


def test_drain_grace_is_set_from_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["default"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 960
    assert env_of(docs)["ACPW_DRAIN_GRACE_S"] == "900"


def test_warm_pools_are_off_by_default_and_rendered_when_set(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "ACPW_WARM_POOLS" not in env_of(rendered["default"])
    docs = render(_merge(BASE, {"warmPools": {"slots": {"cursor": 2}, "maxIdleSeconds": 120}}))
    env = env_of(docs)
    monkeypatch.setenv("ACPW_WARM_POOLS", env["ACPW_WARM_POOLS"])
    monkeypatch.setenv("ACPW_WARM_MAX_IDLE_S", env["ACPW_WARM_MAX_IDLE_S"])
    settings = Settings()
    assert (settings.warm_pools, settings.warm_max_idle_s) == ({"cursor": 2}, 120.0)


def test_the_settings_the_chart_sets_are_the_workers(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every plain ACPW_* value the kubernetes profile sets parses into Settings and
    KubernetesConfig."""
    env = env_of(rendered["sandbox-namespace"])
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("ACPW_K8S_OWNER_POD_NAME", "acpw-acp-worker-0")
    monkeypatch.setenv("ACPW_K8S_OWNER_POD_UID", "0f6c1e0a-3b3e-4a59-9d7e-2a1c0de1f00d")
    monkeypatch.setenv("ACPW_K8S_OWNER_POD_NAMESPACE", NAMESPACE)
    settings = Settings()
    assert (settings.backend, settings.reap_backends, settings.queue) == (
        "kubernetes",
        ("kubernetes",),
        "runs",
    )
    config = KubernetesConfig()
    assert (config.k8s_namespace, config.k8s_runtime_class_name) == (NAMESPACE, "gvisor")
    assert config.k8s_base_image_id == "sha256:" + "b" * 64
    assert config.images_dir == Path("/etc/acp-worker/images")
    assert config.k8s_ephemeral_storage_bytes == 10 * 1024**3
    assert env["ACPW_K8S_OWNER_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["ACPW_K8S_OWNER_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # allowlist: the pods reach the worker's proxy at its pod IP, on the policy's port.
    assert env["ACPW_K8S_PROXY_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    policies = by_kind(rendered["sandbox-namespace"], "NetworkPolicy")
    [proxy_only] = [p for p in policies if p["metadata"]["name"] == "acpw-sandbox-proxy-only"]
    assert config.k8s_proxy_port == proxy_only["spec"]["egress"][0]["ports"][0]["port"]
    assert env["ACPW_REDIS_URL"] == {"secretKeyRef": {"name": "acpw-redis", "key": "redis-url"}}
    assert env["ACPW_BROKER_URL"] == {"secretKeyRef": {"name": "acpw-redis", "key": "broker"}}


def test_single_node_uses_the_nodes_engine(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered["single-node"]
    env = env_of(docs)
    monkeypatch.setenv("ACPW_DOCKER_HOST", env["ACPW_DOCKER_HOST"])
    assert DockerConfig().docker_host == "unix:///var/run/docker.sock"
    assert (env["ACPW_BACKEND"], env["ACPW_REAP_BACKENDS"]) == ("docker", '["docker"]')
    kinds = {doc["kind"] for doc in docs}
    assert not kinds & {"Role", "RoleBinding", "PodDisruptionBudget"}
    assert not sandbox_policies(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["docker-socket"] == {
        "name": "docker-socket",
        "hostPath": {"path": "/var/run/docker.sock", "type": "Socket"},
    }


def test_single_node_gives_the_docker_backend_the_node_view_it_needs(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """What tests/integration/test_chart_podman.py found a job needs: workspaces at the
    node's own path (the engine bind-mounts them by it), the node's pids and cgroups (the
    admission view, the lease watchdog), a writable /run/acp-worker (the watchdogs'
    deadline files) and root with the capabilities for these only."""
    docs = rendered["single-node"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in worker_container(docs)["volumeMounts"]}
    assert pod["hostPID"] is True
    work = "/var/lib/acp-worker-jobs"
    assert volumes["docker-work"]["hostPath"] == {"path": work, "type": "DirectoryOrCreate"}
    assert mounts["docker-work"]["mountPath"] == work
    assert env_of(docs)["ACPW_WORK_DIR"] == f"{work}/work"
    assert volumes["host-cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert mounts["host-cgroup"] == {
        "name": "host-cgroup",
        "mountPath": "/sys/fs/cgroup",
        "readOnly": True,
    }
    assert mounts["run"]["mountPath"] == "/run/acp-worker"
    assert "emptyDir" in volumes["run"]
    security = worker_container(docs)["securityContext"]
    assert (security["runAsUser"], security["readOnlyRootFilesystem"]) == (0, True)
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SYS_PTRACE"],
    }
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False


def test_only_the_docker_backend_gets_the_node_view(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    pod = one(rendered["default"], "Deployment")["spec"]["template"]["spec"]
    assert "hostPID" not in pod
    assert all("hostPath" not in volume for volume in pod["volumes"])


def test_extra_volumes_are_mounted_in_the_worker() -> None:
    docs = render(
        _merge(
            BASE,
            {
                "extraVolumes": [{"name": "packs", "persistentVolumeClaim": {"claimName": "p"}}],
                "extraVolumeMounts": [{"name": "packs", "mountPath": "/packs", "readOnly": True}],
            },
        )
    )
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "packs", "persistentVolumeClaim": {"claimName": "p"}} in pod["volumes"]
    mount = {"name": "packs", "mountPath": "/packs", "readOnly": True}
    assert mount in worker_container(docs)["volumeMounts"]


def test_the_dev_redis_is_off_by_default_and_wired_when_on(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    assert not [d for d in rendered["default"] if "dev-redis" in d["metadata"]["name"]]
    docs = rendered["dev-redis"]
    redis_deployment = next(
        d for d in by_kind(docs, "Deployment") if "dev-redis" in d["metadata"]["name"]
    )
    assert redis_deployment["spec"]["replicas"] == 1
    assert env_of(docs)["ACPW_REDIS_URL"] == "redis://acpw-acp-worker-dev-redis:6379/0"
    assert not by_kind(docs, "Secret")


# --- the pack images' pins (kubernetes backend) ---------------------------------------------


def _pinned(tmp_path: Path) -> tuple[ImageIdentity, PinnedImage, Path]:
    """A pin as `acp-worker image build` writes it for a pushed pack image, and the pack
    cache's closure it is for."""
    closure = tmp_path / "cache" / "closures" / ("c" * 64)
    closure.mkdir(parents=True)
    identity = ImageIdentity("sha256:" + "b" * 64, "sha256:" + "c" * 64)
    pushed = PushedImage(
        "registry.example:5000/acpw-pack", identity.tag.rpartition(":")[2], "sha256:" + "d" * 64
    )
    pin = PinnedImage(identity, "sha256:" + "e" * 64, pushed)
    PinStore(tmp_path / "built" / "pins").write(pin)
    return identity, pin, closure


def test_the_charts_pins_are_what_the_backend_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pin file `image build` wrote, given to the chart, mounted as the kubelet
    mounts a ConfigMap, finds the pushed pack image with no engine (`pack_image`)."""
    identity, pin, closure = _pinned(tmp_path)
    (written,) = (tmp_path / "built" / "pins").iterdir()
    images = {
        "baseImageId": identity.base_id,
        "pins": {written.name: written.read_text()},
        "pinsConfigMap": "",
    }
    docs = render(_merge(BASE, {"sandbox": {"kubernetes": {"images": images}}}))
    env, container = env_of(docs), worker_container(docs)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "image-pins"]
    assert mount["readOnly"] is True
    assert mount["mountPath"] == env["ACPW_IMAGES_DIR"] + "/pins"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "image-pins"]
    (config_map,) = [
        d
        for d in by_kind(docs, "ConfigMap")
        if d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    # The kubelet's projection: one file per key, under the mount path.
    mounted = tmp_path / env["ACPW_IMAGES_DIR"].lstrip("/") / "pins"
    mounted.mkdir(parents=True)
    for name, content in config_map["data"].items():
        (mounted / name).write_text(content)
    monkeypatch.setenv("ACPW_K8S_BASE_IMAGE_ID", env["ACPW_K8S_BASE_IMAGE_ID"])
    monkeypatch.setenv("ACPW_IMAGES_DIR", str(mounted.parent))
    config = KubernetesConfig(cache_dir=tmp_path / "cache")
    assert pin.pushed is not None
    assert pack_image(config, closure, None) == pin.pushed.reference


def test_an_existing_pins_config_map_is_mounted_not_made() -> None:
    images = {"baseImageId": "sha256:" + "b" * 64, "pinsConfigMap": "my-pins"}
    docs = render(_merge(BASE, {"sandbox": {"kubernetes": {"images": images}}}))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "image-pins", "configMap": {"name": "my-pins"}} in pod["volumes"]
    assert not [d for d in by_kind(docs, "ConfigMap") if "pins" in d["metadata"]["name"]]


def test_other_backends_need_no_pin_store(rendered: dict[str, list[dict[str, Any]]]) -> None:
    env = env_of(rendered["single-node"])
    assert "ACPW_K8S_BASE_IMAGE_ID" not in env
    assert "ACPW_IMAGES_DIR" not in env


# --- RBAC and the sandbox namespace --------------------------------------------------------


def config_of(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> KubernetesConfig:
    """The backend's config from the worker's rendered environment (plain values)."""
    for name, value in env_of(docs).items():
        if isinstance(value, str) and name.startswith("ACPW_K8S_"):
            monkeypatch.setenv(name, value)
    return KubernetesConfig()


@pytest.mark.parametrize("profile", ["default", "placement"])
def test_the_role_has_exactly_the_backends_rules(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    """The Role is ``manifests.role`` of the worker's own config: without NetworkPolicy
    create when the chart renders the policies (default), with it when the backend makes
    them (``networkPolicies.enabled: false``)."""
    docs = rendered[profile]
    role = one(docs, "Role")
    config = config_of(docs, monkeypatch)
    assert role["rules"] == manifests.role(config)["rules"]
    policy_verbs = [r for r in role["rules"] if r["resources"] == ["networkpolicies"]]
    renders_policies = bool(sandbox_policies(docs))
    assert config.k8s_network_policies == ("external" if renders_policies else "create")
    assert bool(policy_verbs) is not renders_policies
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([rule.api_group], [rule.resource], list(rule.verbs))
        for rule in RBAC_RULES
        if not (renders_policies and rule.resource == "networkpolicies")
    ]
    assert role["metadata"]["namespace"] == "acp-sandboxes"
    assert not [d for d in docs if d["kind"].startswith("Cluster")]


def test_the_role_is_bound_to_the_workers_service_account(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["default"]
    binding = one(docs, "RoleBinding")
    account = one(docs, "ServiceAccount")["metadata"]
    expected = manifests.role_binding(
        KubernetesConfig(k8s_namespace="acp-sandboxes"),
        service_account=account["name"],
        service_account_namespace=account["namespace"],
    )
    assert (binding["roleRef"], binding["subjects"]) == (expected["roleRef"], expected["subjects"])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]


def sandbox_policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in by_kind(docs, "NetworkPolicy")
        if d["metadata"]["name"].startswith("acpw-sandbox-")
    ]


def test_network_policies_are_the_backends(rendered: dict[str, list[dict[str, Any]]]) -> None:
    config = KubernetesConfig(k8s_namespace=NAMESPACE)
    proxy = ProxyPeer(
        pod_labels={"app.kubernetes.io/name": "acp-egress-proxy"},
        namespace_labels={"kubernetes.io/metadata.name": "acp-proxy"},
        port=3128,
    )
    assert sandbox_policies(rendered["sandbox-namespace"]) == manifests.network_policies(
        config, proxy
    )
    default_config = KubernetesConfig(k8s_namespace="acp-sandboxes")
    workers = ProxyPeer(
        pod_labels={
            "app.kubernetes.io/name": "acp-worker",
            "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": "worker",
        },
        namespace_labels=NAMESPACE_LABELS,
        port=3128,
    )
    assert sandbox_policies(rendered["default"]) == manifests.network_policies(
        default_config, workers
    )
    assert not sandbox_policies(rendered["placement"])  # the backend makes them there


@pytest.mark.parametrize("profile", ["default", "sandbox-namespace"])
def test_the_sandbox_namespace_enforces_restricted(
    rendered: dict[str, list[dict[str, Any]]], profile: str
) -> None:
    namespace = one(rendered[profile], "Namespace")
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    assert namespace["metadata"]["name"] == one(rendered[profile], "Role")["metadata"]["namespace"]


def test_an_external_pod_security_policy_is_the_operators_word() -> None:
    """Without the chart's namespace the install goes on only when the operator says a
    policy of theirs enforces ``restricted`` (the refusal: test_inconsistent_values…)."""
    external = {"createNamespace": False, "podSecurity": {"external": True}}
    docs = render(_merge(BASE, {"sandbox": {"kubernetes": external}}))
    assert not by_kind(docs, "Namespace")
    assert one(docs, "Role")["metadata"]["namespace"] == "acp-sandboxes"


# --- scaling -------------------------------------------------------------------------------


def test_keda_scales_on_queued_plus_running_per_concurrency(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["keda"]
    scaled = one(docs, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert "acpw_queue_depth" in query
    assert "acpw_jobs_running" in query
    assert trigger["metadata"]["threshold"] == "2"  # concurrency: jobs per replica
    # A query with no sample is an error, never a zero backlog: KEDA holds the fallback,
    # the current count when that is higher, so an outage never scales the pool in.
    assert "ignoreNullValues" not in trigger["metadata"]
    assert trigger["metricType"] == "AverageValue"  # what KEDA's fallback works with
    assert scaled["spec"]["fallback"] == {
        "failureThreshold": 3,
        "replicas": 2,
        "behavior": "currentReplicasIfHigher",
    }
    other = one(rendered["placement"], "ScaledObject")["spec"]["fallback"]
    assert other == {"failureThreshold": 3, "replicas": 4}
    assert scaled["spec"]["minReplicaCount"] >= 1
    assert "replicas" not in one(docs, "Deployment")["spec"]  # the autoscaler owns it


def test_the_hpa_fallback_uses_the_same_signal(rendered: dict[str, list[dict[str, Any]]]) -> None:
    hpa = one(rendered["hpa"], "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "acpw_backlog"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "2"}
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}
    ]


def test_a_pdb_guards_the_workers(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pdb = one(rendered["default"], "PodDisruptionBudget")
    pod_labels = one(rendered["default"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


# --- observability: every metric a query names is one the worker exports ---------------------

_METRIC = re.compile(r"\bacpw_[a-z0-9_]+\b")
_PHASE = re.compile(r'phase="([a-z_]+)"')


def exported_series() -> set[str]:
    """Every series name worker/metrics.py exports: counters' ``_total``, histograms'
    ``_bucket``/``_count``/``_sum``, and the backlog gauges."""
    names: set[str] = set()
    for collector in [
        *REGISTRY._collector_to_names,
        metrics.BacklogCollector(lambda: metrics.Backlog(0, 0, 0)),
    ]:
        for family in collector.collect():
            if not family.name.startswith("acpw_"):
                continue
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
            names |= {family.name + suffix for suffix in suffixes.get(family.type, [""])}
    return names


#: Metrics of other components the alerts name, and who exports them.
EXTERNAL_SERIES = {
    "keda_scaled_object_errors_total": "the KEDA operator (2.14+)",
    "kube_pod_status_phase": "kube-state-metrics",
}
_EXTERNAL = re.compile(r"\b(?:keda|kube)_[a-z0-9_]+\b")


def _queries(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    queries: dict[str, str] = {}
    for group in one(rendered["keda"], "PrometheusRule")["spec"]["groups"]:
        queries |= {f"alert {rule['alert']}": rule["expr"] for rule in group["rules"]}
    dashboard = json.loads(one(rendered["default"], "ConfigMap")["data"]["acp-worker.json"])
    for panel in dashboard["panels"]:
        queries |= {f"panel {panel['title']} {t['refId']}": t["expr"] for t in panel["targets"]}
    queries["keda"] = one(rendered["keda"], "ScaledObject")["spec"]["triggers"][0]["metadata"][
        "query"
    ]
    return queries


def test_every_query_names_metrics_the_worker_exports(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    exported = exported_series()
    assert {"acpw_jobs_total", "acpw_job_duration_seconds_bucket", "acpw_queue_depth"} <= exported
    queries = _queries(rendered)
    assert len(queries) > 15
    for where, expr in queries.items():
        named = set(_METRIC.findall(expr))
        external = set(_EXTERNAL.findall(expr))
        assert named or external, f"{where} names no metric: {expr}"
        assert named <= exported, f"{where} names {named - exported}, not exported"
        assert external <= set(EXTERNAL_SERIES), f"{where} names {external}"


def test_phase_labels_in_queries_are_phases_the_worker_marks(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    marked = {
        match
        for path in (REPO / "worker").rglob("*.py")
        for match in re.findall(r'mark\("([a-z_]+)"\)', path.read_text(encoding="utf-8"))
    }
    phases = {phase for expr in _queries(rendered).values() for phase in _PHASE.findall(expr)}
    assert phases == {"sandbox_create"}
    assert phases <= marked


def test_the_alerts_and_the_dashboard_cover_the_issue(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    alerts = {
        rule["alert"]
        for rule in one(rendered["keda"], "PrometheusRule")["spec"]["groups"][0]["rules"]
    }
    assert {
        "ACPWorkerQueueBackingUp",
        "ACPWorkerJobsLost",
        "ACPWorkerReaperFailing",
        "ACPWorkerSandboxStartSlow",
        "ACPWorkerMetricsAbsent",
        "ACPWorkerAutoscalerErrors",
        "ACPWorkerSandboxPodsPending",
    } <= alerts
    configmap = one(rendered["default"], "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    titles = " ".join(
        p["title"] for p in json.loads(configmap["data"]["acp-worker.json"])["panels"]
    )
    for topic in (
        "status",
        "Queue depth",
        "running",
        "Job duration",
        "Phase durations",
        "Sandbox start",
        "Events",
        "Leases lost",
        "Reaper",
    ):
        assert topic in titles
    service_monitor = one(rendered["keda"], "ServiceMonitor")
    service = one(rendered["keda"], "Service")
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )


# --- a default install that runs a model-talking job on a policy-enforcing CNI -------------


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector as the API evaluates it: matchLabels and matchExpressions ANDed;
    an empty selector matches everything (apimachinery's LabelSelectorAsSelector)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def peer_admits(
    peer: dict[str, Any], policy_namespace: str, pod: dict[str, str], pod_namespace: str
) -> bool:
    """Whether a NetworkPolicyPeer covers a pod: a podSelector alone means pods of the
    policy's namespace; with a namespaceSelector, pods of the namespaces it selects
    (NetworkPolicy's documented semantics). No ipBlock peers here."""
    assert "ipBlock" not in peer
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": pod_namespace}
        if not selector_matches(peer["namespaceSelector"], namespace_labels):
            return False
    elif pod_namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector"), pod)


def rule_allows(rule: dict[str, Any], key: str, port: int, pod: dict[str, str], ns: str) -> bool:
    """One ingress/egress rule: its ports (none: all) and its peers (none: everyone)."""
    ports = rule.get("ports")
    if ports and not any(p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports):
        return False
    peers = rule.get(key)
    return not peers or any(peer_admits(p, rule["_namespace"], pod, ns) for p in peers)


def allows(policy: dict[str, Any], direction: str, port: int, pod: dict[str, str], ns: str) -> bool:
    key = "to" if direction == "egress" else "from"
    rules = policy["spec"].get(direction, [])
    namespace = policy["metadata"]["namespace"]
    return any(rule_allows(r | {"_namespace": namespace}, key, port, pod, ns) for r in rules)


def selected(policy: dict[str, Any], pod: dict[str, str], namespace: str) -> bool:
    return policy["metadata"]["namespace"] == namespace and selector_matches(
        policy["spec"]["podSelector"], pod
    )


def allowlist_pod(config: KubernetesConfig) -> dict[str, Any]:
    """An allowlist job's sandbox pod as the backend builds it from the chart's config."""
    from worker.sandbox.base import ResourceLimits, SandboxSpec

    spec = SandboxSpec(
        job_id="job-1",
        attempt=1,
        workspace=Path("/nonexistent"),
        pack_closure=Path("/nonexistent"),
        limits=ResourceLimits(memory_bytes=1 << 30, cpus=1, pids=256),
        network="allowlist",
        labels={},
    )
    image = "registry.example/acpw-pack@sha256:" + "ab" * 32
    return manifests.sandbox_pod(
        spec, image=image, config=config, command=["sleep", "1"], deadline_s=600
    )


@pytest.mark.parametrize("release_namespace", [NAMESPACE, "acp-sandboxes"])
def test_the_default_policies_let_an_allowlist_pod_reach_its_worker_and_nothing_else(
    release_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluated as a policy-enforcing CNI does: the sandbox pod of an allowlist job
    (built by the backend from the worker's rendered settings) may send to the worker
    pods (the Deployment's own template labels, in the release namespace) on the port
    the worker listens on, and the worker's own policy lets it in; a `none` pod and every
    other destination stay denied. The release in another namespace and in the sandbox
    namespace itself."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(BASE, name=RELEASE, namespace=release_namespace, is_install=True)
    docs = [d for path, text in rendered.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip
    config = config_of(docs, monkeypatch)
    env = env_of(docs)
    worker = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    sandbox = allowlist_pod(config)
    sandbox_labels, sandbox_ns = sandbox["metadata"]["labels"], sandbox["metadata"]["namespace"]
    listen = int(env["ACPW_K8S_PROXY_PORT"])
    policies = {d["metadata"]["name"]: d for d in by_kind(docs, "NetworkPolicy")}
    deny, proxy = policies["acpw-sandbox-deny-all"], policies["acpw-sandbox-proxy-only"]
    own = policies[f"{RELEASE}-acp-worker"]

    assert selected(deny, sandbox_labels, sandbox_ns)
    assert selected(proxy, sandbox_labels, sandbox_ns)
    assert allows(proxy, "egress", listen, worker, release_namespace)
    assert not allows(proxy, "egress", listen + 1, worker, release_namespace)
    assert not allows(proxy, "egress", listen, {"app": "other"}, release_namespace)
    assert not allows(proxy, "egress", listen, worker, "elsewhere")
    none_pod = sandbox_labels | {manifests.LABEL_NETWORK: "none"}
    assert not selected(proxy, none_pod, sandbox_ns)  # deny-all alone: isolated
    assert selected(own, worker, release_namespace)
    assert allows(own, "ingress", listen, sandbox_labels, sandbox_ns)
    assert not allows(own, "ingress", listen, none_pod, sandbox_ns)
    assert allows(own, "ingress", 9464, {"app": "prometheus"}, "monitoring")  # /metrics
    # The worker reaches Redis, the API server and DNS.
    for port in (6379, 443, 53):
        assert allows(own, "egress", port, {"any": "pod"}, "anywhere")


def test_the_workers_policy_follows_its_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    own = next(
        d
        for d in by_kind(rendered["placement"], "NetworkPolicy")
        if d["metadata"]["name"] == "acpw-acp-worker"
    )
    ingress, egress = own["spec"]["ingress"], own["spec"]["egress"]
    assert ingress[0]["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    redis = [r for r in egress if r.get("to") == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]]
    assert [p["port"] for p in redis[0]["ports"]] == [6380]
    assert {"ports": [{"protocol": "TCP", "port": 22}]} in egress
    dns = [r for r in egress if {"protocol": "UDP", "port": 53} in r["ports"]]
    assert {"protocol": "TCP", "port": 53} in dns[0]["ports"]
    assert {"ports": [{"protocol": "TCP", "port": 8080}]} in ingress
    api = [r for r in egress if r.get("to") == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]]
    assert api[0]["ports"] == [{"protocol": "TCP", "port": 443}]
    assert dns[0]["to"] == [{"namespaceSelector": {"matchLabels": NAMESPACE_LABELS}}]
    assert not by_kind(rendered["placement"], "Namespace")  # the operator's, external
    hpa_policies = by_kind(rendered["hpa"], "NetworkPolicy")  # the worker's own turned off
    assert [p["metadata"]["name"] for p in hpa_policies] == [
        "acpw-sandbox-deny-all",
        "acpw-sandbox-proxy-only",
    ]
    single = list(by_kind(rendered["single-node"], "NetworkPolicy"))
    (only,) = single  # the docker backend: the worker's own, no sandbox policies
    assert not [
        r for r in only["spec"]["egress"] if {"protocol": "TCP", "port": 6443} in r["ports"]
    ]


def test_the_sandbox_pods_placement_is_the_charts(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every placement value reaches the backend's config, and the pod it builds carries
    it and validates (1.29 and the newest schema)."""
    config = config_of(rendered["placement"], monkeypatch)
    pod = allowlist_pod(config)
    spec, metadata = pod["spec"], pod["metadata"]
    assert spec["nodeSelector"] == PLACEMENT["nodeSelector"]
    assert spec["tolerations"] == PLACEMENT["tolerations"]
    assert spec["affinity"] == PLACEMENT["affinity"]
    assert spec["priorityClassName"] == "acpw-sandboxes"
    assert spec["imagePullSecrets"] == [{"name": "registry-pull"}]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (
        "acpw-sandbox",
        False,
    )
    assert spec["runtimeClassName"] == "kata"
    assert metadata["labels"]["team"] == "agents"
    assert metadata["annotations"]["example.com/owner"] == "platform team"
    assert "karpenter.sh/do-not-disrupt" not in metadata["annotations"]  # turned off
    # The backend makes the policies itself here, naming these workers as the proxy.
    assert config.k8s_network_policies == "create"
    worker = one(rendered["placement"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert config.k8s_proxy_pod_labels.items() <= worker.items()
    assert config.k8s_proxy_namespace_labels == NAMESPACE_LABELS
    for version in K8S_VERSIONS:
        assert kubernetes_validate.validate(pod, version, strict=True) == version


def test_by_default_sandbox_pods_are_kept_from_disruption(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    annotations = allowlist_pod(config_of(rendered["default"], monkeypatch))["metadata"][
        "annotations"
    ]
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


@pytest.mark.parametrize(
    ("pods", "message"),
    [
        ({"labels": {"acpw.network": "allowlist"}}, "invalid propertyName 'acpw.network'"),
        (
            {"labels": {"node-role.kubernetes.io/x": ""}},
            "invalid propertyName 'node-role.kubernetes.io/x'",
        ),
        ({"annotations": {"acpw.io/labels": "{}"}}, "invalid propertyName 'acpw.io/labels'"),
        ({"nodeSelector": {"disk": "ssd only"}}, "/sandbox/kubernetes/pods/nodeSelector"),
        ({"tolerations": [{"key": "a", "operator": "In"}]}, "/sandbox/kubernetes/pods/tolerations"),
        ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]}, "/sandbox/kubernetes/pods"),
        ({"imagePullSecrets": ["Registry_Pull"]}, "/sandbox/kubernetes/pods/imagePullSecrets"),
        ({"serviceAccountName": "Sandbox SA"}, "/sandbox/kubernetes/pods/serviceAccountName"),
        ({"affinity": {"nodeAfinity": {}}}, "/sandbox/kubernetes/pods/affinity"),
    ],
)
def test_bad_placement_values_fail_the_install(pods: dict[str, Any], message: str) -> None:
    values = _merge(BASE, {"sandbox": {"kubernetes": {"pods": pods}}})
    with (
        helm.Chart.load(CHART) as chart,
        pytest.raises(helm.HelmValuesError, match=re.escape(message)),
    ):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_placement_the_schema_passes_the_worker_still_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What JSON schema cannot say (a toleration's Exists with a value, the disruption
    annotations set by hand) the worker's config refuses when it starts."""
    pods = {"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}
    docs = render(_merge(BASE, {"sandbox": {"kubernetes": {"pods": pods}}}))
    with pytest.raises(ValidationError, match="no value"):
        config_of(docs, monkeypatch)


# --- Redis over TLS, with an ACL user, behind Sentinel ----------------------------------------


def test_redis_tls_acl_and_sentinel_values_reach_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TLS files from a Secret, the ACL password as a reference to a variable the Secret
    fills (never a value in the manifest), the sentinel master: the worker's settings and
    its connection factory read them as docs/durability.md says."""
    from worker.store import connect

    sentinels = "sentinel://s1:26379;sentinel://s2:26379;sentinel://s3:26379/0"
    docs = render(
        _merge(
            BASE,
            {
                "redis": {
                    "url": sentinels,
                    "tlsSecret": "redis-tls",
                    "tlsClientCert": True,
                    "username": "acpw",
                    "passwordSecret": {"name": "redis-acl"},
                    "sentinelMaster": "mymaster",
                    "sentinelPasswordSecret": {"name": "redis-sentinel", "key": "pw"},
                }
            },
        )
    )
    env = env_of(docs)
    assert env["REDIS_ACL_PASSWORD"] == {"secretKeyRef": {"name": "redis-acl", "key": "password"}}
    assert env["REDIS_SENTINEL_PASSWORD"] == {
        "secretKeyRef": {"name": "redis-sentinel", "key": "pw"}
    }
    mounts = {m["name"]: m for m in worker_container(docs)["volumeMounts"]}
    assert mounts["redis-tls"] == {
        "name": "redis-tls",
        "mountPath": "/etc/acp-worker/redis-tls",
        "readOnly": True,
    }
    (deployment,) = by_kind(docs, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["redis-tls"]["secret"]["secretName"] == "redis-tls"
    for name, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("ACPW_REDIS_URL", sentinels)
    monkeypatch.setenv("REDIS_ACL_PASSWORD", "acl-secret")
    monkeypatch.setenv("REDIS_SENTINEL_PASSWORD", "sentinel-secret")
    t = connect.target(sentinels, Settings())
    assert (t.username, t.password, t.master) == ("acpw", "acl-secret", "mymaster")
    assert t.sentinel_password == "sentinel-secret"
    settings = Settings()
    assert settings.redis_tls_ca == Path("/etc/acp-worker/redis-tls/ca.crt")
    assert settings.redis_tls_key == Path("/etc/acp-worker/redis-tls/tls.key")
    assert settings.redis_tls_verify
    plain = env_of(render(BASE))
    assert [n for n in plain if n.startswith(("ACPW_REDIS_", "REDIS_"))] == ["ACPW_REDIS_URL"]
