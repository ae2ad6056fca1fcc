"""S3 for workspaces: fetching a job's tar snapshot, and uploading result bundles.

boto3 runs with the worker's own AWS identity (never the agent's); the endpoint can be
pointed elsewhere (``ACPW_S3_ENDPOINT_URL``: MinIO, moto in tests). boto3 errors are
translated here, at the seam: the request, and every read of a body (a connection cut
mid-body, a body shorter than its ``Content-Length``, a read timeout), and the local
writes of the download.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, BinaryIO

import boto3
import botocore.exceptions
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from worker.errors import WorkspaceUnavailable
from worker.packs.archive import ArchiveFormat, ExtractLimits, extract_tar
from worker.settings import Settings

_CHUNK = 1024 * 1024
CLIENT_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def s3_client(settings: Settings) -> Any:
    """A boto3 S3 client for the configured endpoint."""
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url)


def fetch_snapshot(
    client: Any, *, bucket: str, key: str, sha256: str | None, dest: Path, max_bytes: int
) -> str:
    """Download ``s3://bucket/key`` (a tar or tar.gz) and extract it into ``dest``.

    The object is streamed to disk with a size bound, its digest checked against the pin
    before anything is extracted, then extracted with the pack archive rules (no links,
    no devices, no traversal, no duplicates). Returns the object's sha256.

    Raises:
        WorkspaceUnavailable: missing object, too large, digest mismatch, S3 failure
            (the request or the body, cut short or shorter than announced).
        ArchiveRefused: an entry the extraction rules refuse.
    """
    archive = dest.with_suffix(".download")
    try:
        digest = _download(client, bucket=bucket, key=key, path=archive, max_bytes=max_bytes)
    except WorkspaceUnavailable:
        archive.unlink(missing_ok=True)
        raise
    if sha256 is not None and digest != sha256:
        archive.unlink()
        raise WorkspaceUnavailable(
            f"s3://{bucket}/{key} does not match its pinned sha256",
            expected=sha256,
            actual=digest,
        )
    dest.mkdir(mode=0o755)
    fmt: ArchiveFormat = "tar.gz" if _is_gzip(archive) else "tar"
    with archive.open("rb") as stream:
        extract_tar(stream, dest, fmt=fmt, limits=ExtractLimits(max_bytes=max_bytes))
    archive.unlink()
    return digest


def _download(client: Any, *, bucket: str, key: str, path: Path, max_bytes: int) -> str:
    try:
        return _stream(client, bucket=bucket, key=key, path=path, max_bytes=max_bytes)
    except CLIENT_ERRORS as exc:
        raise WorkspaceUnavailable(
            f"cannot fetch s3://{bucket}/{key}: {exc}", bucket=bucket, key=key
        ) from None
    except OSError as exc:  # writing the download (no room), or a socket botocore let by
        raise WorkspaceUnavailable(
            f"cannot fetch s3://{bucket}/{key}: {exc.strerror or exc}",
            bucket=bucket,
            key=key,
            errno=exc.errno,
        ) from None


def _stream(client: Any, *, bucket: str, key: str, path: Path, max_bytes: int) -> str:
    """The body to ``path`` (botocore checks it against ``Content-Length`` at its end)."""
    response = client.get_object(Bucket=bucket, Key=key)
    digest, total = hashlib.sha256(), 0
    with path.open("wb") as out:
        for chunk in response["Body"].iter_chunks(_CHUNK):
            total += len(chunk)
            if total > max_bytes:
                raise WorkspaceUnavailable(
                    f"s3://{bucket}/{key} is larger than the {max_bytes}-byte bound",
                    bound=max_bytes,
                )
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


@retry(
    retry=retry_if_exception_type(CLIENT_ERRORS),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.2, max=3),
    reraise=True,
)
def put_object(client: Any, *, bucket: str, key: str, body: bytes, content_type: str) -> None:
    """Upload one object, retried with backoff (raises the last boto error)."""
    sha = hashlib.sha256(body).hexdigest()
    client.put_object(
        Bucket=bucket, Key=key, Body=body, ContentType=content_type, Metadata={"sha256": sha}
    )


@retry(
    retry=retry_if_exception_type(CLIENT_ERRORS),
    stop=stop_after_attempt(4),
    wait=wait_exponential(multiplier=0.2, max=3),
    reraise=True,
)
def put_file(
    client: Any, *, bucket: str, key: str, body: BinaryIO, sha256: str, content_type: str
) -> None:
    """Upload a seekable file from its start, streamed (never held whole in memory), in
    one request; retried with backoff (raises the last boto error). ``sha256`` is the
    caller's measure of the file, recorded as the object's metadata."""
    body.seek(0)
    client.put_object(
        Bucket=bucket, Key=key, Body=body, ContentType=content_type, Metadata={"sha256": sha256}
    )
