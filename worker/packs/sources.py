"""Where pack archives come from: a pack-folder path, HTTPS, or S3.

Remote archives are fetched once into ``<cache_dir>/archives/<sha256>`` and extracted
from there by ``cache.materialize`` (which re-checks the pins before reading an entry):

- **streamed**: 1 MiB chunks into a temporary file, hashed as they arrive; more bytes than
  the pinned size abort the transfer at once (size-bounded), a digest that differs from
  the pin is refused (``DigestMismatch``) and the file never appears;
- **retried** with exponential backoff on connection errors, 5xx and 429;
- **once**: a per-digest ``flock`` makes concurrent workers download one copy; the file
  appears under its final name only complete (``rename``).

Closures and archives are ``touch``ed on every use: ``worker.packs.gc`` removes the least
recently used first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.errors import ArchiveRefused, DigestMismatch, InvalidInput

CHUNK = 1024 * 1024
RETRIES = 4
BACKOFF_S = 0.5
_SHA = r"^[0-9a-f]{64}$"


class HttpsSource(BaseModel):
    """An archive at an HTTPS URL (``http://`` only for loopback, e.g. tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["https"] = "https"
    url: Annotated[str, Field(pattern=r"^(https://|http://(127\.0\.0\.1|localhost|\[::1\])[:/])")]
    timeout_s: float = Field(default=60.0, gt=0, description="Per-read timeout.")

    def resolve(self, pack_dir: Path) -> Path:
        """Remote archives have no path in the pack folder: ``fetch`` them into the cache.

        Raises:
            InvalidInput: always.
        """
        raise InvalidInput(f"archive {_describe(self)} is remote: materialize the pack instead")


class S3Source(BaseModel):
    """An archive in S3 (or an S3-compatible service at ``endpoint_url``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["s3"] = "s3"
    bucket: str = Field(min_length=3, max_length=63)
    key: str = Field(min_length=1, max_length=1024)
    region: str | None = None
    endpoint_url: str | None = Field(default=None, description="Default: AWS.")

    def resolve(self, pack_dir: Path) -> Path:
        """Remote archives have no path in the pack folder: ``fetch`` them into the cache.

        Raises:
            InvalidInput: always.
        """
        raise InvalidInput(f"archive {_describe(self)} is remote: materialize the pack instead")


RemoteSource = HttpsSource | S3Source
Opener = Callable[[RemoteSource, int], Iterator[Iterable[bytes]]]


@dataclass(frozen=True, slots=True)
class FetchStats:
    path: Path
    downloaded: bool
    attempts: int
    seconds: float


class _Retryable(Exception):
    """A transient failure (connection, 5xx, 429): try again after a backoff."""


def archive_path(cache_dir: Path, sha256: str) -> Path:
    return cache_dir / "archives" / sha256


def fetch(
    source: RemoteSource,
    cache_dir: Path,
    *,
    sha256: str,
    size: int,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
) -> FetchStats:
    """The archive pinned by ``sha256``/``size``, downloaded into the cache once.

    Raises:
        DigestMismatch: the bytes differ from the pin (size or digest).
        ArchiveRefused: the source failed after ``retries`` attempts or refused access.
    """
    start = time.monotonic()
    final = archive_path(cache_dir, sha256)
    if final.is_file():
        touch(final)
        return FetchStats(final, False, 0, 0.0)
    with _lock(cache_dir / "locks" / f"archive-{sha256}.lock"):
        if final.is_file():
            return FetchStats(final, False, 0, time.monotonic() - start)
        attempts = _download(source, final, sha256=sha256, size=size,
                             retries=retries, backoff_s=backoff_s)  # fmt: skip
    return FetchStats(final, True, attempts, time.monotonic() - start)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _download(
    source: RemoteSource, final: Path, *, sha256: str, size: int, retries: int, backoff_s: float
) -> int:
    def copy(out: IO[bytes]) -> None:
        _stream(source, out, sha256=sha256, size=size)

    return _retrying(source, final, copy, retries=retries, backoff_s=backoff_s)


def _retrying(
    source: RemoteSource,
    final: Path,
    copy: Callable[[IO[bytes]], None],
    *,
    retries: int,
    backoff_s: float,
) -> int:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.part")
    try:
        for attempt in range(1, retries + 1):
            try:
                with tmp.open("wb") as out:
                    copy(out)
            except _Retryable as exc:
                if attempt == retries:
                    raise ArchiveRefused(
                        f"archive download failed after {attempt} attempts: {exc}",
                        source=_describe(source), attempts=attempt,
                    ) from exc  # fmt: skip
                time.sleep(backoff_s * 2 ** (attempt - 1))
                continue
            tmp.rename(final)
            return attempt
    finally:
        tmp.unlink(missing_ok=True)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class Unpinned:
    """An archive downloaded before anything pinned it (``pack lock --url``): its bytes'
    digest and size, at ``path`` in the cache (content-addressed by that digest)."""

    path: Path
    sha256: str
    size: int
    attempts: int


def download_unpinned(
    source: HttpsSource,
    cache_dir: Path,
    *,
    max_bytes: int,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
) -> Unpinned:
    """Download *source* (no pin yet: what ``pack lock`` hashes) into the cache.

    Streamed and hashed as it arrives, at most *max_bytes* (more aborts the transfer),
    retried like ``fetch``; the file appears complete under its own digest's name.

    Raises:
        ArchiveRefused: more than *max_bytes*, an HTTP refusal, or failures after
            ``retries`` attempts.
    """
    digest, seen = hashlib.sha256(), 0

    def copy(out: IO[bytes]) -> None:
        nonlocal digest, seen
        digest, seen = hashlib.sha256(), 0  # a retry starts over
        with _open(source) as chunks:
            for chunk in chunks:
                seen += len(chunk)
                if seen > max_bytes:
                    raise ArchiveRefused(
                        f"archive from {source.url} is larger than {max_bytes} bytes",
                        source=source.url, max_bytes=max_bytes,
                    )  # fmt: skip
                digest.update(chunk)
                out.write(chunk)

    token = f"unpinned-{os.getpid()}-{time.monotonic_ns()}"
    landing = cache_dir / "archives" / f".{token}"
    attempts = _retrying(source, landing, copy, retries=retries, backoff_s=backoff_s)
    final = archive_path(cache_dir, digest.hexdigest())
    landing.replace(final)
    return Unpinned(final, digest.hexdigest(), seen, attempts)


def _stream(source: RemoteSource, out: IO[bytes], *, sha256: str, size: int) -> None:
    digest = hashlib.sha256()
    seen = 0
    with _open(source) as chunks:
        for chunk in chunks:
            seen += len(chunk)
            if seen > size:
                raise DigestMismatch(
                    f"archive from {_describe(source)} is larger than pinned {size} bytes",
                    source=_describe(source), expected=size, actual=f">{size}",
                )  # fmt: skip
            digest.update(chunk)
            out.write(chunk)
    if seen != size or digest.hexdigest() != sha256:
        raise DigestMismatch(
            f"archive from {_describe(source)} does not match its pin",
            source=_describe(source),
            expected={"sha256": sha256, "size": size},
            actual={"sha256": digest.hexdigest(), "size": seen},
        )


def _describe(source: RemoteSource) -> str:
    return source.url if isinstance(source, HttpsSource) else f"s3://{source.bucket}/{source.key}"


@contextlib.contextmanager
def _open(source: RemoteSource) -> Iterator[Iterable[bytes]]:
    if isinstance(source, HttpsSource):
        with _open_https(source) as chunks:
            yield chunks
    else:
        with _open_s3(source) as chunks:
            yield chunks


@contextlib.contextmanager
def _open_https(source: HttpsSource) -> Iterator[Iterable[bytes]]:
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    request = urllib.request.Request(source.url, headers={"User-Agent": "acp-worker"})  # noqa: S310 - scheme checked by the model
    try:
        response = urllib.request.urlopen(request, timeout=source.timeout_s)  # noqa: S310
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Retryable(f"HTTP {exc.code}") from exc
        raise ArchiveRefused(f"HTTP {exc.code} from {source.url}", status=exc.code) from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):  # retrying cannot help
            raise ArchiveRefused(
                f"{source.url}: the server's certificate is not trusted: {exc.reason} (a "
                "private CA: SSL_CERT_FILE)",
                source=source.url,
            ) from exc
        raise _Retryable(str(exc)) from exc
    except OSError as exc:
        raise _Retryable(str(exc)) from exc
    with response:
        try:
            yield iter(lambda: response.read(CHUNK), b"")
        except (OSError, http.client.HTTPException) as exc:
            raise _Retryable(str(exc)) from exc


@contextlib.contextmanager
def _open_s3(source: S3Source) -> Iterator[Iterable[bytes]]:
    try:
        import boto3
        import botocore.exceptions
    except ImportError as exc:
        raise InvalidInput("S3 pack sources need the `s3` extra (boto3)") from exc
    client: Any = boto3.client("s3", region_name=source.region, endpoint_url=source.endpoint_url)
    try:
        body = client.get_object(Bucket=source.bucket, Key=source.key)["Body"]
    except botocore.exceptions.ClientError as exc:
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if status >= 500 or status == 429:
            raise _Retryable(str(exc)) from exc
        raise ArchiveRefused(f"S3 refused {_describe(source)}: {exc}", status=status) from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise _Retryable(str(exc)) from exc
    try:
        yield body.iter_chunks(CHUNK)
    except botocore.exceptions.BotoCoreError as exc:
        raise _Retryable(str(exc)) from exc
    finally:
        body.close()


# --- cache bookkeeping -----------------------------------------------------------------


def touch(path: Path) -> None:
    """Mark a cache entry as used now (``gc`` removes the least recently used first)."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(path, follow_symlinks=False)


__all__ = [
    "FetchStats",
    "HttpsSource",
    "RemoteSource",
    "S3Source",
    "Unpinned",
    "archive_path",
    "download_unpinned",
    "fetch",
    "touch",
]
