"""Pure logic of provider packs: closure digest, names, manifest and lock validation."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Any

import pytest

import worker.packs
from worker.errors import ArchiveRefused, DigestMismatch, InvalidInput, PlatformUnsupported
from worker.packs.closure import (
    ClosureLock,
    FileEntry,
    closure_digest,
    normalize_mode,
    parse_lock,
    sort_entries,
)
from worker.packs.manifest import LocalSource, Pack, parse_manifest
from worker.packs.names import check_pack_name, check_platform, current_platform, path_problem
from worker.safetree import member_path

HEX_A = "a" * 64
HEX_B = "b" * 64


def _manifest(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": 1,
        "name": "cursor-emulator",
        "version": "0.1.0",
        "provider": "cursor",
        "dialect": "cursor",
        "launch": {
            "argv": ["/usr/bin/python3", "{pack}/cursor_emulator.py", "acp"],
            "env": {"PYTHONDONTWRITEBYTECODE": "1"},
            "credentials": ["CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"],
        },
        "platforms": {
            "any": {
                "archive": {
                    "source": "dist/cursor-emulator-linux.tar",
                    "sha256": HEX_A,
                    "size": 12345,
                    "format": "tar",
                },
                "closure": {"digest": f"sha256:{HEX_B}", "files": 7, "bytes": 40000},
            }
        },
    }
    data.update(overrides)
    return data


# -- closure digest -----------------------------------------------------------------------


def test_closure_digest_is_sha256_over_sorted_lines() -> None:
    entries = [
        FileEntry("z.js", "0644", 3, HEX_B),
        FileEntry("bin/node", "0755", 10, HEX_A),
    ]
    lines = f"0755 10 {HEX_A} bin/node\n0644 3 {HEX_B} z.js\n"
    assert closure_digest(entries) == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def test_closure_digest_pinned_vector() -> None:
    # Pinned: the digest names cache folders and lives in every lock, so a change to the
    # definition must be deliberate (and bump the lock schema).
    empty = hashlib.sha256(b"").hexdigest()
    entries = [FileEntry("bin/node", "0755", 3, HEX_A), FileEntry("a", "0644", 0, empty)]
    assert closure_digest(entries) == (
        "sha256:7fd15ba79a652cadb728b9662179439a73cbb7d9f108609d72b1674af33937e5"
    )
    assert closure_digest([]) == f"sha256:{empty}"


def test_closure_digest_ignores_input_order() -> None:
    entries = [FileEntry(p, "0644", 1, HEX_A) for p in ("b", "a/c", "é", "a-b", "Z")]
    assert closure_digest(entries) == closure_digest(reversed(entries))
    assert [e.path for e in sort_entries(entries)] == ["Z", "a-b", "a/c", "b", "é"]


@pytest.mark.parametrize(
    "changed",
    [
        FileEntry("a", "0755", 1, HEX_A),
        FileEntry("a", "0644", 2, HEX_A),
        FileEntry("a", "0644", 1, HEX_B),
        FileEntry("b", "0644", 1, HEX_A),
    ],
)
def test_closure_digest_covers_every_field(changed: FileEntry) -> None:
    assert closure_digest([changed]) != closure_digest([FileEntry("a", "0644", 1, HEX_A)])


@pytest.mark.parametrize(
    ("st_mode", "expected"),
    [(0o100644, "0644"), (0o100755, "0755"), (0o100744, "0755"), (0o100401, "0755"),
     (0o100600, "0644"), (0o100444, "0644"), (0o100555, "0755")],
)  # fmt: skip
def test_normalize_mode(st_mode: int, expected: str) -> None:
    assert normalize_mode(st_mode) == expected


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["a", "a/b/c.js", "ünïcode/名前.txt", "x" * 255, ".hidden"])
def test_canonical_paths_accepted(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("a/../b", "'..'"),
        ("..", "'..'"),
        ("a//b", "empty or '.'"),
        ("./a", "empty or '.'"),
        ("a/", "empty or '.'"),
        ("a\nb", "control"),
        ("a\x00b", "control"),
        ("x" * 256, "component longer"),
        ("a/" * 600 + "b", "longer than 1024"),
        ("bad\udcff", "UTF-8"),
    ],
)
def test_bad_paths_refused(path: str, reason: str) -> None:
    problem = path_problem(path)
    assert problem is not None
    assert reason in problem


@pytest.mark.parametrize("name", ["cursor", "cursor-emulator", "claude_acp", "a.b", "0"])
def test_pack_names_accepted(name: str) -> None:
    assert check_pack_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "Cursor", "-x", "x" * 65])
def test_pack_names_refused(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        check_pack_name(name)
    assert info.value.details["field"] == "name"


@pytest.mark.parametrize(
    ("machine", "expected"),
    [("x86_64", "linux-x64"), ("AMD64", "linux-x64"), ("aarch64", "linux-arm64"),
     ("arm64", "linux-arm64")],
)  # fmt: skip
def test_current_platform_maps_machines(machine: str, expected: str) -> None:
    assert current_platform(machine=machine, system="linux") == expected


@pytest.mark.parametrize(("machine", "system"), [("riscv64", "linux"), ("x86_64", "darwin")])
def test_current_platform_refuses_others(machine: str, system: str) -> None:
    with pytest.raises(PlatformUnsupported):
        current_platform(machine=machine, system=system)


def test_check_platform() -> None:
    assert check_platform("any") == "any"
    with pytest.raises(InvalidInput):
        check_platform("windows-x64")


# -- tar member names ----------------------------------------------------------------------


def _member(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


@pytest.mark.parametrize(
    ("name", "expected"),
    [("a", "a"), ("./a", "a"), ("./a//b", "a/b"), ("a/./b", "a/b"), ("dir/", "dir")],
)
def test_member_names_normalized(name: str, expected: str) -> None:
    assert member_path(_member(name)) == expected


def test_root_directory_member_is_empty_path() -> None:
    assert member_path(_member(".", tarfile.DIRTYPE)) == ""
    assert member_path(_member("./", tarfile.DIRTYPE)) == ""


@pytest.mark.parametrize(
    ("name", "reason"),
    [("/etc/passwd", "absolute"), ("a/../../b", "'..'"), (".", "empty name"),
     ("", "empty name"), ("a\nb", "control")],
)  # fmt: skip
def test_member_names_refused(name: str, reason: str) -> None:
    with pytest.raises(ArchiveRefused) as info:
        member_path(_member(name))
    assert reason in info.value.details["reason"]
    assert info.value.details["member"] == name


# -- manifest --------------------------------------------------------------------------------


def test_manifest_example_validates() -> None:
    manifest = parse_manifest(_manifest(), path="pack.json")
    pin = manifest.platforms["any"]
    assert pin.archive.source == LocalSource(path="dist/cursor-emulator-linux.tar")
    assert pin.closure.digest.removeprefix("sha256:") == HEX_B
    assert manifest.launch.credentials == ["CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"]


def test_manifest_round_trips_with_string_source() -> None:
    data = _manifest()
    dumped = parse_manifest(data, path="pack.json").model_dump(mode="json", by_alias=True)
    assert dumped == data


def test_manifest_without_pins_is_a_declaration() -> None:
    data = _manifest()
    del data["platforms"]
    assert parse_manifest(data, path="pack.json").platforms == {}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra": 1}, "extra"),
        ({"schema": 2}, "schema"),
        ({"name": "Bad Name"}, "name"),
        ({"launch": {"argv": []}}, "launch.argv"),
        ({"launch": {"argv": ["x"], "credentials": ["bad-name"]}}, "launch.credentials.0"),
        ({"platforms": {"windows": {}}}, "platforms.windows"),
    ],
)
def test_manifest_errors_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_manifest(**change), path="pack.json")
    assert info.value.details["field"].startswith(field)
    assert field in info.value.message


@pytest.mark.parametrize(
    ("key", "value"),
    [("sha256", "A" * 64), ("sha256", "a" * 63), ("size", -1), ("format", "zip"),
     ("source", "../outside.tar"), ("source", "/abs/archive.tar"), ("extra", "x")],
)  # fmt: skip
def test_archive_pin_errors_name_the_field(key: str, value: object) -> None:
    data = _manifest()
    data["platforms"]["any"]["archive"][key] = value
    with pytest.raises(InvalidInput) as info:
        parse_manifest(data, path="pack.json")
    assert info.value.details["field"].startswith(f"platforms.any.archive.{key}")


def test_closure_pin_digest_needs_prefix() -> None:
    data = _manifest()
    data["platforms"]["any"]["closure"]["digest"] = HEX_B
    with pytest.raises(InvalidInput) as info:
        parse_manifest(data, path="pack.json")
    assert info.value.details["field"] == "platforms.any.closure.digest"


def _pack(platforms: list[str]) -> Pack:
    data = _manifest()
    pin = data["platforms"]["any"]
    data["platforms"] = dict.fromkeys(platforms, pin)
    return Pack(parse_manifest(data, path="pack.json"), Path("/nonexistent/cursor-emulator"))


def test_for_platform_prefers_exact_then_any() -> None:
    assert _pack(["linux-x64", "any"]).for_platform("linux-x64").platform == "linux-x64"
    assert _pack(["any"]).for_platform("linux-arm64").platform == "any"
    assert _pack(["any"]).for_platform().platform == "any"


def test_for_platform_refuses_missing_build() -> None:
    with pytest.raises(PlatformUnsupported) as info:
        _pack(["linux-arm64"]).for_platform("linux-x64")
    assert info.value.details["available"] == ["linux-arm64"]
    with pytest.raises(InvalidInput):
        _pack(["any"]).for_platform("plan9-mips")


# -- lock file -------------------------------------------------------------------------------


def _lock_json(**overrides: Any) -> dict[str, Any]:
    lock = ClosureLock.build(
        pack="p",
        platform="any",
        archive_sha256=HEX_A,
        files=[FileEntry("bin/x", "0755", 5, HEX_A), FileEntry("a.js", "0644", 3, HEX_B)],
    )
    data = lock.to_json()
    data.update(overrides)
    return data


def test_lock_round_trips() -> None:
    data = _lock_json()
    lock = parse_lock(data, path="lock/any.json")
    assert lock.to_json() == data
    assert [f.path for f in lock.files] == ["a.js", "bin/x"]
    assert lock.total_bytes == 8


def test_lock_refuses_unsorted_or_duplicate_files() -> None:
    data = _lock_json()
    for files in (list(reversed(data["files"])), [data["files"][0]] * 2):
        with pytest.raises(InvalidInput) as info:
            parse_lock({**data, "files": files}, path="lock/any.json")
        assert info.value.details["field"] == "files"


def test_lock_refuses_bad_path() -> None:
    data = _lock_json()
    data["files"][0]["path"] = "../a.js"
    with pytest.raises(InvalidInput) as info:
        parse_lock(data, path="lock/any.json")
    assert info.value.details["field"] == "files.0.path"


def test_lock_refuses_inconsistent_digest() -> None:
    data = _lock_json()
    data["files"][0]["size"] = 4
    with pytest.raises(DigestMismatch):
        parse_lock(data, path="lock/any.json")


def test_public_api_is_pinned() -> None:
    assert set(worker.packs.__all__) == {
        "DEFAULT_LIMITS", "PLATFORMS", "ClosureLock", "ExtractLimits", "FileEntry",
        "LockResult", "Pack", "PackManifest", "Platform", "PlatformTarget", "VerifyStats",
        "check_declared", "closure_digest", "closure_path", "current_platform", "extract_tar",
        "extract_verified", "load_pack", "load_pack_dir", "lock_archive", "lock_url",
        "materialize", "parse_manifest", "read_lock", "verify_closure",
    }  # fmt: skip
