#!/usr/bin/env python3
"""Build dist/cursor-emulator-linux.tar byte-deterministically from src/.

Deterministic means: entries sorted by path, mtime 0, uid/gid 0, empty owner names,
modes normalised (0755 for directories and the entry script, 0644 otherwise), USTAR,
no compression. Same src/ -> same bytes, on the venv Python and on /usr/bin/python3.
Prints "<sha256>  <path>" (sha256sum's format). Stdlib only; pack.json is not ours.

    python build.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import tarfile
from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent
SRC = PACK_DIR / "src"
ARCHIVE_NAME = "cursor-emulator-linux.tar"
EXECUTABLES = {"cursor_emulator.py"}
# Build litter from running the emulator or tests in place must never reach the archive.
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo", "~", ".swp")


class BuildError(Exception):
    pass


def collect(src: Path) -> list[tuple[str, Path]]:
    """Every (archive name, path) under src, sorted, directories included."""
    entries: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        base = Path(dirpath)
        for name in [*dirnames, *filenames]:
            if name.startswith(".") or name.endswith(SKIP_SUFFIXES):
                continue
            path = base / name
            if path.is_symlink():
                raise BuildError(f"symlinks are not allowed in the pack: {path}")
            if not (path.is_dir() or path.is_file()):
                raise BuildError(f"not a regular file or directory: {path}")
            entries.append((path.relative_to(src).as_posix(), path))
    entries.sort(key=lambda e: e[0])
    return entries


def tar_info(name: str, path: Path) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.type = tarfile.REGTYPE
        info.mode = 0o755 if name in EXECUTABLES else 0o644
        info.size = path.stat().st_size
    return info


def build_bytes(src: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path in collect(src):
            info = tar_info(name, path)
            if info.isdir():
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_atomic(target: Path, data: bytes) -> None:
    # `make test` may run in parallel checkouts of the same tree: never expose half a file.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACK_DIR / "dist", help="output directory")
    args = parser.parse_args(argv)
    try:
        data = build_bytes(SRC)
    except (BuildError, OSError) as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
    target = args.out / ARCHIVE_NAME
    write_atomic(target, data)
    print(f"{hashlib.sha256(data).hexdigest()}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
