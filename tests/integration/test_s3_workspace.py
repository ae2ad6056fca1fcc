"""S3 workspaces and result bundles against a real S3 API (moto server on loopback)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import struct
import tarfile
import threading
import uuid
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import boto3
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
    assert (manifest["patch"]["complete"], manifest["patch"]["omitted"]) == (True, [])


def test_a_blob_already_in_the_bucket_is_not_sent_again(
    s3: Any, s3_endpoint: str, tmp_path: Path
) -> None:
    bucket = _bucket(s3)
    s3.put_object(Bucket=bucket, Key="snap.tar", Body=_tar([("a.txt", None, b"one\n")]))
    # Two files with the same new content: one blob, counted once.
    script = "#!scenario\nwrite a.txt same bytes\nwrite b.txt same bytes\n"
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, **S3_ENV)

    def run(name: str) -> dict[str, Any]:
        (tmp_path / name).mkdir()
        job = _job(
            tmp_path / name,
            script,
            workspace={"kind": "s3", "bucket": bucket, "key": "snap.tar"},
            results={"bucket": bucket, "prefix": "results"},
        )
        result = run_cli(tmp_path / name, "run", str(job), "--json", "--quiet", env=env)
        assert result.returncode == 0, result.stderr
        ref = _check_stream(_events(result.stdout))["result"]
        manifest: dict[str, Any] = json.loads(
            s3.get_object(Bucket=bucket, Key=ref["key"])["Body"].read()
        )
        return manifest

    first = run("one")
    [key] = {f["key"] for f in first["files"]}
    blob = s3.get_object(Bucket=bucket, Key=key)
    body, digest = blob["Body"].read(), blob["Metadata"]["sha256"]
    # Mark the stored blob: an upload by the next job would replace it, marker and all.
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sha256": digest, "mark": "1"})
    second = run("two")
    assert {f["key"] for f in second["files"]} == {key}
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"sha256": digest, "mark": "1"}
    # A blob whose recorded digest does not match is not trusted: uploaded again.
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sha256": "0" * 64})
    run("three")
    assert s3.head_object(Bucket=bucket, Key=key)["Metadata"] == {"sha256": digest}


def test_a_bounded_patch_is_said_in_the_events_and_the_bundle(
    s3: Any, s3_endpoint: str, tmp_path: Path
) -> None:
    """Three ~2 KB files, a 3000-byte patch bound: one is inlined, two are listed; a
    notice says so; the bundle holds all three in full and names the two."""
    bucket = _bucket(s3)
    script = "#!scenario\nexec sh -c 'for f in a b c; do seq 1 500 > $f.txt; done'\n"
    job = _job(tmp_path, script, results={"bucket": bucket, "prefix": "results"})
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, ACPW_PATCH_MAX_BYTES="3000", **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    ref = _check_stream(events)["result"]
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert changed["patch"]["complete"] is False
    assert changed["patch"]["omitted"] == ["b.txt", "c.txt"]
    assert changed["patch"]["omitted_reasons"] == {"patch_full": 2}
    reasons = {p["path"]: p.get("omitted_reason") for p in changed["paths"]}
    assert reasons == {"a.txt": None, "b.txt": "patch_full", "c.txt": "patch_full"}
    [notice] = [e["data"] for e in events if e["type"] == "notice"
                and e["data"]["code"] == "patch_incomplete"]  # fmt: skip
    assert notice["details"]["patch_bytes"] == 3000
    assert Path(changed["patch"]["path"]).stat().st_size <= 3000
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=ref["key"])["Body"].read())
    assert manifest["patch"]["complete"] is False
    assert manifest["patch"]["omitted"] == [
        {"path": "b.txt", "reason": "patch_full"},
        {"path": "c.txt", "reason": "patch_full"},
    ]
    assert sorted(f["path"] for f in manifest["files"]) == ["a.txt", "b.txt", "c.txt"]


def test_failed_upload_fails_the_job_visibly(s3: Any, s3_endpoint: str, tmp_path: Path) -> None:
    script = "#!scenario\nwrite a.txt changed\n"
    job = _job(tmp_path, script, results={"bucket": "no-such-bucket-acpw", "prefix": "r"})
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 1
    events = _events(result.stdout)
    done = _check_stream(events)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "result_upload_failed"
    assert done["result"] is None
    assert done["result_error"] == done["error"]
    assert [n["level"] for n in _upload_failures(events)] == ["error"]


# --- a body that breaks mid-way: what moto cannot do, a loopback HTTP server does ----------


class _BrokenBody(BaseHTTPRequestHandler):
    """Answers every GET with a tar's headers, then breaks its body as ``mode`` says:
    ``cut`` (half, then a clean close), ``reset`` (half, then a TCP reset), ``checksum``
    (all of it, under a CRC32 header that does not match)."""

    protocol_version = "HTTP/1.1"
    body: ClassVar[bytes] = b""
    mode: ClassVar[str] = "cut"

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(len(self.body)))
        if self.mode == "checksum":
            wrong = (zlib.crc32(self.body) ^ 1).to_bytes(4, "big")
            self.send_header("x-amz-checksum-crc32", base64.b64encode(wrong).decode())
        self.end_headers()
        if self.mode == "checksum":
            self.wfile.write(self.body)
            return
        self.wfile.write(self.body[: len(self.body) // 2])
        self.wfile.flush()
        if self.mode == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True


@pytest.fixture
def broken_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    _BrokenBody.body = _tar([(f"f{i}.txt", None, bytes([65 + i % 26]) * 40_000) for i in range(8)])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenBody)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("mode", ["cut", "reset", "checksum"])
def test_a_body_broken_mid_way_is_workspace_unavailable(
    broken_s3: str, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_BrokenBody, "mode", mode)
    client = boto3.client("s3", endpoint_url=broken_s3)
    with pytest.raises(WorkspaceUnavailable, match=r"cannot fetch s3://b/snap\.tar") as caught:
        fetch_snapshot(
            client, bucket="b", key="snap.tar", sha256=None, dest=tmp_path / "src", max_bytes=10**7
        )
    assert caught.value.details == {"bucket": "b", "key": "snap.tar"}
    assert not (tmp_path / "src").exists()
    assert not (tmp_path / "src.download").exists()  # the partial download is gone


def test_a_job_whose_snapshot_is_cut_short_completes_with_a_typed_error(
    broken_s3: str, tmp_path: Path
) -> None:
    workspace = {"kind": "s3", "bucket": "snapshots", "key": "snap.tar"}
    job = _job(tmp_path, "scenario: hello", workspace=workspace)
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=broken_s3, **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 2, result.stderr  # invalid input: the workspace
    assert "Traceback" not in result.stderr
    done = _check_stream(_events(result.stdout))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "workspace_unavailable"
    assert "read, but total bytes expected is" in done["error"]["message"]


# --- a failed result upload is said, whatever the job's status ----------------------------


def _upload_failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in events
        if e["type"] == "notice" and e["data"]["code"] == "result_upload_failed"
    ]


@pytest.mark.parametrize(
    ("script", "limits", "status", "exit_code"),
    [
        ("#!scenario\nwrite a.txt changed\nstop refusal\n", None, "failed", 1),
        ("#!scenario\nwrite a.txt changed\nhang\n", {"timeout_s": 2}, "timed_out", 5),
    ],
)
def test_a_failed_upload_is_said_whatever_the_status(
    s3_endpoint: str,
    tmp_path: Path,
    script: str,
    limits: dict[str, Any] | None,
    status: str,
    exit_code: int,
) -> None:
    overrides: dict[str, Any] = {"results": {"bucket": "no-such-bucket-acpw", "prefix": "r"}}
    if limits is not None:
        overrides["limits"] = {"memory_mb": 512, "pids": 128, **limits}
    job = _job(tmp_path, script, **overrides)
    env = _env(tmp_path, ACPW_S3_ENDPOINT_URL=s3_endpoint, **S3_ENV)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == exit_code, result.stderr
    events = _events(result.stdout)
    done = _check_stream(events)
    assert done["status"] == status  # the turn's own outcome is kept
    assert done["result"] is None
    assert done["result_error"]["code"] == "result_upload_failed"
    assert "NoSuchBucket" in done["result_error"]["message"]
    [notice] = _upload_failures(events)
    assert notice["level"] == "error"
    assert "NoSuchBucket" in notice["message"]
    assert notice["details"] == {"bucket": "no-such-bucket-acpw"}
