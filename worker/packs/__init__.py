"""Provider packs: a manifest, a locked closure per platform, a verified cache.

    load_pack(packs_dir, name) -> Pack          manifest + folder
    Pack.for_platform(p) -> PlatformTarget      exact platform, else ``any``
    lock_archive(archive, pack_dir=, name=, platform=) -> LockResult
    lock_url(pack_dir, name=, url=, platform=, cache_dir=) -> LockResult   over HTTPS
    check_declared(manifest)                    the dialect's launch contract (cursor)
    materialize(pack, cache_dir, platform=) -> Path   content-addressed, atomic
    verify_closure(path, lock) -> VerifyStats   before every launch
    closure_digest(entries) -> "sha256:<hex>"   the one definition

Errors: PackNotFound / InvalidInput (exit 2), DigestMismatch, ArchiveRefused (its
UnsupportedFormat: zip, xz, …), PlatformUnsupported, PackUnlocked (a recipe with no pins),
LaunchRefused (a launch breaking its dialect's contract) (exit 3), all from
``worker.errors``.
"""

from worker.packs.archive import DEFAULT_LIMITS, ExtractLimits, extract_tar, extract_verified
from worker.packs.cache import closure_path, materialize
from worker.packs.closure import ClosureLock, FileEntry, closure_digest, read_lock
from worker.packs.contract import check_declared
from worker.packs.lock import LockResult, lock_archive, lock_url
from worker.packs.manifest import (
    Pack,
    PackManifest,
    PlatformTarget,
    load_pack,
    load_pack_dir,
    parse_manifest,
)
from worker.packs.names import PLATFORMS, Platform, current_platform
from worker.packs.verify import VerifyStats, verify_closure

__all__ = [
    "DEFAULT_LIMITS",
    "PLATFORMS",
    "ClosureLock",
    "ExtractLimits",
    "FileEntry",
    "LockResult",
    "Pack",
    "PackManifest",
    "Platform",
    "PlatformTarget",
    "VerifyStats",
    "check_declared",
    "closure_digest",
    "closure_path",
    "current_platform",
    "extract_tar",
    "extract_verified",
    "load_pack",
    "load_pack_dir",
    "lock_archive",
    "lock_url",
    "materialize",
    "parse_manifest",
    "read_lock",
    "verify_closure",
]
