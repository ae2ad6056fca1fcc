"""The npm pack builder's archive: which files of a tree it leaves out, and that what it
writes locks, extracts and verifies as one closure (no npm, no network)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from worker.errors import ArchiveRefused
from worker.packs.archive import extract_tar
from worker.packs.closure import ClosureLock
from worker.packs.npm import collect, write_archive
from worker.packs.verify import verify_closure

PKG = "node_modules/pkg"
LEFT_OUT = (
    f"{PKG}/index.d.ts",
    f"{PKG}/index.d.mts",
    f"{PKG}/index.d.cts",
    f"{PKG}/LEGACY.D.TS",
    f"{PKG}/index.js.map",
    f"{PKG}/dist/style.css.MAP",
    f"{PKG}/types/only.d.ts",  # leaves types/ empty
)
KEPT = (
    f"{PKG}/package.json",
    f"{PKG}/index.js",
    f"{PKG}/index.mjs",
    f"{PKG}/src/plain.ts",  # TypeScript source, not a declaration
    f"{PKG}/src/module.mts",
    f"{PKG}/d.ts.js",
    f"{PKG}/map.js",
    f"{PKG}/sourcemap.json",
    f"{PKG}/README.md",  # Markdown stays: gemini-cli reads SKILL.md and its docs
    f"{PKG}/builtin/skill/SKILL.md",
    f"{PKG}/docs/guide.markdown",
    f"{PKG}/x.map/inside.js",  # a directory named like a map is a directory
)


def _tree(root: Path) -> None:
    for rel in (*LEFT_OUT, *KEPT):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)


def test_declarations_and_source_maps_are_left_out(tmp_path: Path) -> None:
    _tree(tmp_path)
    names = [name for name, _, _ in collect(tmp_path)]
    files = {name for name, path, _ in collect(tmp_path) if path.is_file()}
    assert files == set(KEPT)
    assert not set(LEFT_OUT) & set(names)
    assert f"{PKG}/types" in names  # the emptied directory is still an entry
    assert f"{PKG}/x.map" in names


def test_a_symlink_named_like_a_left_out_file_still_refuses_the_build(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / PKG / "linked.js.map").symlink_to("index.js.map")
    with pytest.raises(ArchiveRefused):
        collect(tmp_path)


def test_the_archive_locks_extracts_and_verifies_without_emptied_directories(
    tmp_path: Path,
) -> None:
    tree, closure = tmp_path / "tree", tmp_path / "closure"
    _tree(tree)
    archive = tmp_path / "pack.tar"
    sha256 = write_archive(tree, archive)
    with tarfile.open(archive) as tar:
        assert f"{PKG}/types" in tar.getnames()
    closure.mkdir()
    with archive.open("rb") as src:
        files = extract_tar(src, closure, fmt="tar")
    assert {entry.path for entry in files} == set(KEPT)
    assert not (closure / PKG / "types").exists()  # never materialized: not a parent
    lock = ClosureLock.build(pack="pkg", platform="any", archive_sha256=sha256, files=files)
    stats = verify_closure(closure, lock, read_only=False, workers=1)
    assert stats.files == len(KEPT)
