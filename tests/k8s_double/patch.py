"""The API double's pod patch, as the API server judges one (``server.ApiDouble.patch_pod``
applies it): what a patch may change on a running pod, the merge of its labels and
annotations, and the rule of ``spec.activeDeadlineSeconds``, with the API server's own
422 ``Invalid`` (a ``Status`` whose ``details.causes`` name the field)."""

from __future__ import annotations

import copy
import json
import re
from typing import Any


class ApiError(Exception):
    """Answered as a ``Status`` with ``code`` and ``reason``."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details

    def status(self) -> dict[str, Any]:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        return status if self.details is None else {**status, "details": self.details}


#: The patches the double merges (a JSON patch, a list of operations, it does not serve).
_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
#: A label value as the API server validates it (at most 63 characters).
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")
#: The API server's words for a pod change outside what may change.
POD_UPDATE_REFUSED = (
    "spec: Forbidden: pod updates may not change fields other than "
    "`spec.containers[*].image`, `spec.initContainers[*].image`, "
    "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
    "tolerations), `spec.terminationGracePeriodSeconds`"
)


def patch_parts(
    name: str, patch: dict[str, Any], content_type: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod patch's metadata and spec parts, refused as the API server refuses them: a
    media type the double does not serve (a JSON patch) is a 415; a change of anything
    but labels, annotations and ``spec.activeDeadlineSeconds`` a 422."""
    kind = content_type.split(";", 1)[0].strip()
    if kind not in _MERGE_PATCHES:
        raise ApiError(415, "UnsupportedMediaType", f"the media type {kind!r} is not served")
    metadata = patch.get("metadata", {})
    spec_patch = patch.get("spec", {})
    if (
        set(patch) - {"metadata", "spec"}
        or not isinstance(metadata, dict)
        or not isinstance(spec_patch, dict)
        or set(spec_patch) - {"activeDeadlineSeconds"}
    ):
        raise ApiError(422, "Invalid", f"Pod {name!r} is invalid: {POD_UPDATE_REFUSED}")
    if set(metadata) - {"labels", "annotations"}:
        raise ApiError(422, "Invalid", f"Pod {name!r} is invalid: metadata is immutable")
    return metadata, spec_patch


def merged_metadata(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``current`` metadata with ``changes`` merged into its labels and annotations (a
    null removes the key); every label value checked as the API server checks it."""
    merged = copy.deepcopy(current)
    for field in ("labels", "annotations"):
        changed = changes.get(field) or {}
        if not isinstance(changed, dict):
            raise ApiError(422, "Invalid", f"metadata.{field}: not a map")
        kept = dict(merged.get(field) or {})
        for key, value in changed.items():
            if value is None:
                kept.pop(key, None)
            else:
                kept[key] = value
        merged[field] = kept
    for key, value in merged["labels"].items():
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
            raise ApiError(422, "Invalid", f"metadata.labels: Invalid value: {key}")
    return merged


#: The most ``activeDeadlineSeconds`` may be (an int32).
_MAX_INT32 = 2**31 - 1


def deadline_errors(old: int | None, new: object) -> list[tuple[object, str]]:
    """Why the API server refuses changing a pod's ``spec.activeDeadlineSeconds`` from
    ``old`` to ``new`` ((value, detail) pairs; none: allowed). Its pod update
    validation (``ValidatePodUpdate``, kubernetes ``pkg/apis/core/validation``) allows
    only setting it where it was unset, or lowering it: a raise is "must be less than or
    equal to previous value", a removal "must not update from a positive integer to nil
    value"; the pod spec's own check keeps it in 1..2^31-1."""
    if new is None:
        removed = "must not update from a positive integer to nil value"
        return [] if old is None else [(None, removed)]
    if not isinstance(new, int) or isinstance(new, bool):
        return [(new, "must be an integer")]
    if not 1 <= new <= _MAX_INT32:
        return [(new, f"must be between 1 and {_MAX_INT32}, inclusive")]
    if old is not None and old < new:
        return [(new, "must be less than or equal to previous value")]
    return []


def invalid(name: str, errors: list[tuple[object, str]]) -> ApiError:
    """The API server's 422 for an invalid pod update (``errors.NewInvalid``): one
    ``FieldValueInvalid`` cause per error in ``details``, all of them in the message."""
    field = "spec.activeDeadlineSeconds"
    causes = [
        {"reason": "FieldValueInvalid", "message": f"Invalid value: {json.dumps(v)}: {d}",
         "field": field}
        for v, d in errors
    ]  # fmt: skip
    words = "; ".join(f"{field}: {c['message']}" for c in causes)
    if len(causes) > 1:
        words = f"[{words}]"
    details = {"name": name, "kind": "Pod", "causes": causes}
    return ApiError(422, "Invalid", f'Pod "{name}" is invalid: {words}', details)
