"""Result bundles uploaded straight from a captured workspace to a real S3 API (moto
server on loopback): bounded memory, the bound checked before reading, digests checked
before a blob is visible, and a manifest that keeps every name recoverable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import S3_ENV
from worker.errors import ResultUploadFailed
from worker.workspace.bundle import BundleTarget, upload_bundle
from worker.workspace.changes import capture
from worker.workspace.patch import PatchLimits
from worker.workspace.stage import StagedWorkspace, stage_local

OWNER = (os.getuid(), os.getgid())
MIB = 1024 * 1024

# Captures and uploads in a process of its own, so the moto server (in the test process,
# holding every object it is sent) is not counted: prints the peak RSS growth in bytes.
_CHILD = """
import json, os, sys
from pathlib import Path
import boto3
from worker.errors import ResultUploadFailed
from worker.workspace.bundle import BundleTarget, upload_bundle
from worker.workspace.changes import capture
from worker.workspace.patch import PatchLimits
from worker.workspace.stage import stage_local

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

endpoint, bucket, root, bound = sys.argv[1:]
(Path(root) / "source").mkdir()
staged = stage_local(Path(root) / "source", Path(root) / "ws", owner=(os.getuid(), os.getgid()))
with (staged.path / "big.bin").open("wb") as out:
    for i in range(64):
        out.write(bytes([i]) * 1024 * 1024)
captured = capture(staged, limits=PatchLimits(file_bytes=1024))
client = boto3.client("s3", endpoint_url=endpoint)
client.list_buckets()
target = BundleTarget(bucket=bucket, prefix="r", max_bytes=int(bound))
start = peak()
try:
    upload_bundle(client, target, job_id="j", attempt=1, captured=captured,
                  workspace=staged.path)
    outcome = "uploaded"
except ResultUploadFailed as exc:
    outcome = str(exc)
print(json.dumps({"growth": peak() - start, "outcome": outcome}))
"""


def _bucket(s3: Any) -> str:
    name = f"rb-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _staged(tmp_path: Path) -> StagedWorkspace:
    source = tmp_path / "source"
    source.mkdir()
    (source / "keep.txt").write_text("kept\n")
    return stage_local(source, tmp_path / "ws", owner=OWNER)


def _blob_keys(s3: Any, bucket: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="r/blobs/")
    return [item["Key"] for item in listed.get("Contents", [])]


def _child(s3_endpoint: str, bucket: str, root: Path, bound: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, s3_endpoint, bucket, str(root), str(bound)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **S3_ENV},
        timeout=120,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize(("bound", "uploaded"), [(1 * MIB, False), (256 * MIB, True)])
def test_a_large_file_is_never_held_in_memory(
    s3: Any, s3_endpoint: str, tmp_path: Path, bound: int, uploaded: bool
) -> None:
    """A 64 MiB file: over a 1 MiB bound it is refused before it is read; under a
    256 MiB bound it is uploaded, streamed. The worker grows by far less either way
    (it grew by the whole file, and more, before it checked the bound)."""
    bucket = _bucket(s3)
    report = _child(s3_endpoint, bucket, tmp_path, bound)
    assert report["growth"] < 16 * MIB, report
    digest = hashlib.sha256()
    for i in range(64):
        digest.update(bytes([i]) * MIB)
    key = f"r/blobs/sha256/{digest.hexdigest()}"
    if not uploaded:
        assert report["outcome"] == f"the result bundle exceeds {bound} bytes"
        assert key not in _blob_keys(s3, bucket)
        return
    assert report["outcome"] == "uploaded"
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == digest.hexdigest()


def test_a_file_changed_after_capture_is_not_uploaded(s3: Any, tmp_path: Path) -> None:
    bucket = _bucket(s3)
    staged = _staged(tmp_path)
    (staged.path / "a.txt").write_bytes(b"captured")
    captured = capture(staged, limits=PatchLimits())
    (staged.path / "a.txt").write_bytes(b"replaced")  # same size, other bytes
    target = BundleTarget(bucket=bucket, prefix="r", max_bytes=MIB)
    with pytest.raises(ResultUploadFailed, match=r"a\.txt changed after capture"):
        upload_bundle(s3, target, job_id="j", attempt=1, captured=captured, workspace=staged.path)
    patch = hashlib.sha256(captured.patch.text).hexdigest()
    assert _blob_keys(s3, bucket) == [f"r/blobs/sha256/{patch}"]  # the file is not there


def test_names_not_utf8_are_escaped_in_the_manifest(s3: Any, tmp_path: Path) -> None:
    """A file, a deletion, a link and its target, and a file left out of the patch, all
    named with bytes that are not UTF-8: written as in workspace.changed (``\\xNN`` and
    ``<key>_escaped``), never as lone surrogates that readers turn into U+FFFD."""
    bucket = _bucket(s3)
    source = tmp_path / "source"
    source.mkdir()
    (source / os.fsdecode(b"gone\xfe.txt")).write_text("old\n")
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    (staged.path / os.fsdecode(b"gone\xfe.txt")).unlink()
    (staged.path / os.fsdecode(b"bad\xff.txt")).write_text("new\n")
    (staged.path / os.fsdecode(b"big\xfb.bin")).write_bytes(b"b" * 2048)
    (staged.path / os.fsdecode(b"l\xfd")).symlink_to(os.fsdecode(b"t\xfc"))
    (staged.path / "plain.txt").write_text("plain\n")
    captured = capture(staged, limits=PatchLimits(file_bytes=1024))
    target = BundleTarget(bucket=bucket, prefix="r", max_bytes=MIB)
    ref = upload_bundle(s3, target, job_id="j", attempt=1, captured=captured, workspace=staged.path)
    body = s3.get_object(Bucket=bucket, Key=ref["key"])["Body"].read()
    assert b"\\udc" not in body
    manifest = json.loads(body)
    files = {f["path"]: f.get("path_escaped") for f in manifest["files"]}
    assert files == {"bad\\xff.txt": True, "big\\xfb.bin": True, "plain.txt": None}
    assert manifest["deleted"] == [{"path": "gone\\xfe.txt", "path_escaped": True}]
    assert manifest["links"] == [
        {"path": "l\\xfd", "path_escaped": True, "target": "t\\xfc", "target_escaped": True}
    ]
    assert manifest["patch"]["omitted"] == [
        {"path": "big\\xfb.bin", "path_escaped": True, "reason": "too_large"}
    ]
    # The escapes give the real bytes back.
    [big] = [f for f in manifest["files"] if f["path"].startswith("big")]
    name = big["path"].encode().decode("unicode_escape").encode("latin-1")
    assert name == b"big\xfb.bin"
    blob = s3.get_object(Bucket=bucket, Key=big["key"])["Body"].read()
    assert blob == (staged.path / os.fsdecode(name)).read_bytes()
