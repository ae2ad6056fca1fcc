"""Hostile pack archives, built here in memory: bombs, truncations, trailing garbage,
foreign formats. Issue 13, items 2 (extraction bounded by what the pack declares) and
3 (a truncated or corrupt archive is never pinned)."""

from __future__ import annotations

import argparse
import bz2
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from worker import safetree
from worker.cli import packs as packs_cli
from worker.errors import ArchiveRefused, DigestMismatch, UnsupportedFormat
from worker.packs import cache
from worker.packs.archive import extract_tar
from worker.packs.cache import materialize
from worker.packs.closure import ClosureLock, FileEntry
from worker.packs.lock import lock_archive
from worker.packs.manifest import Pack, load_pack
from worker.settings import Settings

MIB = 1024 * 1024
FILES = {"bin/agent": (b"#!/bin/sh\necho agent\n", 0o755), "lib/a.js": (b"a" * 3000, 0o644)}


# -- archive builders ------------------------------------------------------------------------


def reg(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def tar_bytes(members: Iterable[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def good_tar() -> bytes:
    return tar_bytes(reg(name, data, mode) for name, (data, mode) in FILES.items())


def _deflate(data: bytes) -> bytes:
    """Raw deflate of *data* ending in a full flush: the same input always gives the same
    bytes, and segments made this way concatenate into one valid deflate stream."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


@functools.cache
def zero_bomb(files: int, mib_each: int, padding_mib: int = 0) -> bytes:
    """A valid tar.gz of *files* members of *mib_each* MiB of zeros (and *padding_mib* MiB
    of zero padding after the end marker), about 1 KiB per MiB inflated."""
    zeros = b"\0" * MIB
    zero_mib = _deflate(zeros)
    parts = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"]  # gzip header, no name, no mtime
    crc, size = 0, 0
    for index in range(files):
        info = tarfile.TarInfo(f"big{index}")
        info.size, info.mode = mib_each * MIB, 0o644
        header = info.tobuf(tarfile.GNU_FORMAT)
        parts.append(_deflate(header))
        crc, size = zlib.crc32(header, crc), size + len(header)
        for _ in range(mib_each):
            parts.append(zero_mib)
            crc, size = zlib.crc32(zeros, crc), size + MIB
    for _ in range(padding_mib + 1):  # the end marker and padding are zeros too
        parts.append(zero_mib)
        crc, size = zlib.crc32(zeros, crc), size + MIB
    final = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts.append(final.flush(zlib.Z_FINISH))
    parts.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return b"".join(parts)


def _written_bytes() -> int:
    """Bytes this process has passed to write(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


# -- packs -----------------------------------------------------------------------------------


def declaration(name: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "name": name,
        "version": "1.0.0",
        "provider": "cursor",
        "dialect": "acp",  # a toy agent, not under the cursor launch contract
        "launch": {"argv": ["{pack}/bin/agent"], "credentials": []},
    }


def pack_dir(packs: Path, name: str = "demo") -> Path:
    folder = packs / name
    (folder / "dist").mkdir(parents=True)
    (folder / "pack.json").write_text(json.dumps(declaration(name)))
    return folder


def lock_bytes(packs: Path, data: bytes, archive: str = "demo.tar") -> Path:
    """Lock *data* as the archive of a new pack; returns the pack folder."""
    folder = pack_dir(packs)
    (folder / "dist" / archive).write_bytes(data)
    lock_archive(folder / "dist" / archive, pack_dir=folder, name="demo", platform="any")
    return folder


def forge_pack(packs: Path, data: bytes, entries: list[FileEntry], fmt: str) -> Pack:
    """A pack whose pins agree with each other but whose lock was written by hand."""
    folder = pack_dir(packs)
    name = "demo.tar.gz" if fmt == "tar.gz" else "demo.tar"
    (folder / "dist" / name).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    lock = ClosureLock.build(pack="demo", platform="any", archive_sha256=sha, files=entries)
    (folder / "lock").mkdir()
    (folder / "lock" / "any.json").write_text(json.dumps(lock.to_json()))
    manifest = declaration("demo")
    manifest["platforms"] = {
        "any": {
            "archive": {"source": f"dist/{name}", "sha256": sha, "size": len(data), "format": fmt},
            "closure": {
                "digest": lock.closure_digest,
                "files": len(lock.files),
                "bytes": lock.total_bytes,
            },
        }
    }
    (folder / "pack.json").write_text(json.dumps(manifest))
    return load_pack(packs, "demo")


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", packs_dir=tmp_path / "packs")


def _nothing_published(cfg: Settings) -> None:
    for sub in ("closures", "tmp"):
        folder = cfg.cache_dir / sub
        assert not folder.exists() or not any(folder.iterdir()), sub


# -- item 3: truncated, corrupt, trailing garbage, empty, special bits, formats ---------------


def _truncations() -> dict[str, bytes]:
    whole = good_tar()
    first_data = 512 * 3  # PAX header block + its data block + the member's header
    bad_second = bytearray(whole)
    second = whole.index(b"lib/a.js") // 512 * 512  # the second member's (pax) header
    bad_second[second + 148 : second + 156] = b"0000000\0"  # a checksum that does not match
    return {
        "no end marker": whole[: whole.rindex(b"a" * 3000) + 3072],
        "cut inside a member's data": whole[: first_data + 10],
        "cut inside a header": whole[: 1024 + 100],
        "one zero block": whole[: whole.rindex(b"a" * 3000) + 3072 + 512],
        "bad header in the middle": bytes(bad_second),
        "garbage after the end marker": whole + b"garbage",
        "garbage in the record padding": whole[:-100] + b"x" + whole[-99:],
        "gzip cut short": gzip.compress(whole, mtime=0)[:-30],
        "gzip with a wrong crc": _wrong_crc(gzip.compress(whole, mtime=0)),
        "gzip then garbage": gzip.compress(whole, mtime=0) + b"garbage",
        "gzip of a truncated tar": gzip.compress(whole[: first_data + 3000 + 500], mtime=0),
        "empty file": b"",
    }


def _wrong_crc(data: bytes) -> bytes:
    out = bytearray(data)
    out[-8] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize("case", sorted(_truncations()))
def test_truncated_or_corrupt_archive_is_never_locked(cfg: Settings, case: str) -> None:
    data = _truncations()[case]
    folder = pack_dir(cfg.packs_dir)
    name = "demo.tar.gz" if case.startswith("gzip") else "demo.tar"
    (folder / "dist" / name).write_bytes(data)
    before = (folder / "pack.json").read_bytes()
    with pytest.raises(ArchiveRefused) as info:
        lock_archive(folder / "dist" / name, pack_dir=folder, name="demo", platform="any")
    assert info.value.code == "archive_refused"
    assert "corrupt archive" in info.value.details["reason"] or (
        info.value.details["reason"] == "truncated data"
    )
    assert (folder / "pack.json").read_bytes() == before
    assert not (folder / "lock").exists()


def test_a_whole_archive_still_locks(cfg: Settings) -> None:
    for fmt, data in (("tar", good_tar()), ("tar.gz", gzip.compress(good_tar(), mtime=0))):
        folder = lock_bytes(cfg.packs_dir, data, f"demo.{fmt}")
        pack = load_pack(cfg.packs_dir, "demo")
        assert pack.for_platform().pin.closure.files == len(FILES)
        path = materialize(pack, cfg.cache_dir)
        assert (path / "bin/agent").read_bytes() == FILES["bin/agent"][0]
        for sub in (folder, cfg.cache_dir):
            safetree.remove_tree(sub)


@pytest.mark.parametrize(
    "members",
    [
        [],
        [(tarfile.TarInfo("only-a-dir"), None)],
    ],
    ids=["no member", "only directories"],
)
def test_empty_closure_is_refused(
    cfg: Settings, members: list[tuple[tarfile.TarInfo, bytes | None]]
) -> None:
    for info, _ in members:
        info.type = tarfile.DIRTYPE
    folder = pack_dir(cfg.packs_dir)
    (folder / "dist" / "demo.tar").write_bytes(tar_bytes(members))
    with pytest.raises(ArchiveRefused) as info:
        lock_archive(folder / "dist" / "demo.tar", pack_dir=folder, name="demo", platform="any")
    assert info.value.details["reason"] == "empty closure"
    assert not (folder / "lock").exists()


def test_a_lock_of_no_file_is_never_materialized(cfg: Settings) -> None:
    pack = forge_pack(cfg.packs_dir, tar_bytes([]), [], "tar")
    with pytest.raises(ArchiveRefused, match="empty closure"):
        materialize(pack, cfg.cache_dir)
    _nothing_published(cfg)


@pytest.mark.parametrize(("mode", "bits"), [(0o4755, "setuid"), (0o2755, "setgid")])
def test_special_bits_are_refused_not_dropped(cfg: Settings, mode: int, bits: str) -> None:
    folder = pack_dir(cfg.packs_dir)
    (folder / "dist" / "demo.tar").write_bytes(tar_bytes([reg("bin/agent", b"x", mode)]))
    with pytest.raises(ArchiveRefused) as info:
        lock_archive(folder / "dist" / "demo.tar", pack_dir=folder, name="demo", platform="any")
    assert info.value.details == {
        "member": "bin/agent",
        "reason": f"{bits} bit set",
    }


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("bin/agent", "#!/bin/sh\n")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "fmt"),
    [
        ("demo.zip", _zip(), "zip"),
        ("demo.tar", _zip(), "zip"),  # the name says tar, the bytes say zip
        ("demo.tar.gz", _zip(), "zip"),
        ("demo.tar.xz", lzma.compress(good_tar()), "xz"),
        ("demo.tar.bz2", bz2.compress(good_tar()), "bzip2"),
        ("demo.tar.zst", b"\x28\xb5\x2f\xfd" + b"\0" * 64, "zstd"),
    ],
)
def test_a_format_we_do_not_read_is_unsupported_not_corrupt(
    cfg: Settings, name: str, data: bytes, fmt: str
) -> None:
    folder = pack_dir(cfg.packs_dir)
    (folder / "dist" / name).write_bytes(data)
    with pytest.raises(UnsupportedFormat) as info:
        lock_archive(folder / "dist" / name, pack_dir=folder, name="demo", platform="any")
    assert info.value.code == "unsupported_format"
    assert info.value.details["format"] == fmt
    assert "corrupt" not in str(info.value)


def test_a_pinned_zip_is_unsupported_at_materialize(cfg: Settings) -> None:
    entry = FileEntry("bin/agent", "0644", 10, "0" * 64)
    pack = forge_pack(cfg.packs_dir, _zip(), [entry], "tar")
    with pytest.raises(UnsupportedFormat):
        materialize(pack, cfg.cache_dir)
    _nothing_published(cfg)


def test_materialize_compares_file_count_and_bytes_with_the_lock(cfg: Settings) -> None:
    data = good_tar()
    entries = [
        FileEntry(n, "0755" if m & 0o111 else "0644", len(d), hashlib.sha256(d).hexdigest())
        for n, (d, m) in FILES.items()
    ]
    entries.append(FileEntry("lib/lost.js", "0644", 5, "0" * 64))  # listed, not in the tar
    pack = forge_pack(cfg.packs_dir, data, entries, "tar")
    with pytest.raises(DigestMismatch) as info:
        materialize(pack, cfg.cache_dir)
    assert info.value.details["problem"] == "file count or bytes differ"
    assert info.value.details["expected"] == {"files": 3, "bytes": 3000 + 21 + 5}
    assert info.value.details["actual"] == {"files": 2, "bytes": 3000 + 21}
    assert info.value.details["file"] == "lib/lost.js"
    _nothing_published(cfg)


# -- item 2: expansion bounded by what the pack declares ---------------------------------------


BOMBS = {
    "one 3 GiB file": (1, 3072, 0),
    "300 files of 10 MiB": (300, 10, 0),
    "3 GiB of padding after the end marker": (1, 1, 3072),
}


def _check_bomb(data: bytes) -> None:
    assert len(data) < 4 * MIB  # a 3 MiB archive ...


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_bomb_is_refused_at_lock_in_seconds_writing_nothing(cfg: Settings, bomb: str) -> None:
    data = zero_bomb(*BOMBS[bomb])
    _check_bomb(data)
    folder = pack_dir(cfg.packs_dir)
    archive = folder / "dist" / "demo.tar.gz"
    archive.write_bytes(data)
    written, started = _written_bytes(), time.monotonic()
    with pytest.raises(ArchiveRefused) as info:
        lock_archive(archive, pack_dir=folder, name="demo", platform="any")
    elapsed, written = time.monotonic() - started, _written_bytes() - written
    assert "beyond" in info.value.details["reason"]
    assert written < 4 * MIB, written  # ... writing at most a few MiB
    assert elapsed < 30, elapsed  # ... within seconds (generous: a shared 2-core host)
    assert not (folder / "lock").exists()


def _declared(bomb: str, *, honest: bool) -> list[FileEntry]:
    files, mib_each, _ = BOMBS[bomb]
    size = mib_each * MIB if honest else 10
    return [FileEntry(f"big{index}", "0644", size, "0" * 64) for index in range(files)]


@pytest.mark.parametrize("bomb", sorted(BOMBS))
@pytest.mark.parametrize("honest", [True, False], ids=["lock declares it", "lock hides it"])
def test_a_bomb_is_refused_at_materialize_in_seconds_writing_nothing(
    cfg: Settings, bomb: str, honest: bool
) -> None:
    data = zero_bomb(*BOMBS[bomb])
    pack = forge_pack(cfg.packs_dir, data, _declared(bomb, honest=honest), "tar.gz")
    written, started = _written_bytes(), time.monotonic()
    with pytest.raises((ArchiveRefused, DigestMismatch)) as info:
        materialize(pack, cfg.cache_dir)
    elapsed, written = time.monotonic() - started, _written_bytes() - written
    assert written < 4 * MIB, (written, info.value)
    assert elapsed < 30, elapsed
    _nothing_published(cfg)


def test_materialize_checks_free_space_before_writing(
    cfg: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = lock_bytes(cfg.packs_dir, good_tar())
    pack = load_pack(cfg.packs_dir, folder.name)
    real = os.statvfs
    cfg.cache_dir.mkdir()

    def full(path: Any) -> Any:
        fs = real(path)
        fields = list(fs)
        fields[4] = 10  # f_bavail: ten blocks left
        return os.statvfs_result(fields)

    monkeypatch.setattr(cache.os, "statvfs", full)
    creates: list[str] = []
    monkeypatch.setattr(safetree.extract, "_create", _spy(creates, safetree.extract._create))
    with pytest.raises(ArchiveRefused) as info:
        materialize(pack, cfg.cache_dir)
    assert info.value.details["reason"] == "not enough free space"
    assert creates == []
    _nothing_published(cfg)


def _spy(calls: list[str], create: Any) -> Any:
    def spy(parent: int, leaf: str, member: str) -> int:
        calls.append(member)
        return int(create(parent, leaf, member))

    return spy


def test_lock_then_materialize_extracts_once(
    cfg: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    creates: list[str] = []
    monkeypatch.setattr(safetree.extract, "_create", _spy(creates, safetree.extract._create))
    data = gzip.compress(good_tar(), mtime=0)
    lock_bytes(cfg.packs_dir, data, "demo.tar.gz")
    assert creates == []  # locking reads and hashes; it writes no file
    materialize(load_pack(cfg.packs_dir, "demo"), cfg.cache_dir)
    assert sorted(creates) == sorted(FILES)  # the one extraction, into the cache


def _cli(cfg: Settings, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    packs_cli.register(parser.add_subparsers())
    args = parser.parse_args(["pack", *argv])
    return int(args.handler(args, cfg))


def test_pack_lock_takes_the_operator_cap_and_ratio(
    cfg: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = pack_dir(cfg.packs_dir)
    archive = folder / "dist" / "demo.tar.gz"
    noise = random.Random(13).randbytes(50_000)  # incompressible
    members = [reg("bin/agent", noise, 0o755), reg("zeros", b"\0" * 100_000)]
    archive.write_bytes(gzip.compress(tar_bytes(members), mtime=0))  # about 3:1
    lock = ("lock", str(archive), "--pack", str(folder), "--platform", "any")
    with pytest.raises(ArchiveRefused, match="beyond 100000 bytes"):
        _cli(cfg, *lock, "--max-bytes", "100000")
    with pytest.raises(ArchiveRefused, match="beyond"):
        _cli(cfg, *lock, "--max-ratio", "2")
    assert not (folder / "lock").exists()
    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit):
            _cli(cfg, *lock, "--max-ratio", bad)
    assert _cli(cfg, *lock, "--max-bytes", "1M", "--max-ratio", "4") == 0
    assert "locked demo for any: 2 files, 150000 bytes" in capsys.readouterr().out


def test_no_prefix_of_an_archive_is_taken_for_the_whole() -> None:
    whole = good_tar()
    end = whole.rindex(b"a" * 3000) + 3072 + 1024  # the last data, then two zero blocks
    for cut in [*range(0, len(whole), 61), end - 1, end, len(whole) - 1]:
        prefix = whole[:cut]
        for fmt, data in (("tar", prefix), ("tar.gz", gzip.compress(prefix, mtime=0))):
            try:
                files = extract_tar(io.BytesIO(data), None, fmt=fmt)  # type: ignore[arg-type]
            except ArchiveRefused:
                assert cut < end, (cut, fmt)
            else:
                assert cut >= end, (cut, fmt)
                assert sorted(f.path for f in files) == sorted(FILES)
    gz = gzip.compress(whole, mtime=0)
    for cut in range(len(gz)):  # a gzip stream cut anywhere is refused
        with pytest.raises(ArchiveRefused):
            extract_tar(io.BytesIO(gz[:cut]), None, fmt="tar.gz")
