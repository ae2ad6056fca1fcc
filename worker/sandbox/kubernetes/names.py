"""Kubernetes names and label values for what a sandbox spec says.

Kubernetes restricts both (apimachinery's validation): a label value is empty or at
most 63 characters of ``[A-Za-z0-9._-]``, beginning and ending alphanumeric; a pod name
here is a DNS-1123 label (at most 63 characters of ``[a-z0-9-]``), since a pod's name is
also its hostname. Job and worker ids are wider than that, so:

- a valid label value is kept as it is, unless it looks like an encoded one; any other
  is *encoded*: a readable prefix (what is not allowed replaced by ``-``) then ``_h``
  and 32 hex digits of its SHA-256. A kept value never looks encoded, so two different
  values never share a label (short of a 128-bit hash collision): no truncation into
  collisions. The exact values go with the pod in one annotation (``exact_labels``).
- a pod name always ends in a hash of (job id, attempt): lower-casing alone maps two
  job ids (``Job`` and ``job``) to one name.

What cannot be represented at all (an invalid label key, a value that is not UTF-8 text
or is longer than an annotation should carry) is refused with ``SandboxError``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from worker.errors import SandboxError
from worker.sandbox.k8s_values import LABEL_VALUE, prefix_of, reserved

#: Longest label value accepted (kept exactly in the annotation, encoded in the label).
MAX_VALUE_CHARS = 1024
_ENCODED = re.compile(r"(?:^|_)h[0-9a-f]{32}$")
_NOT_IN_VALUE = re.compile(r"[^A-Za-z0-9._-]+")
_NOT_IN_NAME = re.compile(r"[^a-z0-9]+")
_PREFIX_CHARS = 28  # + "_h" + 32 hex = 62, within the 63 a value may have
_NAME_HASH_CHARS = 12


def check_key(key: str, *, to_set: bool = True) -> str:
    """``key`` itself, if Kubernetes accepts it as a label key (``to_set``: one we may
    set, not under a prefix Kubernetes reserves; a selector may still match those).

    Raises:
        SandboxError: not a qualified name, or (``to_set``) under a reserved prefix.
    """
    prefix = prefix_of(key)
    if prefix is None or (to_set and reserved(prefix)):
        raise SandboxError("not a label key Kubernetes accepts", key=key)
    return key


def label_value(value: str) -> str:
    """``value`` as a label value: itself when valid and not encoded-looking, else its
    encoding (see the module docstring).

    Raises:
        SandboxError: ``value`` is not UTF-8 text or longer than ``MAX_VALUE_CHARS``.
    """
    _check_text(value)
    if LABEL_VALUE.match(value) and not _ENCODED.search(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:32]
    prefix = _NOT_IN_VALUE.sub("-", value)[:_PREFIX_CHARS].strip("-_.")
    return f"{prefix}_h{digest}" if prefix else f"h{digest}"


def pod_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` with checked keys and representable values (``label_value``).

    Raises:
        SandboxError: a key or value cannot be represented.
    """
    return {check_key(key): label_value(value) for key, value in labels.items()}


def exact_labels(labels: Mapping[str, str]) -> str:
    """The exact ``labels`` as the value of one annotation (JSON, keys sorted), from
    which a reader recovers what the pod's labels may only carry encoded.

    Raises:
        SandboxError: a value cannot be represented.
    """
    for value in labels.values():
        _check_text(value)
    return json.dumps(dict(labels), sort_keys=True, ensure_ascii=False)


def pod_name(job_id: str, attempt: int) -> str:
    """``acpw-<job>-<attempt>-<hash>``: a DNS-1123 label of at most 63 characters,
    the same for the same job attempt, different for different ones.

    Raises:
        SandboxError: ``attempt`` is negative or ``job_id`` is not UTF-8 text.
    """
    if attempt < 0:
        raise SandboxError("a job attempt is not negative", attempt=attempt)
    _check_text(job_id)
    digest = hashlib.sha256(f"{job_id}\n{attempt}".encode()).hexdigest()[:_NAME_HASH_CHARS]
    room = 63 - len(f"acpw--{attempt}-{digest}")
    slug = _NOT_IN_NAME.sub("-", job_id.lower())[:room].strip("-")
    return "-".join(part for part in ("acpw", slug, str(attempt), digest) if part)


def _check_text(value: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise SandboxError("a label value is not UTF-8 text", value=repr(value)) from None
    if len(value) > MAX_VALUE_CHARS:
        raise SandboxError(
            "a label value is too long for the pod", chars=len(value), limit=MAX_VALUE_CHARS
        )
