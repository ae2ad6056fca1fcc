"""npm packs: pin a real package's tree, build it byte-deterministically, lock it.

Uses the npm registry (``which@4.0.0`` and its one dependency: small, with a bin) and the
committed agent packs' locks. No mocks: npm runs for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from worker.errors import ArchiveRefused, DigestMismatch, InvalidInput
from worker.packs.manifest import load_pack_dir
from worker.packs.npm import build_npm, collect, lock_npm, parse_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = "which@4.0.0"
ENTRY = "{pack}/node_modules/which/bin/which.js"
AGENT_PACKS = ("claude-agent-acp", "codex-acp", "gemini-cli")


def _declare(pack_dir: Path, argv: list[str] | None = None) -> Path:
    pack_dir.mkdir(parents=True)
    manifest = {
        "schema": 1,
        "name": pack_dir.name,
        "version": "0",
        "provider": "claude",
        "dialect": "acp",
        "launch": {"argv": argv or ["/usr/bin/node", ENTRY, "node"], "credentials": []},
    }
    (pack_dir / "pack.json").write_text(json.dumps(manifest))
    return pack_dir


def _members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return tar.getmembers()


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pack_dir = _declare(tmp_path_factory.mktemp("first") / "which-pack")
    lock_npm(SPEC, pack_dir=pack_dir, platform="any")
    return pack_dir


def test_lock_pins_tree_and_writes_a_deterministic_archive(locked: Path) -> None:
    pack = load_pack_dir(locked)
    pin = pack.manifest.platforms["any"]
    archive = locked / "dist" / "which-pack-any.tar"
    assert pin.archive.source.path == "dist/which-pack-any.tar"
    assert pack.manifest.version == "4.0.0"
    assert json.loads((locked / "package.json").read_text())["dependencies"] == {"which": "4.0.0"}
    tree = json.loads((locked / "package-lock.json").read_text())["packages"]
    assert tree["node_modules/which"]["version"] == "4.0.0"
    assert "node_modules/isexe" in tree
    members = _members(archive)
    names = [m.name for m in members]
    assert names == sorted(names, key=lambda n: n.encode())
    assert "node_modules/which/bin/which.js" in names
    assert "node_modules/isexe/package.json" in names
    assert not any("/.bin" in n or n.startswith("node_modules/.bin") for n in names)
    assert "node_modules/.package-lock.json" not in names
    # isexe ships declarations and source maps beside its JS: left out, Markdown kept.
    assert not any(n.endswith((".d.ts", ".map")) for n in names)
    assert "node_modules/isexe/dist/commonjs/index.js" in names
    assert "node_modules/isexe/README.md" in names
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and not m.uname for m in members)
    assert all(m.isdir() or m.isfile() for m in members)
    assert {m.mode for m in members} <= {0o755, 0o644}
    assert pack.read_lock(pack.for_platform("any")).archive_sha256 == pin.archive.sha256


def test_the_archived_tree_runs_without_what_was_left_out(locked: Path, tmp_path: Path) -> None:
    with tarfile.open(locked / "dist" / "which-pack-any.tar") as tar:
        tar.extractall(tmp_path, filter="data")
    entry = tmp_path / ENTRY.removeprefix("{pack}/")
    found = subprocess.run(
        ["/usr/bin/node", str(entry), "node"], capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).name == "node"


def test_another_machine_rebuilds_the_same_bytes(locked: Path, tmp_path: Path) -> None:
    # A fresh checkout elsewhere: only the committed files, no dist/.
    clone = tmp_path / "elsewhere" / locked.name
    shutil.copytree(locked, clone, ignore=shutil.ignore_patterns("dist"))
    [result] = build_npm(clone)
    assert not result.cached
    assert result.sha256 == load_pack_dir(locked).manifest.platforms["any"].archive.sha256
    assert (clone / "dist" / "which-pack-any.tar").read_bytes() == (
        locked / "dist" / "which-pack-any.tar"
    ).read_bytes()
    [again] = build_npm(clone)
    assert again.cached


def test_a_rebuild_that_differs_from_the_pin_is_refused(locked: Path, tmp_path: Path) -> None:
    clone = tmp_path / locked.name
    shutil.copytree(locked, clone, ignore=shutil.ignore_patterns("dist"))
    manifest = json.loads((clone / "pack.json").read_text())
    manifest["platforms"]["any"]["archive"]["sha256"] = "0" * 64
    (clone / "pack.json").write_text(json.dumps(manifest))
    with pytest.raises(DigestMismatch):
        build_npm(clone)
    assert not (clone / "dist" / "which-pack-any.tar").exists()


def test_launch_must_run_the_package_entry(tmp_path: Path) -> None:
    pack_dir = _declare(tmp_path / "wrong", argv=["/usr/bin/node", "{pack}/index.js"])
    with pytest.raises(InvalidInput) as err:
        lock_npm(SPEC, pack_dir=pack_dir, platform="any")
    assert err.value.details["suggested"] == ["/usr/bin/node", ENTRY]


def test_symlinks_outside_bin_refuse_the_build(tmp_path: Path) -> None:
    (tmp_path / "node_modules" / ".bin").mkdir(parents=True)
    (tmp_path / "node_modules" / ".bin" / "tool").symlink_to("../x/tool.js")
    (tmp_path / "node_modules" / "x").mkdir()
    (tmp_path / "node_modules" / "x" / "tool.js").write_text("")
    assert [name for name, _, _ in collect(tmp_path)] == [
        "node_modules", "node_modules/x", "node_modules/x/tool.js",
    ]  # fmt: skip
    (tmp_path / "node_modules" / "x" / "link").symlink_to("tool.js")
    with pytest.raises(ArchiveRefused):
        collect(tmp_path)


@pytest.mark.parametrize("spec", ["which", "which@^4", "which@latest", "@scope@1.0.0"])
def test_only_exact_versions_are_pinned(spec: str) -> None:
    with pytest.raises(InvalidInput):
        parse_spec(spec)


def test_scoped_specs_parse() -> None:
    spec = parse_spec("@agentclientprotocol/claude-agent-acp@0.49.0")
    assert (spec.name, spec.version) == ("@agentclientprotocol/claude-agent-acp", "0.49.0")


@pytest.mark.parametrize("name", AGENT_PACKS)
def test_committed_agent_packs_agree_with_their_locks(name: str) -> None:
    pack = load_pack_dir(REPO / "provider_packs" / name)
    target = pack.for_platform("linux-x64")
    lock = pack.read_lock(target)  # raises when the lock and pack.json disagree
    assert lock.archive_sha256 == target.pin.archive.sha256
    pinned = json.loads((pack.path / "package.json").read_text())["dependencies"]
    assert list(pinned.values()) == [pack.manifest.version]
    argv = pack.manifest.launch.argv
    assert argv[0] == "/usr/bin/node"
    assert any(p.path == argv[1].removeprefix("{pack}/") for p in lock.files)


def test_cli_lock_npm_and_build_npm(locked: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    clone = tmp_path / locked.name
    shutil.copytree(locked, clone, ignore=shutil.ignore_patterns("dist"))
    cli = [sys.executable, "-m", "worker.cli", "pack"]
    build = subprocess.run(
        [*cli, "build-npm", str(clone), "--json"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert build.returncode == 0, build.stderr
    [archive] = json.loads(build.stdout)["archives"]
    assert archive["cached"] is False
    relock = subprocess.run(
        [*cli, "lock-npm", SPEC, "--pack", str(clone), "--platform", "any", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert relock.returncode == 0, relock.stderr
    assert json.loads(relock.stdout)["archive_sha256"] == archive["sha256"]
    bad = subprocess.run(
        [*cli, "lock-npm", "which@^4", "--pack", str(clone), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert bad.returncode == 2
    assert json.loads(bad.stderr)["error"]["code"] == "invalid_input"
