"""S3 workspaces and result bundles against a real S3 API (moto server on loopback)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import S3_ENV
from tests.integration.test_run_job import _check_stream, _env, _events, _job, run_cli
from worker.errors import ArchiveRefused, WorkspaceUnavailable
from worker.workspace.s3 import fetch_snapshot


def _tar(members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """(name, link target or None, content) → an uncompressed tar."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, link, data in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link.decode()
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if link is None else None)
    return out.getvalue()


def _bucket(s3: Any) -> str:
    name = f"ws-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def test_snapshot_is_fetched_verified_and_extracted(s3: Any, tmp_path: Path) -> None:
    bucket = _bucket(s3)
    body = _tar([("src/a.py", None, b"print(1)\n"), ("README.md", None, b"# r\n")])
    s3.put_object(Bucket=bucket, Key="snap.tar", Body=body)
    digest = fetch_snapshot(
        s3,
        bucket=bucket,
        key="snap.tar",
        sha256=hashlib.sha256(body).hexdigest(),
        dest=tmp_path / "src",
        max_bytes=10**6,
    )
    assert digest == hashlib.sha256(body).hexdigest()
    assert (tmp_path / "src" / "src" / "a.py").read_bytes() == b"print(1)\n"


@pytest.mark.parametrize(
    "members",
    [
        [("../escape.txt", None, b"x")],
        [("/abs.txt", None, b"x")],
        [("link", b"/etc/passwd", b"")],
    ],
)
def test_traversal_and_links_are_refused(s3: Any, tmp_path: Path, members: list[Any]) -> None:
    bucket = _bucket(s3)
    s3.put_object(Bucket=bucket, Key="bad.tar", Body=_tar(members))
    with pytest.raises(ArchiveRefused):
        fetch_snapshot(
            s3, bucket=bucket, key="bad.tar", sha256=None, dest=tmp_path / "src", max_bytes=10**6
        )
    assert not (tmp_path / "escape.txt").exists()


def test_pin_mismatch_and_missing_object(s3: Any, tmp_path: Path) -> None:
    bucket = _bucket(s3)
    s3.put_object(Bucket=bucket, Key="snap.tar", Body=_tar([("a", None, b"1")]))
    with pytest.raises(WorkspaceUnavailable, match="pinned"):
        fetch_snapshot(
            s3, bucket=bucket, key="snap.tar", sha256="0" * 64, dest=tmp_path / "a", max_bytes=10**6
        )
    assert not (tmp_path / "a").exists()
    with pytest.raises(WorkspaceUnavailable, match="cannot fetch"):
        fetch_snapshot(
            s3, bucket=bucket, key="nope.tar", sha256=None, dest=tmp_path / "b", max_bytes=10**6
        )


def test_s3_job_exports_a_bundle_read_back_byte_exact(
    s3: Any, s3_endpoint: str, tmp_path: Path
) -> None:
    bucket = _bucket(s3)
    s3.put_object(
        Bucket=bucket,
        Key="snap.tar",
        Body=_tar([("a.txt", None, b"one\n"), ("b.bin", None, b"\0\1")]),
    )
    script = "#!scenario\nwrite a.txt two\nwrite c.txt new file\n"
    job = _job(
        tmp_path,
        script,
        workspace={"kind": "s3", "bucket": bucket, "key": "snap.tar"},
        results={"bucket": bucket, "prefix": "results"},
    )
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    ref = _check_stream(events)["result"]
    manifest_bytes = s3.get_object(Bucket=bucket, Key=ref["key"])["Body"].read()
    assert hashlib.sha256(manifest_bytes).hexdigest() == ref["sha256"]
    manifest = json.loads(manifest_bytes)
    files = {f["path"]: f for f in manifest["files"]}
    assert set(files) == {"a.txt", "c.txt"}
    for path, item in files.items():
        blob = s3.get_object(Bucket=bucket, Key=item["key"])["Body"].read()
        assert hashlib.sha256(blob).hexdigest() == item["sha256"]
        assert blob == {"a.txt": b"two", "c.txt": b"new file"}[path]
    patch = s3.get_object(Bucket=bucket, Key=manifest["patch"]["key"])["Body"].read()
    assert b"+two" in patch


def test_failed_upload_fails_the_job_visibly(s3: Any, s3_endpoint: str, tmp_path: Path) -> None:
    script = "#!scenario\nwrite a.txt changed\n"
    job = _job(tmp_path, script, results={"bucket": "no-such-bucket-acpw", "prefix": "r"})
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 1
    done = _check_stream(_events(result.stdout))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "result_upload_failed"
    assert done["result"] is None
