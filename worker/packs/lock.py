"""``pack lock``: inventory a vendor archive and pin it in the pack's declaration.

The declaration (``pack.json`` without pins) is hand-written; locking fills in one
platform's pins and writes ``lock/<platform>.json``, leaving the rest of ``pack.json``
as it was. The archive is a file (``lock_archive``) or an HTTPS URL (``lock_url``:
downloaded into the cache, hashed as it arrives, then inventoried the same way, its URL
becoming the platform's source). A declaration whose launch breaks its dialect's
contract is refused before anything is read (``worker.packs.contract``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.errors import ArchiveRefused, InvalidInput, WorkerError
from worker.packs._io import read_json, write_json
from worker.packs.archive import (
    DEFAULT_LIMITS,
    ArchiveFormat,
    ExtractLimits,
    detect_format,
    extract_tar,
    sha256_stream,
)
from worker.packs.closure import ClosureLock, write_lock
from worker.packs.contract import check_declared
from worker.packs.manifest import MANIFEST, PackManifest, parse_manifest
from worker.packs.names import Platform, check_pack_name, check_platform, current_platform
from worker.packs.sources import HttpsSource, download_unpinned


@dataclass(frozen=True, slots=True)
class LockResult:
    """What ``lock_archive`` pinned and where it wrote it."""

    pack: str
    platform: Platform
    archive_sha256: str
    archive_size: int
    archive_format: ArchiveFormat
    source: str
    closure_digest: str
    files: int
    bytes: int
    lock_path: Path
    manifest_path: Path


@dataclass(frozen=True, slots=True)
class _Archive:
    sha256: str
    size: int
    format: ArchiveFormat
    #: A pack-folder path, or a remote source's JSON (``{"kind": "https", "url": …}``).
    source: str | dict[str, Any]


def lock_archive(
    archive_path: Path,
    *,
    pack_dir: Path,
    name: str,
    platform: str,
    limits: ExtractLimits = DEFAULT_LIMITS,
) -> LockResult:
    """Inventory *archive_path* and pin it as *platform* of the pack in *pack_dir*.

    The archive is read once, with the same refusals as materialization, and every file
    hashed as it streams by: nothing is written (materialization is the one extraction).
    The expanded stream and the files' bytes are bounded by *limits*: ``max_bytes`` (the
    operator's cap) and ``max_ratio`` times the archive's size. Its ``source`` is
    recorded relative to *pack_dir* when the archive lives under it; otherwise the
    platform's existing source is kept.

    Raises InvalidInput (bad name or platform, no or malformed ``pack.json``, unreadable
    archive, no source to record), UnsupportedFormat (zip, xz, …) or ArchiveRefused (an
    entry the extractor refuses, a bound exceeded, a truncated or corrupt archive, an
    archive without a single file).
    """
    plat = check_platform(platform)
    manifest_path = pack_dir / MANIFEST
    raw, _ = _declaration(manifest_path, check_pack_name(name))
    source = _source(archive_path, pack_dir, raw, plat)
    archive, lock = _inventory(archive_path, source, name=name, platform=plat, limits=limits)
    return _write(pack_dir, raw, archive, lock)


def lock_url(
    pack_dir: Path,
    *,
    name: str,
    url: str | None,
    platform: str | None,
    cache_dir: Path,
    limits: ExtractLimits = DEFAULT_LIMITS,
) -> LockResult:
    """Download the archive at *url* (default: the declaration's ``download`` entry for
    *platform*, default this host's) over HTTPS and pin it as that platform's.

    The bytes land in the cache under their digest (the first materialization then
    downloads nothing), at most ``limits.max_bytes`` of them; the inventory is
    ``lock_archive``'s, and the URL becomes the platform's source.

    Raises InvalidInput (bad name, platform or URL; no URL to lock from), LaunchRefused
    (the declaration breaks its dialect's launch contract: nothing is downloaded), and
    ArchiveRefused, UnsupportedFormat like ``lock_archive`` (a failed download too).
    """
    plat = check_platform(platform) if platform is not None else current_platform()
    raw, manifest = _declaration(pack_dir / MANIFEST, check_pack_name(name))
    source = _https_source(url, manifest, plat)
    fetched = download_unpinned(source, cache_dir, max_bytes=limits.max_bytes)
    remote = {"kind": "https", "url": source.url}
    try:
        archive, lock = _inventory(fetched.path, remote, name=name, platform=plat,
                                   limits=limits)  # fmt: skip
    except WorkerError:
        fetched.path.unlink(missing_ok=True)  # bytes nothing pins stay out of the cache
        raise
    return _write(pack_dir, raw, archive, lock)


def _https_source(url: str | None, manifest: PackManifest, platform: Platform) -> HttpsSource:
    if url is None:
        recipe = (manifest.download or {}).get(platform)
        if recipe is None:
            raise InvalidInput(
                f"pack {manifest.name!r} names no download for {platform}: pass --url",
                field="download",
                platform=platform,
            )
        return recipe
    try:
        return HttpsSource(url=url)
    except ValidationError as exc:
        raise InvalidInput(
            f"not an HTTPS URL: {url!r} (plain http only to loopback)", field="url"
        ) from exc


def _write(pack_dir: Path, raw: dict[str, Any], archive: _Archive, lock: ClosureLock) -> LockResult:
    manifest_path = pack_dir / MANIFEST
    plat = lock.platform
    raw.setdefault("platforms", {})[plat] = _pin(archive, lock)
    parse_manifest(raw, path=manifest_path)  # never write a manifest we would not load
    lock_path = pack_dir / "lock" / f"{plat}.json"
    write_lock(lock_path, lock)
    write_json(manifest_path, raw)
    source = archive.source if isinstance(archive.source, str) else archive.source["url"]
    return LockResult(
        lock.pack, plat, archive.sha256, archive.size, archive.format, source,
        lock.closure_digest, len(lock.files), lock.total_bytes, lock_path, manifest_path,
    )  # fmt: skip


def _declaration(manifest_path: Path, name: str) -> tuple[dict[str, object], PackManifest]:
    if not manifest_path.is_file():
        raise InvalidInput(
            f"{manifest_path} does not exist: write the pack declaration first",
            path=str(manifest_path),
            field="pack.json",
        )
    raw = read_json(manifest_path)
    manifest = parse_manifest(raw, path=manifest_path)
    if manifest.name != name:
        raise InvalidInput(
            f"{manifest_path} declares pack {manifest.name!r}, not {name!r}",
            path=str(manifest_path),
            field="name",
        )
    check_declared(manifest)  # a launch the worker would refuse is never pinned
    assert isinstance(raw, dict)  # parse_manifest accepted it, so it is an object
    return raw, manifest


def _source(archive: Path, pack_dir: Path, raw: dict[str, Any], platform: Platform) -> str:
    try:
        return archive.resolve().relative_to(pack_dir.resolve()).as_posix()
    except ValueError:
        pass
    existing = raw.get("platforms", {}).get(platform, {}).get("archive", {}).get("source")
    if isinstance(existing, str):
        return existing
    raise InvalidInput(
        f"archive {archive} is outside the pack folder {pack_dir} and {platform} has no "
        "source yet: put the archive under the pack folder (e.g. dist/)",
        path=str(archive),
        field="source",
    )


def _inventory(
    archive_path: Path,
    source: str | dict[str, Any],
    *,
    name: str,
    platform: Platform,
    limits: ExtractLimits,
) -> tuple[_Archive, ClosureLock]:
    fmt = detect_format(archive_path)
    try:
        src = archive_path.open("rb")
    except OSError as exc:
        raise InvalidInput(f"cannot open archive {archive_path}: {exc}") from exc
    with src:
        sha256, size = sha256_stream(src)
        src.seek(0)
        files = extract_tar(src, None, fmt=fmt, limits=limits)
    if not files:
        raise ArchiveRefused(
            f"archive {archive_path} holds no file: a closure cannot be empty",
            path=str(archive_path),
            reason="empty closure",
        )
    lock = ClosureLock.build(pack=name, platform=platform, archive_sha256=sha256, files=files)
    return _Archive(sha256, size, fmt, source), lock


def _pin(archive: _Archive, lock: ClosureLock) -> dict[str, object]:
    return {
        "archive": {
            "source": archive.source,
            "sha256": archive.sha256,
            "size": archive.size,
            "format": archive.format,
        },
        "closure": {
            "digest": lock.closure_digest,
            "files": len(lock.files),
            "bytes": lock.total_bytes,
        },
    }
