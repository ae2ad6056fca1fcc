"""Result bundles: the patch and every changed file, content-addressed in S3.

Layout under ``prefix``: ``blobs/sha256/<hex>`` for each file and the patch (uploaded
once per content: a blob the bucket already holds, with that length and recorded sha256,
is not sent again), and ``jobs/<job>/<attempt>/manifest.json`` listing paths, digests,
sizes and blob keys, and which files the patch left out (and why: they are in the
bundle in full all the same). A file's bytes are read back from the workspace in chunks
into a private temporary file (``TMPDIR``), checked against the digest the capture
measured, and uploaded from there: the worker never holds a whole file in memory, and
the bound is checked with each file's captured size before it is read.

boto3 (``worker.workspace.s3``) is imported only when a bundle is uploaded: a job that
names no bucket never loads it (it costs more than the rest of a CLI start).

The manifest is UTF-8 JSON: a name or link target that is not UTF-8 is written as in
``workspace.changed``, its bytes as ``\\xNN`` with ``<key>_escaped: true`` beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from worker.errors import ResultUploadFailed
from worker.workspace.capture import Change, Entry
from worker.workspace.changes import Captured, named, shown

_CHUNK = 1024 * 1024


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
) -> dict[str, object]:
    """Upload the bundle; returns the manifest's reference for ``job.completed``.

    Raises:
        ResultUploadFailed: S3 kept failing after retries, a file changed or went away
            since capture, or the bundle is over its bound. Nothing is reported as
            uploaded then.
    """
    from worker.workspace import s3  # boto3: only when there is something to upload

    try:
        return _upload(client, target, captured, workspace, job_id=job_id, attempt=attempt)
    except s3.CLIENT_ERRORS as exc:
        raise ResultUploadFailed(
            f"result bundle upload to s3://{target.bucket}/{target.prefix} failed: {exc}",
            bucket=target.bucket,
        ) from None
    except OSError as exc:
        name = shown(os.fsdecode(exc.filename)) if exc.filename else "a changed file"
        raise ResultUploadFailed(
            f"{name} could not be read for the result bundle: {exc.strerror}",
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
) -> dict[str, object]:
    from worker.workspace import s3

    uploader = _Blobs(client, target)
    patch = {
        **uploader.put(captured.patch.text, "text/x-diff"),
        "complete": captured.patch.complete,
        "omitted": [{**named("path", o.path), "reason": o.reason} for o in captured.patch.omitted],
    }
    files = [_file(uploader, change, root) for change in captured.changes if _is_file(change)]
    manifest = {
        "v": 2,
        "job_id": job_id,
        "attempt": attempt,
        "patch": patch,
        "files": files,
        "deleted": [named("path", c.path) for c in captured.changes if c.after is None],
        "links": [
            {**named("path", c.path), **named("target", c.after.target or "")}
            for c in captured.changes
            if c.after is not None and c.after.kind == "link"
        ],
    }
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    key = f"{target.prefix}/jobs/{job_id}/{attempt}/manifest.json".lstrip("/")
    s3.put_object(client, bucket=target.bucket, key=key, body=body, content_type="application/json")
    digest = hashlib.sha256(body).hexdigest()
    return {"kind": "s3", "bucket": target.bucket, "key": key, "sha256": digest}


def _is_file(change: Change) -> bool:
    return change.after is not None and change.after.kind == "file"


def _file(uploader: _Blobs, change: Change, root: Path) -> dict[str, object]:
    entry = change.after
    assert entry is not None
    blob = uploader.put_file(root / change.path, entry, name=shown(change.path))
    return {**named("path", change.path), "mode": f"{entry.mode:04o}", **blob}


@contextmanager
def _verified_copy(path: Path, entry: Entry, *, name: str) -> Iterator[BinaryIO]:
    """The file's bytes in a private temporary file, checked against the digest the
    capture measured: read in chunks (never whole in memory, and no more than the
    captured size and one byte), and what is uploaded is the copy nothing else can
    change."""
    digest, remaining = hashlib.sha256(), entry.size + 1
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as source, tempfile.TemporaryFile() as spool:
        while remaining > 0 and (chunk := source.read(min(_CHUNK, remaining))):
            digest.update(chunk)
            spool.write(chunk)
            remaining -= len(chunk)
        if digest.hexdigest() != entry.sha256:
            raise ResultUploadFailed(f"{name} changed after capture", path=name)
        yield spool


class _Blobs:
    """Content-addressed uploads: a blob already in the bucket (same key, length and
    recorded sha256), or already sent by this job, is not sent again nor counted twice
    toward the bound. The bound is checked with the size before anything is read."""

    def __init__(self, client: Any, target: BundleTarget) -> None:
        from worker.workspace import s3

        self._s3 = s3
        self._client = client
        self._target = target
        self._sent = 0
        self._known: set[str] = set()

    def put(self, data: bytes, content_type: str) -> dict[str, object]:
        """Upload bytes held in memory (the patch, bounded by its own limit)."""

        def send(key: str) -> None:
            self._s3.put_object(self._client, bucket=self._target.bucket, key=key, body=data,
                       content_type=content_type)  # fmt: skip

        return self._put(hashlib.sha256(data).hexdigest(), len(data), send)

    def put_file(self, path: Path, entry: Entry, *, name: str) -> dict[str, object]:
        """Upload a changed file, streamed, if its captured content is not stored yet."""
        assert entry.sha256 is not None
        digest = entry.sha256

        def send(key: str) -> None:
            with _verified_copy(path, entry, name=name) as spool:
                self._s3.put_file(self._client, bucket=self._target.bucket, key=key, body=spool,
                         sha256=digest, content_type="application/octet-stream")  # fmt: skip

        return self._put(digest, entry.size, send)

    def _put(self, digest: str, size: int, send: Callable[[str], None]) -> dict[str, object]:
        key = f"{self._target.prefix}/blobs/sha256/{digest}".lstrip("/")
        ref = {"key": key, "sha256": digest, "size": size}
        if digest in self._known:
            return ref
        if self._sent + size > self._target.max_bytes:
            raise ResultUploadFailed(
                f"the result bundle exceeds {self._target.max_bytes} bytes",
                bound=self._target.max_bytes,
            )
        self._sent += size
        if not self._stored(key, digest, size):
            send(key)
        self._known.add(digest)
        return ref

    def _stored(self, key: str, digest: str, size: int) -> bool:
        """Whether the bucket holds this blob already (any doubt: no, upload it)."""
        try:
            head = self._client.head_object(Bucket=self._target.bucket, Key=key)
        except self._s3.CLIENT_ERRORS:
            return False
        return bool(
            head.get("ContentLength") == size and head.get("Metadata", {}).get("sha256") == digest
        )
