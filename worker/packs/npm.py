"""Provider packs from npm: pin a package and its dependency tree, build it reproducibly.

The pack folder holds the pinned tree as npm describes it: ``package.json`` (one exact
dependency, the agent) and npm's ``package-lock.json`` (every package of the tree with
its version and integrity hash). Both are committed; the archive is not.

    lock_npm("@agentclientprotocol/claude-agent-acp@0.49.0", pack_dir, bin_name=None)
        pin the tree (``npm install`` into a clean prefix when the lock is missing or
        names another version, ``npm ci`` otherwise), build the archive, ``lock_archive``
    build_npm(pack_dir)
        rebuild ``dist/`` from the committed lock (``npm ci``) and refuse it unless its
        sha256 is the pinned one; a no-op when ``dist/`` already holds the pinned bytes

Installs never run package scripts (``--ignore-scripts``): a pack is files, not the
side effects of an installer. The archive is byte-deterministic: entries sorted by their
UTF-8 path, mtime 0, uid/gid 0, empty owner names, modes 0755 (directories and files
with any execute bit) or 0644, PAX headers only where USTAR cannot hold a name, no
compression. What npm writes about the install rather than the packages is left out:
``node_modules/.bin/`` (symlinks; the launch runs the real entry with ``/usr/bin/node``)
and ``node_modules/.package-lock.json`` (npm's cache of the tree it just built). Any
other symlink refuses the build.

Files of the packages that running them never reads are left out too, by file name
(case-insensitively, anywhere in the tree; ``RUNTIME_UNUSED``): every launch checks the
closure with one ``lstat`` per entry, and these are about half of claude-agent-acp's:

- TypeScript declarations (``*.d.ts``, ``*.d.mts``, ``*.d.cts``): types for a compiler,
  which is not part of the launch; Node does not load them (its ``types`` export
  condition is never chosen), and no pack's tree has a TypeScript compiler that would
  read them as its library. Other ``.ts`` files stay.
- Source maps (``*.map``): read only to rewrite stack traces, under
  ``--enable-source-maps`` (which the packs' launches do not turn on) or by
  ``source-map-support`` (in no pack's tree), and even then a missing map is ignored.

Markdown stays: gemini-cli reads its built-in skills (``bundle/builtin/*/SKILL.md``) and
the documentation its ``get_internal_docs`` tool returns (``bundle/docs/**/*.md``) at
run time. A directory left empty is kept in the archive; extraction creates directories
only as parents of files (the lock lists files), so it never reaches a closure.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Final

from worker.errors import ArchiveRefused, DigestMismatch, InvalidInput, WorkerError
from worker.packs._io import read_json, write_json
from worker.packs.archive import sha256_stream
from worker.packs.lock import LockResult, lock_archive
from worker.packs.manifest import MANIFEST, load_pack_dir
from worker.packs.names import ANY, Platform, check_platform, current_platform

PACKAGE_JSON: Final = "package.json"
PACKAGE_LOCK: Final = "package-lock.json"
NPM_FLAGS: Final = ("--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier")
# What npm writes about the install itself, never part of a closure.
SKIP_FILES: Final = frozenset({"node_modules/.package-lock.json"})
SKIP_DIR_NAMES: Final = frozenset({".bin"})
# Suffixes (of lowercased file names) of files Node never reads running a pack: see above.
RUNTIME_UNUSED: Final = (".d.ts", ".d.mts", ".d.cts", ".map")
_SPEC: Final = re.compile(
    r"^(?P<name>(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*)@(?P<version>\d+\.\d+\.\d+[0-9A-Za-z.+-]*)$"
)
_NPM_CPU: Final = {"linux-x64": "x64", "linux-arm64": "arm64"}
_TIMEOUT_S: Final = 900.0


class NpmFailed(WorkerError):
    """npm itself failed (network, registry, a tree that does not resolve)."""

    code = "npm_failed"


@dataclass(frozen=True, slots=True)
class NpmSpec:
    """An npm package at one exact version."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What ``build_npm`` did for one platform."""

    platform: Platform
    archive: Path
    sha256: str
    cached: bool


def parse_spec(spec: str) -> NpmSpec:
    """``name@x.y.z`` (scoped names too); raises InvalidInput for ranges and tags."""
    match = _SPEC.fullmatch(spec.strip())
    if match is None:
        raise InvalidInput(
            f"{spec!r} is not an npm package at an exact version (name@1.2.3)",
            field="spec",
            value=spec,
        )
    return NpmSpec(match["name"], match["version"])


def archive_name(pack: str, platform: Platform) -> str:
    """The archive's file name under the pack's ``dist/``."""
    return f"{pack}-{platform}.tar"


def lock_npm(
    spec: str,
    *,
    pack_dir: Path,
    platform: str | None = None,
    bin_name: str | None = None,
    npm: str = "npm",
) -> LockResult:
    """Pin *spec* with its dependency tree in *pack_dir* and lock the built archive.

    ``package.json`` and ``package-lock.json`` are (re)written when they do not pin
    exactly *spec*; the declaration (``pack.json``) must exist and its launch must run
    the package's entry (*bin_name*, default: the package's only or same-named bin).

    Raises InvalidInput (bad spec, no declaration, launch not running the entry),
    NpmFailed, ArchiveRefused (a symlink or special file in the tree).
    """
    wanted = parse_spec(spec)
    plat = check_platform(platform) if platform is not None else current_platform()
    _require_declaration(pack_dir)
    if _pinned_spec(pack_dir) != wanted:
        _write_package_json(pack_dir, wanted)
        (pack_dir / PACKAGE_LOCK).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="acpw-npm-") as tmp:
        prefix = Path(tmp) / "prefix"
        _install(pack_dir, prefix, platform=plat, npm=npm)
        _check_launch(pack_dir, prefix, wanted, bin_name)
        archive = pack_dir / "dist" / archive_name(pack_dir.name, plat)
        write_archive(prefix, archive)
    _set_version(pack_dir, wanted.version)
    return lock_archive(archive, pack_dir=pack_dir, name=pack_dir.name, platform=plat)


def build_npm(pack_dir: Path, *, npm: str = "npm") -> list[BuildResult]:
    """Rebuild every pinned platform's archive of the npm pack in *pack_dir*.

    A platform whose ``dist/`` archive already has the pinned sha256 is left as it is.
    Raises InvalidInput (not an npm pack), NpmFailed, or DigestMismatch (the rebuilt
    bytes differ from the pin: the build is not reproducible here, nothing is written).
    """
    pack = load_pack_dir(pack_dir)
    if not (pack_dir / PACKAGE_LOCK).is_file():
        raise InvalidInput(
            f"{pack_dir} has no {PACKAGE_LOCK}: not an npm pack, or never locked",
            path=str(pack_dir),
        )
    results = []
    for platform, pin in sorted(pack.manifest.platforms.items()):
        target = pin.archive.source.resolve(pack_dir)
        results.append(_build_one(pack_dir, platform, target, pin.archive.sha256, npm))
    return results


def _build_one(
    pack_dir: Path, platform: Platform, target: Path, sha256: str, npm: str
) -> BuildResult:
    if target.is_file() and _file_sha256(target) == sha256:
        return BuildResult(platform, target, sha256, cached=True)
    with tempfile.TemporaryDirectory(prefix="acpw-npm-") as tmp:
        prefix = Path(tmp) / "prefix"
        _install(pack_dir, prefix, platform=platform, npm=npm, frozen=True)
        built = Path(tmp) / target.name
        actual = write_archive(prefix, built)
        if actual != sha256:
            raise DigestMismatch(
                f"rebuilt {target.name} is sha256 {actual}, pinned {sha256}: the npm tree "
                "did not rebuild byte-identically (re-lock, or find the unstable file)",
                path=str(target),
                expected=sha256,
                actual=actual,
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(built, target.with_name(f".{target.name}.tmp"))
        os.replace(target.with_name(f".{target.name}.tmp"), target)
    return BuildResult(platform, target, sha256, cached=False)


# --- the pinned tree ---------------------------------------------------------------


def _require_declaration(pack_dir: Path) -> None:
    if not (pack_dir / MANIFEST).is_file():
        raise InvalidInput(
            f"{pack_dir / MANIFEST} does not exist: write the pack declaration first "
            '(launch.argv ["/usr/bin/node", "{pack}/node_modules/<package>/<entry>.js", …] '
            'and launch.runtime {"node": ">=20"}: the host\'s node runs it)',
            path=str(pack_dir / MANIFEST),
            field="pack.json",
        )


def _pinned_spec(pack_dir: Path) -> NpmSpec | None:
    path = pack_dir / PACKAGE_JSON
    if not (path.is_file() and (pack_dir / PACKAGE_LOCK).is_file()):
        return None
    deps = read_json(path).get("dependencies") or {}
    if len(deps) != 1:
        return None
    [(name, version)] = deps.items()
    return NpmSpec(str(name), str(version))


def _write_package_json(pack_dir: Path, spec: NpmSpec) -> None:
    write_json(
        pack_dir / PACKAGE_JSON,
        {
            "name": f"acpw-pack-{pack_dir.name}",
            "private": True,
            "description": "The npm tree of this provider pack (see acp-worker pack lock-npm).",
            "dependencies": {spec.name: spec.version},
        },
    )


def _set_version(pack_dir: Path, version: str) -> None:
    raw = read_json(pack_dir / MANIFEST)
    if isinstance(raw, dict) and raw.get("version") != version:
        raw["version"] = version
        write_json(pack_dir / MANIFEST, raw)


def _install(
    pack_dir: Path, prefix: Path, *, platform: Platform, npm: str, frozen: bool = False
) -> None:
    """``npm ci`` from the committed lock, else ``npm install`` (which writes the lock)."""
    prefix.mkdir(parents=True)
    shutil.copyfile(pack_dir / PACKAGE_JSON, prefix / PACKAGE_JSON)
    locked = (pack_dir / PACKAGE_LOCK).is_file()
    if locked:
        shutil.copyfile(pack_dir / PACKAGE_LOCK, prefix / PACKAGE_LOCK)
    elif frozen:
        raise InvalidInput(f"{pack_dir} has no {PACKAGE_LOCK} to build from")
    action = ["ci"] if locked else ["install", "--save-exact"]
    _npm(npm, [*action, *NPM_FLAGS, *_platform_flags(platform)], cwd=prefix)
    if not locked:
        shutil.copyfile(prefix / PACKAGE_LOCK, pack_dir / PACKAGE_LOCK)


def _platform_flags(platform: Platform) -> list[str]:
    # Optional native dependencies (the agents' bundled binaries) are chosen by os/cpu.
    if platform == ANY:
        return []
    return ["--os=linux", f"--cpu={_NPM_CPU[platform]}", "--libc=glibc"]


def _npm(npm: str, args: Sequence[str], *, cwd: Path) -> None:
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_loglevel": "warn"}
    try:
        done = subprocess.run(
            [npm, *args],
            check=False,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NpmFailed(f"cannot run {npm} {args[0]}: {exc}", args=list(args)) from exc
    if done.returncode != 0:
        raise NpmFailed(
            f"{npm} {args[0]} failed with exit {done.returncode}",
            args=list(args),
            stderr=done.stderr[-4096:],
        )


def _check_launch(pack_dir: Path, prefix: Path, spec: NpmSpec, bin_name: str | None) -> None:
    entry = f"{{pack}}/node_modules/{spec.name}/{package_entry(prefix, spec.name, bin_name)}"
    argv = read_json(pack_dir / MANIFEST).get("launch", {}).get("argv", [])
    if entry not in argv:
        raise InvalidInput(
            f"{pack_dir / MANIFEST}: launch.argv does not run the package's entry {entry}",
            path=str(pack_dir / MANIFEST),
            field="launch.argv",
            suggested=["/usr/bin/node", entry],
        )


def package_entry(prefix: Path, package: str, bin_name: str | None = None) -> str:
    """The installed package's bin script, relative to its folder.

    Raises InvalidInput when the package has no such bin (or several and none chosen).
    """
    meta = read_json(prefix / "node_modules" / package / PACKAGE_JSON)
    bins = meta.get("bin")
    if isinstance(bins, str):
        bins = {package.rsplit("/", 1)[-1]: bins}
    bins = bins if isinstance(bins, dict) else {}
    short = package.rsplit("/", 1)[-1]
    chosen = bin_name or (next(iter(bins)) if len(bins) == 1 else short)
    if chosen not in bins:
        raise InvalidInput(
            f"{package} has no bin {chosen!r} (it has: {', '.join(sorted(bins)) or 'none'})",
            field="bin",
            available=sorted(bins),
        )
    return PurePosixPath(str(bins[chosen])).as_posix().removeprefix("./")


# --- the deterministic archive -----------------------------------------------------


def write_archive(root: Path, target: Path) -> str:
    """Write the deterministic tar of *root* to *target* atomically; its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as out:
            _write_tar(root, out)
        with tmp.open("rb") as src:
            sha256, _ = sha256_stream(src)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return sha256


def _write_tar(root: Path, out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path, st_mode in collect(root):
            info = _tar_info(name, st_mode)
            if info.isdir():
                tar.addfile(info)
                continue
            with path.open("rb") as data:
                info.size = os.fstat(data.fileno()).st_size
                tar.addfile(info, data)


def _tar_info(name: str, st_mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    is_dir = stat.S_ISDIR(st_mode)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir or st_mode & 0o111 else 0o644
    return info


def collect(root: Path) -> list[tuple[str, Path, int]]:
    """Every (archive name, path, st_mode) under *root*, sorted by UTF-8 name.

    Files ``runtime_unused`` names are not among them. Raises ArchiveRefused for a
    symlink outside ``.bin`` or a special file.
    """
    entries = list(_walk(root))
    entries.sort(key=lambda entry: entry[0].encode("utf-8"))
    return entries


def _walk(root: Path) -> Iterator[tuple[str, Path, int]]:
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not _skipped_dir(base, d)]
        for name in [*dirnames, *filenames]:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if rel in SKIP_FILES:
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise ArchiveRefused(
                    f"symlink in the npm tree: {rel} -> {os.readlink(path)}", member=rel
                )
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise ArchiveRefused(f"not a regular file or directory: {rel}", member=rel)
            if stat.S_ISREG(st.st_mode) and runtime_unused(name):
                continue
            yield rel, path, st.st_mode


def runtime_unused(name: str) -> bool:
    """Whether a file named *name* is one Node never reads running a pack (left out)."""
    return name.lower().endswith(RUNTIME_UNUSED)


def _skipped_dir(base: Path, name: str) -> bool:
    return name in SKIP_DIR_NAMES and base.name == "node_modules"


def _file_sha256(path: Path) -> str:
    with path.open("rb") as src:
        return sha256_stream(src)[0]


def describe(results: Sequence[BuildResult]) -> list[dict[str, object]]:
    """``build_npm``'s results as JSON-able records."""
    return [
        {
            "platform": r.platform,
            "archive": str(r.archive),
            "sha256": r.sha256,
            "cached": r.cached,
        }
        for r in results
    ]
