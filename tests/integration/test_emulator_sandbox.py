"""The built emulator pack runs under real bubblewrap the way the worker launches it.

Cleared environment, pack closure read-only at /opt/acp-pack, workspace read-write at
/workspace, HOME on a private tmpfs, no network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "provider_packs" / "cursor-emulator"
BWRAP = shutil.which("bwrap")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed"),
]


def bwrap_argv(closure: Path, workspace: Path, env: dict[str, str]) -> list[str]:
    argv = [str(BWRAP), "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += [
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/home/agent", "--tmpfs", "/tmp",
        "--ro-bind", str(closure), "/opt/acp-pack", "--bind", str(workspace), "/workspace",
        "--chdir", "/workspace",
        "/usr/bin/python3", "/opt/acp-pack/cursor_emulator.py",
        "--disable-project-configs", "--disable-auto-update", "acp",
    ]  # fmt: skip
    return argv


@pytest.fixture
def closure(tmp_path: Path) -> Path:
    out = tmp_path / "dist"
    subprocess.run([sys.executable, str(PACK / "build.py"), "--out", str(out)],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    target = tmp_path / "closure"
    with tarfile.open(out / "cursor-emulator-linux.tar") as tar:
        tar.extractall(target, filter="data")
    return target


def converse(argv: list[str], lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every line, then EOF; return everything the agent wrote before exiting."""
    payload = "".join(json.dumps(m) + "\n" for m in lines)
    res = subprocess.run(argv, check=False, input=payload.encode(), capture_output=True, timeout=30)
    assert res.stderr == b""
    assert res.returncode == 0
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_pack_runs_in_bubblewrap(closure: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".cursor").mkdir(parents=True)
    (workspace / ".cursor" / "hooks.json").write_text("{}")
    env = {"HOME": "/home/agent", "CURSOR_API_KEY": "k", "PATH": "/usr/bin:/bin"}
    argv = bwrap_argv(closure, workspace, env)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}  # fmt: skip
    new = {"jsonrpc": "2.0", "id": 2, "method": "session/new",
           "params": {"cwd": "/workspace", "mcpServers": []}}  # fmt: skip
    out = converse(argv, [init, new])
    assert out[0]["result"]["protocolVersion"] == 1
    assert "sessionId" in out[1]["result"]
    # The hook "ran" inside the sandbox and its marker reached the bind-mounted workspace.
    assert (workspace / ".cursor-emulator-hook-ran").read_text() == ".cursor/hooks.json\n"
    # The read-only closure stayed clean: no bytecode caches were written into it.
    assert not list(closure.rglob("__pycache__"))
