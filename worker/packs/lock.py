"""``pack lock``: inventory a vendor archive and pin it in the pack's declaration.

The declaration (``pack.json`` without pins) is hand-written; locking fills in one
platform's pins and writes ``lock/<platform>.json``, leaving the rest of ``pack.json``
as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.errors import ArchiveRefused, InvalidInput
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
from worker.packs.manifest import MANIFEST, parse_manifest
from worker.packs.names import Platform, check_pack_name, check_platform


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
    source: str


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
    raw = _declaration(manifest_path, check_pack_name(name))
    source = _source(archive_path, pack_dir, raw, plat)
    archive, lock = _inventory(archive_path, source, name=name, platform=plat, limits=limits)
    raw.setdefault("platforms", {})[plat] = _pin(archive, lock)
    parse_manifest(raw, path=manifest_path)  # never write a manifest we would not load
    lock_path = pack_dir / "lock" / f"{plat}.json"
    write_lock(lock_path, lock)
    write_json(manifest_path, raw)
    return LockResult(
        name, plat, archive.sha256, archive.size, archive.format, source,
        lock.closure_digest, len(lock.files), lock.total_bytes, lock_path, manifest_path,
    )  # fmt: skip


def _declaration(manifest_path: Path, name: str) -> dict[str, Any]:
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
    assert isinstance(raw, dict)  # parse_manifest accepted it, so it is an object
    return raw


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
    archive_path: Path, source: str, *, name: str, platform: Platform, limits: ExtractLimits
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


def _pin(archive: _Archive, lock: ClosureLock) -> dict[str, Any]:
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
