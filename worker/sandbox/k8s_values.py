"""What Kubernetes accepts as names, label keys and values, and the sandbox pods' values
an operator sets (placement, labels, annotations), checked when the backend's config is
read (``KubernetesConfig``) and used again by the backend (``kubernetes/names.py``). No
SDK: importing it costs a worker without the ``kubernetes`` extra nothing."""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A name part: at most 63 characters, alphanumeric at both ends.
NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
#: A DNS subdomain (unanchored), as object names and key prefixes are.
SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = rf"^{SUBDOMAIN}$"
#: A qualified name (label, annotation, taint and node-selector keys): an optional DNS
#: subdomain prefix and ``/``, then a name of at most 63 characters (apimachinery's rule).
QUALIFIED_NAME = re.compile(rf"^(?:(?P<prefix>{SUBDOMAIN})/)?{NAME_PART}$")
LABEL_VALUE = re.compile(rf"^(?:{NAME_PART})?$")
#: Prefixes Kubernetes keeps for itself (a pod's own labels and annotations).
RESERVED_PREFIXES = ("kubernetes.io", "k8s.io")
#: What keeps consolidation and node drains from evicting a running job (Karpenter's
#: ``do-not-disrupt``, cluster-autoscaler's ``safe-to-evict``).
DISRUPTION_ANNOTATIONS = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
}
#: Longest total of the operator's extra annotations (the API's cap for all of a pod's
#: annotations is 256 KiB; the backend's own need room too).
MAX_EXTRA_ANNOTATION_BYTES = 64 * 1024


def prefix_of(key: str) -> str | None:
    """``key``'s prefix when ``key`` is a qualified name (``""``: none), else None."""
    match = QUALIFIED_NAME.match(key)
    if match is None or len(match.group("prefix") or "") > 253:
        return None
    return match.group("prefix") or ""


def reserved(prefix: str) -> bool:
    """Whether a key of ``prefix`` is Kubernetes' own (``kubernetes.io``, ``k8s.io``)."""
    return any(prefix == p or prefix.endswith("." + p) for p in RESERVED_PREFIXES)


def _ours(key: str, prefix: str) -> bool:
    """A key of the backend's own (``acpw.*`` labels, ``acpw.io/*`` annotations)."""
    return key.startswith("acpw.") or prefix == "acpw.io" or prefix.endswith(".acpw.io")


def _check_keys(values: dict[str, str], *, what: str, settable: bool) -> dict[str, str]:
    for key in values:
        prefix = prefix_of(key)
        if prefix is None:
            msg = f"{what}: {key!r} is not a qualified name ([prefix/]name) Kubernetes accepts"
            raise ValueError(msg)
        if (
            settable
            and (reserved(prefix) or _ours(key, prefix))
            and key not in DISRUPTION_ANNOTATIONS
        ):
            msg = (
                f"{what}: {key!r} is Kubernetes' own (kubernetes.io, k8s.io) or the backend's "
                "(acpw.*): a sandbox pod's value for it cannot be set here"
            )
            raise ValueError(msg)
    return values


def _check_label_values(values: dict[str, str], *, what: str) -> dict[str, str]:
    for key, value in values.items():
        if not LABEL_VALUE.match(value):
            msg = f"{what}: the value of {key!r} is not a label value (63 of [A-Za-z0-9._-])"
            raise ValueError(msg)
    return values


def selector_labels(values: dict[str, str]) -> dict[str, str]:
    what = "k8s_node_selector"
    return _check_label_values(_check_keys(values, what=what, settable=False), what=what)


def extra_labels(values: dict[str, str]) -> dict[str, str]:
    what = "k8s_pod_labels"
    return _check_label_values(_check_keys(values, what=what, settable=True), what=what)


def extra_annotations(values: dict[str, str]) -> dict[str, str]:
    _check_keys(values, what="k8s_pod_annotations", settable=True)
    taken = sorted(set(values) & set(DISRUPTION_ANNOTATIONS))
    if taken:
        msg = (
            f"k8s_pod_annotations: {taken} are set by k8s_disruption_annotations "
            "(on by default); turn that off to leave a job's pod evictable"
        )
        raise ValueError(msg)
    size = sum(len(k.encode()) + len(v.encode()) for k, v in values.items())
    if size > MAX_EXTRA_ANNOTATION_BYTES:
        msg = f"k8s_pod_annotations: {size} bytes, more than {MAX_EXTRA_ANNOTATION_BYTES}"
        raise ValueError(msg)
    return values


def object_names(values: list[str]) -> list[str]:
    for name in values:
        if len(name) > 253 or not re.match(DNS_SUBDOMAIN, name):
            msg = f"{name!r} is not a Kubernetes object name (a DNS subdomain)"
            raise ValueError(msg)
    return values


def affinity(value: dict[str, object] | None) -> dict[str, object] | None:
    if value is None:
        return None
    unknown = sorted(set(value) - {"nodeAffinity", "podAffinity", "podAntiAffinity"})
    if unknown or not all(isinstance(v, dict) for v in value.values()):
        msg = (
            "k8s_affinity is a pod's `affinity`: objects under nodeAffinity, podAffinity, "
            f"podAntiAffinity only (unknown: {unknown})"
        )
        raise ValueError(msg)
    return value


class Toleration(BaseModel):
    """One toleration of the sandbox pods, as a pod spec writes it (camelCase)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    @model_validator(mode="after")
    def _valid(self) -> Self:
        if self.key is not None and prefix_of(self.key) is None:
            msg = f"a toleration's key {self.key!r} is not a qualified name"
            raise ValueError(msg)
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration with no key has operator Exists")
        if self.value is not None and not LABEL_VALUE.match(self.value):
            msg = f"a toleration's value {self.value!r} is not a label value"
            raise ValueError(msg)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds goes with effect NoExecute only")
        return self

    def manifest(self) -> dict[str, object]:
        """As the pod spec carries it."""
        return self.model_dump(by_alias=True, exclude_none=True)
