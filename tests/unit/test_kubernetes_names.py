"""Job ids, worker ids and labels mapped onto what Kubernetes accepts, without collisions.

The expected shapes are Kubernetes' own rules (apimachinery's IsValidLabelValue and
IsDNS1123Label), written out here independently of the code under test.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.errors import SandboxError
from worker.sandbox.kubernetes.names import (
    MAX_VALUE_CHARS,
    check_key,
    exact_labels,
    label_value,
    pod_labels,
    pod_name,
)

K8S_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
K8S_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

HOSTILE_IDS = [
    "../../etc/passwd",
    "a" * 128,
    "a" * 127 + "b",  # shares a 127-character prefix with the one above
    "job id with spaces",
    "ünïcödé-jöb",
    "-leading",
    "trailing-",
    "trailing.",
    "x" * 63 + ".",
    "boot:4026531836:123:456",
    "$(rm -rf /)",
    "line\nbreak",
    "nul\x00byte",
    "Job",
    "job",
    "JOB",
    "",
    "h" + "0" * 32,  # looks like an encoded value
    "_h" + "f" * 32,
    "a.b_c-d",
]


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and K8S_LABEL_VALUE.match(value) is not None


def is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and K8S_DNS1123_LABEL.match(name) is not None


@pytest.mark.parametrize("value", ["job-1", "", "w-1.host_x", "A" * 63, "0"])
def test_a_valid_value_is_kept_as_it_is(value: str) -> None:
    assert label_value(value) == value


def test_hostile_values_become_valid_distinct_label_values() -> None:
    encoded = [label_value(v) for v in HOSTILE_IDS]
    assert all(is_label_value(v) for v in encoded), encoded
    assert len(set(encoded)) == len(HOSTILE_IDS)
    assert encoded == [label_value(v) for v in HOSTILE_IDS]  # deterministic


def test_a_kept_value_never_equals_an_encoded_one() -> None:
    # A job id may be exactly another id's encoding: it must not be kept as it is.
    long_id = "a" * 100
    forged = label_value(long_id)
    assert forged != long_id
    assert is_label_value(forged)
    assert label_value(forged) != forged


def test_an_encoded_value_keeps_a_readable_prefix() -> None:
    assert label_value("boot:4026531836:123:456").startswith("boot-4026531836-123-456_h")


@given(st.text(max_size=200), st.text(max_size=200))
def test_label_values_are_valid_and_never_collide(a: str, b: str) -> None:
    try:
        va, vb = label_value(a), label_value(b)
    except SandboxError:
        return  # surrogates: refused, checked below
    assert is_label_value(va)
    assert is_label_value(vb)
    assert (va == vb) == (a == b)


@pytest.mark.parametrize("value", ["\ud800", "x" * (MAX_VALUE_CHARS + 1)])
def test_a_value_that_cannot_be_represented_is_refused(value: str) -> None:
    with pytest.raises(SandboxError):
        label_value(value)
    with pytest.raises(SandboxError):
        exact_labels({"acpw.job": value})


@pytest.mark.parametrize(
    "key",
    ["", "-x", "x-", "a/b/c", "x" * 64, "Upper.Case/name", "kubernetes.io/x", "node.k8s.io/x"],
)
def test_an_invalid_or_reserved_key_is_refused(key: str) -> None:
    with pytest.raises(SandboxError, match="label key"):
        pod_labels({key: "v"})


def test_a_selector_may_match_a_reserved_key() -> None:
    key = "kubernetes.io/metadata.name"
    assert check_key(key, to_set=False) == key
    with pytest.raises(SandboxError):
        check_key(key)


def test_the_exact_labels_survive_in_the_annotation() -> None:
    labels = {f"acpw.k{i}": value for i, value in enumerate(HOSTILE_IDS)}
    assert json.loads(exact_labels(labels)) == labels
    assert exact_labels(labels) == exact_labels(dict(reversed(labels.items())))


def test_pod_names_are_valid_short_and_distinct() -> None:
    attempts = (0, 1, 2, 10**9)
    names = {
        (job, attempt): pod_name(job, attempt)
        for job, attempt in itertools.product(HOSTILE_IDS, attempts)
    }
    assert all(is_dns1123_label(name) for name in names.values()), names
    assert len(set(names.values())) == len(names)
    assert all(pod_name(job, attempt) == name for (job, attempt), name in names.items())


def test_a_pod_name_shows_the_job_and_attempt() -> None:
    name = pod_name("Nightly_Build.7", 3)
    assert name.startswith("acpw-nightly-build-7-3-")


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(SandboxError, match="attempt"):
        pod_name("job", -1)
