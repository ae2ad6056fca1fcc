"""Provider packs against real tar archives, a real cache folder and real processes."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from worker.cli import packs as packs_cli
from worker.errors import (
    ArchiveRefused,
    DigestMismatch,
    InvalidInput,
    PackNotFound,
    PlatformUnsupported,
)
from worker.packs import verified
from worker.packs.archive import ArchiveFormat, ExtractLimits, extract_tar, extract_verified
from worker.packs.cache import closure_path, materialize
from worker.packs.closure import ClosureLock
from worker.packs.lock import lock_archive
from worker.packs.manifest import Pack, PlatformTarget, load_pack
from worker.packs.runtime import load_declaration, prepare_pack
from worker.packs.verify import verify_closure
from worker.safetree import remove_tree
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]
Member = tuple[tarfile.TarInfo, bytes | None]

FILES: dict[str, tuple[bytes, int]] = {
    "bin/agent": (b"#!/bin/sh\necho agent\n", 0o755),
    "index.js": (b"console.log('hi')\n" * 100, 0o644),
    "lib/chunks/5672.index.js": (os.urandom(300_000), 0o600),
    "lib/native/addon.node": (os.urandom(2_500_000), 0o700),
    "assets/empty.txt": (b"", 0o644),
}


# -- archive builders ------------------------------------------------------------------------


def reg(name: str, data: bytes = b"x", mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def entry(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o755
    return info, None


def tar_bytes(members: Iterable[Member], *, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def closure_members(files: dict[str, tuple[bytes, int]]) -> list[Member]:
    return [reg(name, data, mode) for name, (data, mode) in files.items()]


def extract(members: Iterable[Member], dest: Path, **limits: int) -> list[Any]:
    data = tar_bytes(members)
    return extract_tar(io.BytesIO(data), dest, fmt="tar", limits=ExtractLimits(**limits))


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# -- packs -----------------------------------------------------------------------------------


def declaration(name: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "name": name,
        "version": "1.2.3",
        "provider": "cursor",
        "dialect": "acp",  # a toy agent, not under the cursor launch contract
        "launch": {"argv": ["{pack}/bin/agent", "acp"], "credentials": ["CURSOR_API_KEY"]},
    }


def make_pack(
    packs_dir: Path,
    name: str = "demo",
    files: dict[str, tuple[bytes, int]] | None = None,
    *,
    platform: str = "any",
    gz: bool = False,
) -> Pack:
    pack_dir = packs_dir / name
    (pack_dir / "dist").mkdir(parents=True)
    (pack_dir / "pack.json").write_text(json.dumps(declaration(name)))
    archive = pack_dir / "dist" / ("demo.tar.gz" if gz else "demo.tar")
    archive.write_bytes(tar_bytes(closure_members(files or FILES), gz=gz))
    lock_archive(archive, pack_dir=pack_dir, name=name, platform=platform)
    return load_pack(packs_dir, name)


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", packs_dir=tmp_path / "packs")


@pytest.fixture
def pack(cfg: Settings) -> Pack:
    return make_pack(cfg.packs_dir)


# -- archive digest before extraction --------------------------------------------------------


@pytest.mark.parametrize("tamper", ["flip", "append"])
def test_tampered_archive_never_extracts(cfg: Settings, pack: Pack, tamper: str) -> None:
    archive = pack.archive_path(pack.for_platform())
    data = bytearray(archive.read_bytes())
    if tamper == "flip":
        data[600] ^= 1  # inside the first member's data: still a readable tar
    else:
        data += b"\0" * 512
    archive.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch) as info:
        materialize(pack, cfg.cache_dir)
    assert info.value.details["path"] == str(archive)
    assert not (cfg.cache_dir / "closures").exists() or not any(
        (cfg.cache_dir / "closures").iterdir()
    )
    assert not any((cfg.cache_dir / "tmp").iterdir())


def test_extract_verified_checks_before_writing(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes([reg("a.txt", b"hello")]))
    dest = tmp_path / "dest"
    dest.mkdir()
    size = archive.stat().st_size
    with pytest.raises(DigestMismatch):
        extract_verified(archive, dest, sha256="0" * 64, size=size, fmt="tar")
    assert tree(dest) == set()


# -- refused entries -------------------------------------------------------------------------


REFUSED: dict[str, tuple[list[Member], str]] = {
    "symlink": ([entry("link", tarfile.SYMTYPE, "/etc/passwd")], "symbolic link"),
    "relative symlink": ([entry("link", tarfile.SYMTYPE, "a")], "symbolic link"),
    "hardlink": ([reg("a"), entry("b", tarfile.LNKTYPE, "a")], "hard link"),
    "char device": ([entry("null", tarfile.CHRTYPE)], "device file"),
    "block device": ([entry("sda", tarfile.BLKTYPE)], "device file"),
    "fifo": ([entry("pipe", tarfile.FIFOTYPE)], "FIFO"),
    "absolute": ([reg("/tmp/acpw-escape")], "absolute path"),
    "dotdot": ([reg("a/../../escape")], "'..'"),
    "dotdot dir": ([entry("..", tarfile.DIRTYPE)], "'..'"),
    "empty name": ([reg(".")], "empty name"),
    "duplicate": ([reg("a"), reg("a")], "duplicate entry"),
    "duplicate via ./": ([reg("a"), reg("./a")], "duplicate entry"),
    "file over dir": ([reg("d/x"), reg("d")], "duplicate entry"),
    "dir over file": ([reg("d"), entry("d", tarfile.DIRTYPE)], "duplicate entry"),
    "file under file": ([reg("a"), reg("a/b")], "is a file"),
    "control char": ([reg("a\nb")], "control character"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_entries(tmp_path: Path, case: str) -> None:
    members, reason = REFUSED[case]
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveRefused) as info:
        extract(members, dest)
    assert reason in info.value.details["reason"]
    assert info.value.details["member"] == members[-1][0].name
    assert tree(tmp_path) <= {"dest", "dest/a", "dest/d", "dest/d/x"}
    assert not Path("/tmp/acpw-escape").exists()


def test_refuses_overwriting_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a.txt").write_text("original")
    with pytest.raises(ArchiveRefused) as info:
        extract([reg("a.txt", b"evil")], dest)
    assert "overwrite" in info.value.details["reason"]
    assert (dest / "a.txt").read_text() == "original"


def test_refuses_writing_through_existing_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "d").symlink_to(outside)
    (dest / "f").symlink_to(outside / "f")
    for member in ("d/x", "f"):
        with pytest.raises(ArchiveRefused, match="overwrite"):
            extract([reg(member, b"evil")], dest)
    assert tree(outside) == set()


def test_bounds_stop_tar_bombs(tmp_path: Path) -> None:
    for i, (members, limits) in enumerate(
        [
            ([reg(f"f{i}") for i in range(3)], {"max_entries": 2}),
            ([reg("a", b"x" * 6), reg("b", b"y" * 6)], {"max_bytes": 10}),
        ]
    ):
        dest = tmp_path / str(i)
        dest.mkdir()
        with pytest.raises(ArchiveRefused, match=r"more than 2 entries|beyond 10 bytes"):
            extract(members, dest, **limits)


@pytest.mark.parametrize("data", [b"not a tar at all" * 100, b"\x1f\x8b" + b"\0" * 100])
def test_corrupt_archive_refused(tmp_path: Path, data: bytes) -> None:
    formats: tuple[ArchiveFormat, ...] = ("tar", "tar.gz")
    for fmt in formats:
        with pytest.raises(ArchiveRefused, match="corrupt"):
            extract_tar(io.BytesIO(data), tmp_path, fmt=fmt)


def test_tar_made_with_dot_prefix_and_dirs_is_accepted(tmp_path: Path) -> None:
    members = [entry(".", tarfile.DIRTYPE), entry("./lib", tarfile.DIRTYPE)]
    members += [entry("./empty", tarfile.DIRTYPE), reg("./lib/a.js", b"a", 0o755)]
    inventory = extract(members, tmp_path)
    assert [(e.path, e.mode, e.size) for e in inventory] == [("lib/a.js", "0755", 1)]
    assert tree(tmp_path) == {"lib", "lib/a.js"}  # empty directories are not in a closure
    assert stat.S_IMODE((tmp_path / "lib/a.js").stat().st_mode) == 0o755


# -- hypothesis: random member names and types -----------------------------------------------

ODD_PARTS = st.sampled_from(["..", ".", "", "/", "a\nb", "x" * 300])
NAME_PARTS = st.one_of(st.sampled_from(["a", "b", "é", "c d"]), ODD_PARTS)
NAMES = st.lists(NAME_PARTS, min_size=1, max_size=4).map("/".join)
TYPES = st.sampled_from(
    [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
     tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.CONTTYPE, b"Z", b"7"]
)  # fmt: skip
MEMBERS = st.lists(
    st.tuples(
        NAMES, TYPES, st.sampled_from(["", "..", "/etc", "a", "../../x"]), st.binary(max_size=64)
    ),
    max_size=6,
)


def _random_member(name: str, kind: bytes, link: str, data: bytes) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755
    regular = kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
    info.size = len(data) if regular else 0
    return info, data if regular else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MEMBERS)
def test_extractor_refuses_or_contains(members: list[tuple[str, bytes, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dest = root / "sandbox" / "dest"
        dest.mkdir(parents=True)
        try:
            built = tar_bytes(_random_member(*m) for m in members)
        except (ValueError, UnicodeError):  # tarfile itself cannot write that name
            return
        try:
            inventory = extract_tar(io.BytesIO(built), dest, fmt="tar")
            event("extracted")
        except ArchiveRefused as exc:
            inventory = None
            event(f"refused: {exc.details.get('reason', '')[:20]}")
        for path in root.rglob("*"):
            assert path == dest.parent or path.is_relative_to(dest)
            assert not path.is_symlink()
            assert path.is_dir() or path.is_file()
        if inventory is not None:
            assert {e.path for e in inventory} == {
                p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()
            }


# -- lock, materialize, verify ---------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_lock_materialize_verify_round_trip(cfg: Settings, gz: bool) -> None:
    pack = make_pack(cfg.packs_dir, gz=gz)
    pin = pack.for_platform().pin
    assert pin.archive.format == ("tar.gz" if gz else "tar")
    assert pin.archive.source.path == ("dist/demo.tar.gz" if gz else "dist/demo.tar")
    assert (pin.closure.files, pin.closure.bytes) == (
        len(FILES), sum(len(d) for d, _ in FILES.values()),
    )  # fmt: skip
    path = materialize(pack, cfg.cache_dir)
    assert path == closure_path(cfg.cache_dir, pin.closure.digest)
    for name, (data, mode) in FILES.items():
        assert (path / name).read_bytes() == data
        expected = 0o555 if mode & 0o111 else 0o444
        assert stat.S_IMODE((path / name).stat().st_mode) == expected
    for directory in (path, path / "lib", path / "lib/chunks"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o555
    stats = verify_closure(path, pack.read_lock(pack.for_platform()))
    assert (stats.files, stats.bytes) == (pin.closure.files, pin.closure.bytes)
    assert not any((cfg.cache_dir / "tmp").iterdir())


def test_lock_file_lists_normalized_inventory(cfg: Settings, pack: Pack) -> None:
    lock = json.loads((pack.path / "lock" / "any.json").read_text())
    assert [f["path"] for f in lock["files"]] == sorted(FILES)
    modes = {f["path"]: f["mode"] for f in lock["files"]}
    assert modes == {"bin/agent": "0755", "index.js": "0644", "lib/chunks/5672.index.js": "0644",
                     "lib/native/addon.node": "0755", "assets/empty.txt": "0644"}  # fmt: skip
    assert lock["closure_digest"] == pack.for_platform().pin.closure.digest


def test_lock_keeps_the_rest_of_the_manifest(cfg: Settings, pack: Pack) -> None:
    archive = pack.path / "dist" / "arm.tar"
    archive.write_bytes(tar_bytes([reg("bin/agent", b"arm", 0o755)]))
    result = lock_archive(archive, pack_dir=pack.path, name="demo", platform="linux-arm64")
    data = json.loads((pack.path / "pack.json").read_text())
    assert {k: v for k, v in data.items() if k != "platforms"} == declaration("demo")
    assert set(data["platforms"]) == {"any", "linux-arm64"}
    assert data["platforms"]["any"] == pack.manifest.platforms["any"].model_dump(
        mode="json", by_alias=True
    )
    assert (result.files, result.bytes, result.source) == (1, 3, "dist/arm.tar")
    reloaded = load_pack(cfg.packs_dir, "demo")
    assert reloaded.for_platform("linux-arm64").pin.closure.digest == result.closure_digest


def test_lock_requires_a_declaration(tmp_path: Path) -> None:
    archive = tmp_path / "x.tar"
    archive.write_bytes(tar_bytes([reg("a")]))
    (tmp_path / "p").mkdir()
    with pytest.raises(InvalidInput, match="declaration"):
        lock_archive(archive, pack_dir=tmp_path / "p", name="p", platform="any")


def test_lock_outside_archive_needs_existing_source(cfg: Settings, pack: Pack) -> None:
    outside = cfg.packs_dir.parent / "elsewhere.tar"
    outside.write_bytes(tar_bytes([reg("a")]))
    with pytest.raises(InvalidInput) as info:
        lock_archive(outside, pack_dir=pack.path, name="demo", platform="linux-x64")
    assert info.value.details["field"] == "source"
    kept = lock_archive(outside, pack_dir=pack.path, name="demo", platform="any")
    assert kept.source == "dist/demo.tar"


def test_lock_refuses_bad_archive_and_names(cfg: Settings, pack: Pack) -> None:
    archive = pack.path / "dist" / "bad.tar"
    archive.write_bytes(tar_bytes([entry("l", tarfile.SYMTYPE, "/")]))
    before = (pack.path / "pack.json").read_text()
    with pytest.raises(ArchiveRefused):
        lock_archive(archive, pack_dir=pack.path, name="demo", platform="any")
    assert (pack.path / "pack.json").read_text() == before
    with pytest.raises(InvalidInput, match="declares pack"):
        lock_archive(archive, pack_dir=pack.path, name="other", platform="any")
    with pytest.raises(InvalidInput, match="platform"):
        lock_archive(archive, pack_dir=pack.path, name="demo", platform="win")


def test_cache_hit_reuses_the_closure(cfg: Settings, pack: Pack) -> None:
    first = materialize(pack, cfg.cache_dir)
    inode = first.stat().st_ino
    second = materialize(pack, cfg.cache_dir)
    assert second == first
    assert second.stat().st_ino == inode
    assert [p.name for p in (cfg.cache_dir / "closures").iterdir()] == [first.name]


def test_same_closure_from_two_packs_shares_one_folder(cfg: Settings, pack: Pack) -> None:
    twin = make_pack(cfg.packs_dir, "twin", gz=True)
    assert materialize(twin, cfg.cache_dir) == materialize(pack, cfg.cache_dir)


def _writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)


def _flip_byte(root: Path) -> None:
    target = root / "lib/native/addon.node"
    target.chmod(0o755)
    data = bytearray(target.read_bytes())
    data[1000] ^= 0xFF
    target.write_bytes(bytes(data))
    target.chmod(0o555)


def _append_byte(root: Path) -> None:
    with (root / "index.js").open("ab") as out:  # root ignores the 0444 mode
        out.write(b"\n")


def _swap_in_symlink(root: Path) -> None:
    (root / "index.js").unlink()
    (root / "index.js").symlink_to(root / "bin/agent")


TAMPER: dict[str, Callable[[Path], object]] = {
    "one byte changed": _flip_byte,
    "byte appended": _append_byte,
    "file added": lambda r: (r / "lib/evil.js").write_text("x"),
    "empty dir added": lambda r: (r / "lib/extra").mkdir(),
    "file removed": lambda r: (r / "assets/empty.txt").unlink(),
    "exec bit removed": lambda r: (r / "bin/agent").chmod(0o444),
    "exec bit added": lambda r: (r / "index.js").chmod(0o555),
    "made writable": lambda r: (r / "index.js").chmod(0o644),
    "symlink swapped in": _swap_in_symlink,
    "fifo added": lambda r: os.mkfifo(r / "lib/pipe"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_tampered_closure_is_refused(cfg: Settings, pack: Pack, case: str) -> None:
    path = materialize(pack, cfg.cache_dir)
    _writable(path)
    TAMPER[case](path)
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o555)
    lock = pack.read_lock(pack.for_platform())
    with pytest.raises(DigestMismatch) as info:
        verify_closure(path, lock)
    assert str(path) in info.value.details["path"]
    assert info.value.details["problem"]
    with pytest.raises(DigestMismatch):
        materialize(pack, cfg.cache_dir)


def test_writable_directory_is_refused(cfg: Settings, pack: Pack) -> None:
    path = materialize(pack, cfg.cache_dir)
    (path / "lib").chmod(0o755)
    with pytest.raises(DigestMismatch, match="writable"):
        verify_closure(path, pack.read_lock(pack.for_platform()))


def test_lock_disagreeing_with_manifest_is_refused(cfg: Settings, pack: Pack) -> None:
    lock_path = pack.path / "lock" / "any.json"
    data = json.loads(lock_path.read_text())
    data["archive_sha256"] = "0" * 64
    lock_path.write_text(json.dumps(data))
    with pytest.raises(DigestMismatch, match="does not match the pins"):
        materialize(pack, cfg.cache_dir)


def test_archive_not_matching_lock_leaves_nothing(cfg: Settings, pack: Pack) -> None:
    # A consistent but wrong pin set: the archive is what the manifest pins, the lock
    # claims different file contents. Extraction must be discarded, never published.
    archive = pack.archive_path(pack.for_platform())
    other = {**FILES, "index.js": (b"changed", 0o644)}
    archive.write_bytes(tar_bytes(closure_members(other)))
    pin_path = pack.path / "pack.json"
    data = json.loads(pin_path.read_text())
    lock = json.loads((pack.path / "lock" / "any.json").read_text())
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    data["platforms"]["any"]["archive"].update(sha256=sha, size=archive.stat().st_size)
    lock["archive_sha256"] = sha
    pin_path.write_text(json.dumps(data))
    (pack.path / "lock" / "any.json").write_text(json.dumps(lock))
    pack = load_pack(cfg.packs_dir, "demo")
    with pytest.raises(DigestMismatch) as info:
        materialize(pack, cfg.cache_dir)
    assert info.value.details["file"] == "index.js"
    assert not any((cfg.cache_dir / "closures").iterdir())
    assert not any((cfg.cache_dir / "tmp").iterdir())


def test_platform_unsupported(cfg: Settings) -> None:
    pack = make_pack(cfg.packs_dir, platform="linux-arm64")
    with pytest.raises(PlatformUnsupported):
        materialize(pack, cfg.cache_dir, platform="linux-x64")


def test_load_pack_errors(cfg: Settings, pack: Pack) -> None:
    with pytest.raises(PackNotFound):
        load_pack(cfg.packs_dir, "missing")
    (pack.path / "pack.json").write_text("{not json")
    with pytest.raises(InvalidInput, match="not valid JSON"):
        load_pack(cfg.packs_dir, "demo")
    (pack.path / "pack.json").write_text(json.dumps({**declaration("demo"), "version": ""}))
    with pytest.raises(InvalidInput) as info:
        load_pack(cfg.packs_dir, "demo")
    assert info.value.details["field"] == "version"
    (pack.path / "pack.json").write_text(json.dumps(declaration("other")))
    with pytest.raises(InvalidInput, match="differs from its folder"):
        load_pack(cfg.packs_dir, "demo")


# -- crashes and concurrency -----------------------------------------------------------------

MATERIALIZE = """
import sys
from pathlib import Path
from worker.packs import load_pack, materialize
pack = load_pack(Path(sys.argv[1]), sys.argv[2])
print(materialize(pack, Path(sys.argv[3])))
"""


def _spawn(cfg: Settings, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", MATERIALIZE, str(cfg.packs_dir), name, str(cfg.cache_dir)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def test_stale_tmp_from_a_crash_is_cleaned(cfg: Settings, pack: Pack) -> None:
    hex_digest = pack.for_platform().pin.closure.digest.removeprefix("sha256:")
    stale = cfg.cache_dir / "tmp" / f"{hex_digest}.crashed"
    (stale / "lib").mkdir(parents=True)
    (stale / "lib" / "half.js").write_bytes(b"half")
    (stale / "lib").chmod(0o555)
    (cfg.cache_dir / "locks").mkdir(parents=True)
    (cfg.cache_dir / "locks" / f"{hex_digest}.lock").touch()
    path = materialize(pack, cfg.cache_dir)
    verify_closure(path, pack.read_lock(pack.for_platform()))
    assert not stale.exists()


def test_kill_mid_extract_never_publishes_half(cfg: Settings) -> None:
    files = {f"d{i % 40}/f{i}.bin": (os.urandom(4096), 0o644) for i in range(1500)}
    pack = make_pack(cfg.packs_dir, "big", files)
    final = closure_path(cfg.cache_dir, pack.for_platform().pin.closure.digest)
    tmp = cfg.cache_dir / "tmp"
    proc = _spawn(cfg, "big")
    try:
        deadline = time.monotonic() + 30
        while not (tmp.is_dir() and any(d.is_dir() and any(d.iterdir()) for d in tmp.iterdir())):
            assert proc.poll() is None, "the materializer ended before extracting"
            assert time.monotonic() < deadline, "extraction never began"
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not final.exists()  # killed before the rename: nothing half-done is visible
    assert any(tmp.iterdir())  # the crash left its temporary folder behind
    path = materialize(pack, cfg.cache_dir)
    assert verify_closure(path, pack.read_lock(pack.for_platform())).files == 1500
    assert not any(tmp.iterdir())


def test_concurrent_materializers_share_one_extraction(cfg: Settings, pack: Pack) -> None:
    procs = [_spawn(cfg, "demo") for _ in range(4)]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], outputs
    paths = {out.strip() for out, _err in outputs}
    assert paths == {str(closure_path(cfg.cache_dir, pack.for_platform().pin.closure.digest))}
    assert len(list((cfg.cache_dir / "closures").iterdir())) == 1
    assert not any((cfg.cache_dir / "tmp").iterdir())
    verify_closure(Path(paths.pop()), pack.read_lock(pack.for_platform()))


def test_remove_tree_deletes_sealed_closure(cfg: Settings, pack: Pack) -> None:
    path = materialize(pack, cfg.cache_dir)
    remove_tree(path)
    assert not path.exists()
    assert materialize(pack, cfg.cache_dir) == path


# -- CLI ---------------------------------------------------------------------------------------


def _run(cfg: Settings, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="acp-worker")
    parser.add_argument("--json", action="store_true")
    packs_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args, cfg)
    return code


def test_cli_lock_verify_materialize(cfg: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    pack_dir = cfg.packs_dir / "demo"
    (pack_dir / "dist").mkdir(parents=True)
    (pack_dir / "pack.json").write_text(json.dumps(declaration("demo")))
    archive = pack_dir / "dist" / "demo.tar"
    archive.write_bytes(tar_bytes(closure_members(FILES)))
    assert _run(cfg, "pack", "lock", str(archive), "--pack", "demo", "--platform", "any") == 0
    out = capsys.readouterr().out
    assert f"{len(FILES)} files" in out
    assert "closure sha256:" in out

    assert _run(cfg, "pack", "materialize", "demo") == 0
    closure = capsys.readouterr().out.strip()
    assert Path(closure).parent == cfg.cache_dir / "closures"

    other_cache = cfg.cache_dir.parent / "other-cache"
    assert _run(cfg, "pack", "verify", str(pack_dir), "--cache", str(other_cache), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["closure"] == str(other_cache / "closures" / Path(closure).name)
    assert report["files"] == len(FILES)

    assert _run(cfg, "pack", "verify", "demo", "--platform", "linux-x64") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == closure
    assert lines[1].startswith(f"verified {len(FILES)} files")


def test_cli_errors_are_worker_errors(cfg: Settings, pack: Pack) -> None:
    with pytest.raises(PackNotFound):
        _run(cfg, "pack", "materialize", "nope")
    with pytest.raises(PackNotFound):
        _run(cfg, "pack", "verify", str(cfg.packs_dir / "nope" / "x"))
    materialize(pack, cfg.cache_dir)
    (closure_path(cfg.cache_dir, pack.for_platform().pin.closure.digest) / "index.js").chmod(0o644)
    with pytest.raises(DigestMismatch) as info:
        _run(cfg, "pack", "verify", "demo")
    assert info.value.exit_code == 3


# -- runner seam -------------------------------------------------------------------------------


def test_prepare_pack_verifies_and_plans_launch(cfg: Settings, pack: Pack) -> None:
    declared = load_declaration(cfg, "demo")
    assert declared.credentials == ("CURSOR_API_KEY",)
    prepared = prepare_pack(cfg, declared, None)
    assert prepared.closure == materialize(pack, cfg.cache_dir)
    assert prepared.stats.files == len(FILES)
    ready = prepared.event_data()
    assert ready.closure_digest == pack.for_platform().pin.closure.digest
    assert (ready.name, ready.platform, ready.files) == ("demo", "any", len(FILES))
    plan = prepared.launch_plan({"CURSOR_API_KEY": "k"})
    assert plan.argv == ("/opt/acp-pack/bin/agent", "acp")
    assert plan.env["CURSOR_API_KEY"] == "k"
    assert plan.dialect == "acp"
    (prepared.closure / "index.js").chmod(0o644)
    with pytest.raises(DigestMismatch):
        prepare_pack(cfg, declared, None)


def test_a_launch_of_an_unchanged_closure_reads_no_lock(
    cfg: Settings, pack: Pack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch (``sandbox_uids``) whose closure is as its last full verification left it
    is checked against its verified record without parsing the lock (which costs more
    than the scan for the larger packs); any change still sends it to the full check."""
    monkeypatch.setattr(verified, "RACY_NS", 0)  # record the closure just materialized
    declared = load_declaration(cfg, "demo")
    uids = (61000,)
    first = prepare_pack(cfg, declared, None, sandbox_uids=uids)
    assert first.stats.hashed_bytes == first.stats.bytes > 0
    reads: list[str] = []
    real = Pack.read_lock

    def counted(self: Pack, target: PlatformTarget) -> ClosureLock:
        reads.append(target.platform)
        return real(self, target)

    monkeypatch.setattr(Pack, "read_lock", counted)
    again = prepare_pack(cfg, declared, None, sandbox_uids=uids)
    assert (again.closure, again.stats.hashed_bytes, reads) == (first.closure, 0, [])
    assert (again.stats.files, again.stats.bytes) == (first.stats.files, first.stats.bytes)
    _writable(first.closure)
    _flip_byte(first.closure)
    for p in [first.closure, *first.closure.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    with pytest.raises(DigestMismatch, match="sha256"):
        prepare_pack(cfg, declared, None, sandbox_uids=uids)
    assert reads == ["any"]
