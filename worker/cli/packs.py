"""``acp-worker pack …``: lock, verify and materialize provider packs; collect the cache.

``PACK`` is a pack name in ``settings.packs_dir`` or a path to a pack folder.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

from worker.cli import add_json_flag
from worker.errors import InvalidInput
from worker.packs.archive import DEFAULT_LIMITS
from worker.packs.cache import materialize
from worker.packs.gc import DEFAULT_BUDGET, GcResult, gc
from worker.packs.lock import LockResult, lock_archive, lock_url
from worker.packs.manifest import Pack, load_pack, load_pack_dir
from worker.packs.names import PACK_NAME_RE, PLATFORMS
from worker.packs.runtime import prepare_pack
from worker.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pack lock|verify|materialize|lock-npm|build-npm|gc`` to the parser."""
    pack = sub.add_parser("pack", help="lock, verify or materialize a provider pack")
    add_json_flag(pack)
    actions = pack.add_subparsers(dest="pack_command", required=True, metavar="ACTION")
    _add_lock(actions)
    _add_verify(actions)
    _add_materialize(actions)
    _add_npm(actions)
    _add_gc(actions)


def _add_lock(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lock = actions.add_parser(
        "lock",
        help="inventory an archive and pin it in the pack",
        description="Two forms: `lock ARCHIVE --pack NAME --platform P` pins an archive "
        "file; `lock PACK [--url URL] [--platform P]` downloads the archive over HTTPS "
        "(default: the pack's `download` URL for the platform, default this host's) and "
        "pins it, its URL becoming the platform's source.",
    )
    lock.add_argument(
        "archive", metavar="ARCHIVE|PACK", help="tar or tar.gz archive (with --pack), or a pack"
    )
    lock.add_argument("--pack", metavar="NAME", help="pack name or folder (archive form)")
    lock.add_argument("--url", metavar="URL", help="download the archive from this HTTPS URL")
    lock.add_argument("--platform", choices=PLATFORMS, help="required in the archive form")
    lock.add_argument(
        "--max-bytes",
        type=parse_size,
        default=DEFAULT_LIMITS.max_bytes,
        metavar="SIZE",
        help="refuse an archive whose files add up to more (default: 4G)",
    )
    lock.add_argument(
        "--max-ratio",
        type=_ratio,
        default=DEFAULT_LIMITS.max_ratio,
        metavar="N",
        help="refuse an archive that expands to more than N times its size "
        f"(default: {DEFAULT_LIMITS.max_ratio})",
    )
    add_json_flag(lock)
    lock.set_defaults(handler=lock_command)


def _add_verify(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = actions.add_parser("verify", help="materialize if needed, then verify")
    _add_closure_args(verify)
    verify.set_defaults(handler=verify_command)


def _add_materialize(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mat = actions.add_parser("materialize", help="print the verified closure's path")
    _add_closure_args(mat)
    mat.set_defaults(handler=materialize_command)


def _add_closure_args(parser: argparse.ArgumentParser) -> None:
    """What `verify` and `materialize` both take: the pack, its platform, the cache."""
    parser.add_argument("pack", metavar="PACK", help="pack name or folder")
    parser.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
    parser.add_argument("--cache", type=Path, metavar="DIR", help="default: settings")
    add_json_flag(parser)


def _add_npm(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lock = actions.add_parser(
        "lock-npm", help="pin an npm package and its tree, build and lock its archive"
    )
    lock.add_argument("spec", metavar="SPEC", help="package at an exact version: name@1.2.3")
    lock.add_argument("--pack", required=True, metavar="NAME", help="pack name or folder")
    lock.add_argument("--bin", metavar="BIN", help="the package's bin the launch runs")
    lock.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
    add_json_flag(lock)
    lock.set_defaults(handler=lock_npm_command)
    build = actions.add_parser(
        "build-npm", help="rebuild an npm pack's archive from its lock; refuse other bytes"
    )
    build.add_argument("pack", metavar="PACK", help="pack name or folder")
    add_json_flag(build)
    build.set_defaults(handler=build_npm_command)


def _add_gc(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    collect = actions.add_parser(
        "gc", help="remove least-recently-used closures and archives until under a budget"
    )
    collect.add_argument(
        "--budget",
        type=parse_size,
        default=DEFAULT_BUDGET,
        metavar="SIZE",
        help="bytes the cache may keep: 500M, 10G, 1.5GiB, 0 (K/M/G/T are powers of 1024;"
        " default 10G)",
    )
    collect.add_argument("--cache", type=Path, metavar="DIR", help="default: settings")
    collect.add_argument("--dry-run", action="store_true", help="say what would be removed")
    add_json_flag(collect)
    collect.set_defaults(handler=gc_command)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``"10G"`` → 10737418240: a byte count with an optional binary unit."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 0, 500M, 10G)")
    return int(float(match[1]) * _UNITS[match[2].lower()])


def _ratio(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a ratio: {text!r} (a whole number, 1 or more)")
    return value


def human_size(count: int) -> str:
    """``1536`` → ``"1.5 KiB"``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def resolve_pack(ref: str, settings: Settings) -> Pack:
    """A pack by name in ``settings.packs_dir``, or by folder path.

    Raises PackNotFound or InvalidInput (see ``load_pack``).
    """
    if PACK_NAME_RE.fullmatch(ref):
        return load_pack(settings.packs_dir, ref)
    return load_pack_dir(Path(ref))


def _pack_dir(ref: str, settings: Settings) -> Path:
    return settings.packs_dir / ref if PACK_NAME_RE.fullmatch(ref) else Path(ref)


def _emit(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    print(json.dumps(data, ensure_ascii=False) if getattr(args, "json", False) else text)


def _lock_data(result: LockResult) -> dict[str, object]:
    return {
        "pack": result.pack,
        "platform": result.platform,
        "files": result.files,
        "bytes": result.bytes,
        "closure_digest": result.closure_digest,
        "archive_sha256": result.archive_sha256,
        "archive_size": result.archive_size,
        "source": result.source,
        "lock": str(result.lock_path),
    }


def lock_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack lock ARCHIVE --pack NAME --platform P`` or ``pack lock PACK [--url URL]``.

    Raises:
        InvalidInput: the two forms mixed, or the archive form without ``--platform``.
    """
    limits = replace(DEFAULT_LIMITS, max_bytes=args.max_bytes, max_ratio=args.max_ratio)
    if args.pack is None:
        pack_dir = _pack_dir(args.archive, settings)
        result = lock_url(pack_dir, name=pack_dir.name, url=args.url, platform=args.platform,
                          cache_dir=settings.cache_dir, limits=limits)  # fmt: skip
    else:
        if args.url is not None or args.platform is None:
            raise InvalidInput(
                "pack lock ARCHIVE --pack NAME takes --platform and no --url "
                "(to download: pack lock NAME --url URL)",
                field="platform" if args.url is None else "url",
            )
        pack_dir = _pack_dir(args.pack, settings)
        result = lock_archive(Path(args.archive), pack_dir=pack_dir, name=pack_dir.name,
                              platform=args.platform, limits=limits)  # fmt: skip
    data = _lock_data(result)
    text = (
        f"locked {result.pack} for {result.platform}: {result.files} files, "
        f"{result.bytes} bytes, closure {result.closure_digest}"
    )
    _emit(args, data, text)
    return 0


def verify_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack verify PACK [--platform P] [--cache DIR]``."""
    pack = resolve_pack(args.pack, settings)
    if args.cache is not None:
        settings = settings.model_copy(update={"cache_dir": args.cache})
    prepared = prepare_pack(settings, pack, args.platform)  # the same check as every launch
    path, stats = prepared.closure, prepared.stats
    data = {
        "closure": str(path),
        "files": stats.files,
        "bytes": stats.bytes,
        "seconds": round(stats.seconds, 3),
    }
    text = f"{path}\nverified {stats.files} files, {stats.bytes} bytes in {stats.seconds:.3f} s"
    _emit(args, data, text)
    return 0


def materialize_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack materialize PACK [--platform P] [--cache DIR]``: the closure path on stdout."""
    pack = resolve_pack(args.pack, settings)
    path = materialize(pack, args.cache or settings.cache_dir, platform=args.platform)
    _emit(args, {"closure": str(path)}, str(path))
    return 0


def lock_npm_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack lock-npm SPEC --pack NAME [--bin BIN] [--platform P]``."""
    from worker.packs.npm import lock_npm

    pack_dir = _pack_dir(args.pack, settings)
    result = lock_npm(args.spec, pack_dir=pack_dir, platform=args.platform, bin_name=args.bin)
    data = _lock_data(result)
    text = (
        f"locked {args.spec} as {result.pack} for {result.platform}: {result.files} files, "
        f"{result.bytes} bytes, archive sha256 {result.archive_sha256}"
    )
    _emit(args, data, text)
    return 0


def build_npm_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack build-npm PACK``: rebuild dist/ from the committed npm lock (cached)."""
    from worker.packs.npm import build_npm, describe

    results = build_npm(_pack_dir(args.pack, settings))
    lines = [
        f"{r.archive}: {'already pinned bytes' if r.cached else 'rebuilt'} (sha256 {r.sha256})"
        for r in results
    ]
    _emit(args, {"archives": describe(results)}, "\n".join(lines))
    return 0


def gc_command(args: argparse.Namespace, settings: Settings) -> int:
    """``pack gc [--budget SIZE] [--cache DIR] [--dry-run]``: entries in use are kept."""
    result = gc(args.cache or settings.cache_dir, args.budget, dry_run=args.dry_run)
    _emit(args, result.to_json(), _gc_text(result))
    return 0


def _gc_text(result: GcResult) -> str:
    lines = [
        f"{d.action.replace('_', ' '):<12} {d.entry.kind:<8} {d.entry.name}  "
        f"{human_size(d.entry.bytes)}, last used {d.to_json()['last_used']} ({d.reason})"
        for d in result.decisions
    ]
    verb = "would free" if result.dry_run else "freed"
    summary = (
        f"{verb} {human_size(result.freed_bytes)}; kept {human_size(result.kept_bytes)} "
        f"of a {human_size(result.budget_bytes)} budget"
    )
    if result.over_budget:
        summary += " (over budget: the rest is in use)"
    return "\n".join([*lines, summary])
