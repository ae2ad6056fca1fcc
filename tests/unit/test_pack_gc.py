"""Pack cache GC without I/O: budget sizes, and matching mounts seen from any namespace."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from worker.cli.packs import human_size, parse_size
from worker.packs.gc import Mount, MountTable


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("0", 0),
        ("512", 512),
        ("10K", 10 * 1024),
        ("500m", 500 * 1024**2),
        ("1.5G", 3 * 1024**3 // 2),
        ("10GiB", 10 * 1024**3),
        ("2 TB", 2 * 1024**4),
        ("7b", 7),
    ],
)
def test_sizes(text: str, count: int) -> None:
    assert parse_size(text) == count


@pytest.mark.parametrize("text", ["", "-1", "10X", "1e9", "G", "1.2.3M"])
def test_not_sizes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"),
        (3 << 40, "3072.0 GiB"),
    ],
)
def test_human_sizes(count: int, text: str) -> None:
    assert human_size(count) == text


CACHE_HEX = "/var/cache/acpw/closures/" + "a" * 64
OWN = (
    Mount("254:0", "/", "/"),
    Mount("254:3", "/volumes/cache", "/var/cache/acpw"),  # the cache is a bind of a volume
)


def _table(*everywhere: tuple[str, str]) -> MountTable:
    return MountTable(OWN, frozenset(everywhere))


def test_a_path_is_located_in_the_filesystem_of_its_deepest_mount() -> None:
    table = _table()
    assert table.locate(Path("/etc/hosts")) == ("254:0", "/etc/hosts")
    assert table.locate(Path(CACHE_HEX)) == ("254:3", "/volumes/cache/closures/" + "a" * 64)


def test_a_bind_of_the_closure_or_below_it_in_any_namespace_is_in_use() -> None:
    inside = "/volumes/cache/closures/" + "a" * 64
    assert _table(("254:3", inside)).contains(Path(CACHE_HEX))
    assert _table(("254:3", inside + "/bin")).contains(Path(CACHE_HEX))


def test_other_closures_devices_and_parents_are_not_in_use() -> None:
    inside = "/volumes/cache/closures/" + "a" * 64
    assert not _table(("254:0", inside)).contains(Path(CACHE_HEX))  # same path, other fs
    assert not _table(("254:3", inside + "b")).contains(Path(CACHE_HEX))  # a longer name
    assert not _table(("254:3", "/volumes/cache")).contains(Path(CACHE_HEX))  # the cache
