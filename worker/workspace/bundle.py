"""Result bundles: the patch and every changed file, content-addressed in S3.

Layout under ``prefix``: ``blobs/sha256/<hex>`` for each file and the patch (uploaded
once per content: a blob the bucket already holds, with that length and recorded sha256,
is not sent again), and ``jobs/<job>/<attempt>/manifest.json`` listing paths, digests,
sizes and blob keys, and which files the patch left out (and why: they are in the
bundle in full all the same). Bytes are read back from the workspace and checked against
the digests the capture measured before they are uploaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.errors import ResultUploadFailed
from worker.workspace.capture import Change
from worker.workspace.changes import Captured
from worker.workspace.s3 import _CLIENT_ERRORS, put_object


@dataclass(frozen=True, slots=True)
class BundleTarget:
    bucket: str
    prefix: str
    max_bytes: int


def upload_bundle(
    client: Any,
    target: BundleTarget,
    *,
    job_id: str,
    attempt: int,
    captured: Captured,
    workspace: Path,
) -> dict[str, Any]:
    """Upload the bundle; returns the manifest's reference for ``job.completed``.

    Raises:
        ResultUploadFailed: S3 kept failing after retries, a file changed or went away
            since capture, or the bundle is over its bound. Nothing is reported as
            uploaded then.
    """
    try:
        return _upload(client, target, captured, workspace, job_id=job_id, attempt=attempt)
    except _CLIENT_ERRORS as exc:
        raise ResultUploadFailed(
            f"result bundle upload to s3://{target.bucket}/{target.prefix} failed: {exc}",
            bucket=target.bucket,
        ) from None
    except OSError as exc:
        raise ResultUploadFailed(
            f"{exc.filename or 'a changed file'} could not be read for the result bundle: "
            f"{exc.strerror}",
            bucket=target.bucket,
        ) from None


def _upload(
    client: Any,
    target: BundleTarget,
    captured: Captured,
    root: Path,
    *,
    job_id: str,
    attempt: int,
) -> dict[str, Any]:
    uploader = _Blobs(client, target)
    patch = {
        **uploader.put(captured.patch.text, "text/x-diff"),
        "complete": captured.patch.complete,
        "omitted": [{"path": o.path, "reason": o.reason} for o in captured.patch.omitted],
    }
    files = [_file(uploader, change, root) for change in captured.changes if _is_file(change)]
    manifest = {
        "v": 1,
        "job_id": job_id,
        "attempt": attempt,
        "patch": patch,
        "files": files,
        "deleted": [c.path for c in captured.changes if c.after is None],
        "links": [
            {"path": c.path, "target": c.after.target}
            for c in captured.changes
            if c.after is not None and c.after.kind == "link"
        ],
    }
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    key = f"{target.prefix}/jobs/{job_id}/{attempt}/manifest.json".lstrip("/")
    put_object(client, bucket=target.bucket, key=key, body=body, content_type="application/json")
    digest = hashlib.sha256(body).hexdigest()
    return {"kind": "s3", "bucket": target.bucket, "key": key, "sha256": digest}


def _is_file(change: Change) -> bool:
    return change.after is not None and change.after.kind == "file"


def _file(uploader: _Blobs, change: Change, root: Path) -> dict[str, Any]:
    entry = change.after
    assert entry is not None
    fd = os.open(root / change.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(entry.size + 1)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ResultUploadFailed(f"{change.path} changed after capture", path=change.path)
    blob = uploader.put(data, "application/octet-stream")
    return {"path": change.path, "mode": f"{entry.mode:04o}", **blob}


class _Blobs:
    """Content-addressed uploads: a blob already in the bucket (same key, length and
    recorded sha256), or already sent by this job, is not sent again nor counted twice
    toward the bound."""

    def __init__(self, client: Any, target: BundleTarget) -> None:
        self._client = client
        self._target = target
        self._sent = 0
        self._known: set[str] = set()

    def put(self, data: bytes, content_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        key = f"{self._target.prefix}/blobs/sha256/{digest}".lstrip("/")
        ref = {"key": key, "sha256": digest, "size": len(data)}
        if digest in self._known:
            return ref
        self._sent += len(data)
        if self._sent > self._target.max_bytes:
            raise ResultUploadFailed(
                f"the result bundle exceeds {self._target.max_bytes} bytes",
                bound=self._target.max_bytes,
            )
        if not self._stored(key, digest, len(data)):
            put_object(self._client, bucket=self._target.bucket, key=key, body=data,
                       content_type=content_type)  # fmt: skip
        self._known.add(digest)
        return ref

    def _stored(self, key: str, digest: str, size: int) -> bool:
        """Whether the bucket holds this blob already (any doubt: no, upload it)."""
        try:
            head = self._client.head_object(Bucket=self._target.bucket, Key=key)
        except _CLIENT_ERRORS:
            return False
        return bool(
            head.get("ContentLength") == size and head.get("Metadata", {}).get("sha256") == digest
        )
