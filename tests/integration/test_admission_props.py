"""Property test: random trees of config names never crash the checker; links are reported."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.admission import RULES, check_workspace
from worker.admission.walk import find_git_root

NAMES = (
    ".cursor",
    ".cursor/mcp.json",
    ".cursor/hooks.json",
    ".cursor/plugins",
    ".cursor/extensions",
    ".mcp.json",
    ".claude",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".codex",
    ".codex/config.toml",
    ".git",
)
DIR_NAMES = frozenset({".cursor", ".claude", ".codex"})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
settings_docs = st.dictionaries(
    st.sampled_from(["hooks", "plugins", "enabledPlugins", "mcpServers", "env", "permissions"]),
    json_values,
    max_size=4,
).map(lambda d: json.dumps(d).encode())
contents = settings_docs | st.binary(max_size=64)
link_targets = st.sampled_from(["/etc/passwd", "missing", ".", "..", "hooks.json", "/"])
entries = st.one_of(
    st.tuples(st.just("file"), contents),
    st.tuples(st.just("dir"), st.just(b"")),
    st.tuples(st.just("fifo"), st.just(b"")),
    st.tuples(st.just("symlink"), link_targets.map(str.encode)),
)
# Each level maps some of NAMES to an entry; parents are created before children.
level_trees = st.dictionaries(st.sampled_from(NAMES), entries, max_size=len(NAMES))


def build(level: Path, tree: dict[str, tuple[str, bytes]]) -> set[str]:
    """Create ``tree`` under ``level``; return the names that became symlinks."""
    links: set[str] = set()
    for name in sorted(tree, key=lambda n: n.count("/")):
        path = level / name
        if not path.parent.is_dir() or path.parent.is_symlink():
            continue  # its parent is not a real directory: cannot exist
        kind, data = tree[name]
        if kind == "file":
            path.write_bytes(data)
        elif kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(data.decode())
            links.add(name)
    return links


def marks_root(level: Path) -> bool:
    """A ``.git`` that is a directory, a link to one, or a gitfile naming one."""
    marker = level / ".git"
    if marker.is_dir():
        return True
    if not marker.is_file() or marker.is_symlink():
        return False
    line = marker.read_bytes().decode("utf-8", "replace").partition("\n")[0].rstrip()
    return line.startswith("gitdir: ") and (level / line.removeprefix("gitdir: ")).is_dir()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(outer=level_trees, inner=level_trees)
def test_random_trees_never_crash_and_report_every_symlink(
    tmp_path: Path, outer: dict[str, tuple[str, bytes]], inner: dict[str, tuple[str, bytes]]
) -> None:
    assert find_git_root(tmp_path) is None
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    workspace = base / "ws"
    workspace.mkdir()
    outer_links = build(base, outer)
    inner_links = build(workspace, inner)
    sysroot = base / "sys"

    result = check_workspace(workspace, system_roots=[sysroot])

    expected_root = workspace if marks_root(workspace) else base if marks_root(base) else None
    assert result.git_root == expected_root
    found = {(f.path, f.rule) for f in result.findings}
    assert {f.rule for f in result.findings} <= RULES
    assert result.admitted == (not result.findings)
    checked = {(name, "") for name in inner_links if name != ".git"}
    if expected_root == base:
        checked |= {(name, "../") for name in outer_links if name != ".git"}
    for name, prefix in checked:
        assert (prefix + name, "config.symlink") in found
    for name, prefix in checked:  # nothing behind a linked directory is ever reported
        if name in DIR_NAMES:
            assert not any(path.startswith(prefix + name + "/") for path, _ in found)
