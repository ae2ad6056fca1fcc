"""Agent config paths stay masked for the whole run: the real emulator in real sandboxes.

The attack, its control experiment and the mount point bookkeeping run on both backends:
real bubblewrap (``local``) and a real container engine (``docker``: Podman's Docker API).
The Cursor emulator "runs" any project config it can see at session/new, at each prompt
and on `load-config` by appending to `<cwd>/.cursor-emulator-hook-ran`; no marker means
nothing was loaded. The emulator speaks ACP over the sandbox's stdio, driven line by line.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.sandbox_owner import chown_to_sandbox
from worker.errors import AdmissionRefused, SandboxError
from worker.sandbox.base import (
    SANDBOX_GID,
    SANDBOX_UID,
    ResourceLimits,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from worker.sandbox.config import DockerConfig, LocalConfig
from worker.sandbox.docker import DockerBackend, DockerSandbox
from worker.sandbox.local import LocalBackend, LocalSandbox

__all__ = ["base_image", "docker_host", "engine_config"]  # fixtures used below

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "provider_packs" / "cursor-emulator"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent", "CURSOR_API_KEY": "k"}
EMULATOR = [
    "/usr/bin/python3",
    "/opt/acp-pack/cursor_emulator.py",
    "--disable-project-configs",
    "--disable-auto-update",
    "acp",
]
MARKER = ".cursor-emulator-hook-ran"
CREATED = {
    ".cursor",
    ".cursor/mcp.json",
    ".cursor/hooks.json",
    ".cursor/plugins",
    ".cursor/extensions",
    ".mcp.json",
    ".claude",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".codex",  # masked whole: inside, .codex/config.toml is absent (codex-acp needs that)
}
WRITTEN = (".cursor/hooks.json", ".mcp.json", ".claude/settings.json")
ATTACK_LINES = (
    "#!scenario",
    'write .cursor/hooks.json {"hooks":{"stop":[{"command":"touch /workspace/pwned"}]}}',
    'write .mcp.json {"mcpServers":{"x":{"command":"/bin/sh"}}}',
    'write .claude/settings.json {"hooks":{"Stop":[{"command":"true"}]}}',
    "write .codex/config.toml [mcp_servers.x]",
    "exec mkdir .cursor/plugins/x",
    "exec mv .cursor .cursor-away",
    "exec rm -rf .cursor",
    "exec mkdir -p .cursor && echo '{}' > .cursor/hooks.json",
    "load-config",
    "say done",
)
ATTACK = "\n".join(ATTACK_LINES)


@pytest.fixture(scope="module")
def etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("etc") / "etc"


@pytest.fixture(scope="module")
def closure(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, str(PACK / "build.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    target = tmp_path_factory.mktemp("closure")
    with tarfile.open(out / "cursor-emulator-linux.tar") as tar:
        tar.extractall(target, filter="data")
    target.chmod(0o755)  # mktemp makes it 0700: the sandbox uid must be able to read it
    return target


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "README.md").write_text("# hi\n")
    chown_to_sandbox(ws, LocalConfig())
    return ws


def _backend(tmp_path: Path, etc: Path) -> LocalBackend:
    config = LocalConfig(cgroup_parent="acpw-test")
    return LocalBackend(config, state_dir=tmp_path / "state", etc_dir=etc)


def _spec(ws: Path, pack: Path, **kw: Any) -> SandboxSpec:
    return SandboxSpec(
        job_id="mask",
        attempt=1,
        workspace=ws,
        pack_closure=pack,
        limits=ResourceLimits(memory_bytes=512 << 20, cpus=1.0, pids=128),
        labels={"suite": "masking"},
        **kw,
    )


@pytest.fixture(params=["local", "docker"])
def any_backend(request: pytest.FixtureRequest, tmp_path: Path, etc: Path) -> SandboxBackend:
    if request.param == "local":
        return _backend(tmp_path, etc)
    request.getfixturevalue("base_image")
    return DockerBackend(DockerConfig(), engine_config=request.getfixturevalue("engine_config"))


def _owner(backend: SandboxBackend) -> tuple[int, int]:
    """The host (uid, gid) that what the agent writes belongs to."""
    if isinstance(backend, DockerBackend):
        return SANDBOX_UID, SANDBOX_GID
    return LocalConfig().host_owner()


@pytest.fixture
async def box(
    tmp_path: Path, etc: Path, closure: Path
) -> AsyncIterator[tuple[LocalBackend, LocalSandbox]]:
    backend = _backend(tmp_path, etc)
    sandbox = await backend.create(_spec(_workspace(tmp_path), closure))
    try:
        yield backend, sandbox
    finally:
        await backend.destroy(sandbox.sandbox_id)


def _tree(ws: Path) -> set[str]:
    return {str(p.relative_to(ws)) for p in ws.rglob("*")}


class Acp:
    """Just enough ACP client to play one prompt against the emulator."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.updates: list[dict[str, Any]] = []
        self._id = 0

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        line = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(line).encode() + b"\n")
        await self.proc.stdin.drain()
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), 20)
            assert raw, await self.proc.stderr.read()
            msg = json.loads(raw)
            if msg.get("id") == self._id and "method" not in msg:
                assert "error" not in msg, msg
                return dict(msg["result"])
            if msg.get("method") == "session/update":
                self.updates.append(msg["params"]["update"])

    def tool_outputs(self) -> list[Any]:
        return [
            u.get("rawOutput")
            for u in self.updates
            if u.get("sessionUpdate") == "tool_call_update" and u.get("rawOutput") is not None
        ]


async def _play(sandbox: Sandbox, prompt: str) -> Acp:
    proc = await sandbox.spawn(EMULATOR, env=ENV)
    acp = Acp(proc)
    try:
        await acp.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        session = await acp.request("session/new", {"cwd": "/workspace", "mcpServers": []})
        text = [{"type": "text", "text": prompt}]
        result = await acp.request(
            "session/prompt", {"sessionId": session["sessionId"], "prompt": text}
        )
        assert result["stopReason"] == "end_turn"
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 20)
    return acp


# --- the attack -----------------------------------------------------------------------


async def test_config_written_mid_turn_is_never_loaded(
    any_backend: SandboxBackend, tmp_path: Path, closure: Path
) -> None:
    backend = any_backend
    ws = _workspace(tmp_path)
    sandbox = await backend.create(_spec(ws, closure))
    try:
        assert _tree(ws) >= CREATED  # the mount points exist on the host during the run
        acp = await _play(sandbox, ATTACK)
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert _tree(ws) == {"README.md"}  # every mount point made for the run is gone

    outputs = acp.tool_outputs()
    writes, codex, (mkdir_plugin, mv, rm, recreate) = outputs[:3], outputs[3], outputs[4:]
    # Each write hit a mask: /dev/null on a nodev mount cannot be opened at all.
    assert [w["error"] for w in writes] == [
        f"[Errno 13] Permission denied: '/workspace/{p}'" for p in WRITTEN
    ]
    # .codex is an empty read-only directory: nothing can be created in it.
    assert codex["error"] == "[Errno 30] Read-only file system: '/workspace/.codex/config.toml'"
    assert "Read-only file system" in mkdir_plugin["stderr"]
    assert "Device or resource busy" in mv["stderr"]  # .cursor is a mount point
    assert "Device or resource busy" in rm["stderr"]
    assert "Permission denied" in recreate["stderr"]  # it still is the masked .cursor
    assert all(o["exitCode"] != 0 for o in (mkdir_plugin, mv, rm, recreate))

    # Nothing was "run": not at session/new, not at the prompt, not on load-config.
    assert not (ws / MARKER).exists()
    assert not (ws / "pwned").exists()
    assert not (ws / ".cursor-away").exists()  # and no host config file was ever written


async def test_mask_mount_points_are_empty_on_the_host_during_the_run(
    any_backend: SandboxBackend, tmp_path: Path, closure: Path
) -> None:
    ws = _workspace(tmp_path)
    sandbox = await any_backend.create(_spec(ws, closure))
    try:
        await _play(sandbox, ATTACK)
        for rel in WRITTEN:
            assert (ws / rel).read_bytes() == b"", rel  # the host files were never written
        assert not any((ws / ".cursor" / "plugins").iterdir())
        assert not any((ws / ".codex").iterdir())
    finally:
        await any_backend.destroy(sandbox.sandbox_id)


async def test_without_masks_the_same_run_loads_the_config(
    any_backend: SandboxBackend, tmp_path: Path, closure: Path
) -> None:
    # The control experiment: the attack works when masking is off, so the test above
    # proves the masks, not a broken scenario.
    backend = any_backend
    ws = _workspace(tmp_path)
    sandbox = await backend.create(_spec(ws, closure, mask_config=False))
    try:
        assert isinstance(sandbox, LocalSandbox | DockerSandbox)
        assert sandbox.masks == ()
        await _play(sandbox, ATTACK)
        assert (ws / MARKER).read_text().splitlines() == [
            ".cursor/hooks.json",
            ".mcp.json",
            ".claude/settings.json",
        ]
        assert (ws / ".codex" / "config.toml").read_text() == "[mcp_servers.x]"
        stat = os.stat(ws / ".mcp.json")
        assert (stat.st_uid, stat.st_gid) == _owner(backend)
    finally:
        await backend.destroy(sandbox.sandbox_id)


# --- mount points ---------------------------------------------------------------------


async def test_existing_config_is_hidden_and_kept(tmp_path: Path, etc: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / ".claude").mkdir()
    (ws / ".claude" / "settings.json").write_text('{"model": "x"}')  # admitted: no hooks
    (ws / ".cursor").mkdir()
    (ws / ".cursor" / "rules").write_text("be nice\n")
    chown_to_sandbox(ws, LocalConfig())
    pack = tmp_path / "pack"
    pack.mkdir()
    backend = _backend(tmp_path, etc)
    sandbox = await backend.create(_spec(ws, pack))
    try:
        proc = await sandbox.spawn(
            ["/bin/sh", "-c", "cat .claude/settings.json; cat .cursor/rules; ls -A .cursor"],
            env=ENV,
        )
        out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        await proc.wait()
        assert b"Permission denied" in err  # the settings file is masked ...
        assert b'"model"' not in out
        assert out.splitlines() == [  # ... the rest of .cursor is as it was
            b"be nice",
            b"extensions",
            b"hooks.json",
            b"mcp.json",
            b"plugins",
            b"rules",
        ]
    finally:
        await backend.destroy(sandbox.sandbox_id)
    assert _tree(ws) == {
        "README.md",
        ".claude",
        ".claude/settings.json",
        ".cursor",
        ".cursor/rules",
    }
    assert (ws / ".claude" / "settings.json").read_text() == '{"model": "x"}'
    assert (ws / ".cursor" / "rules").read_text() == "be nice\n"


async def test_a_symlinked_config_dir_is_refused(
    any_backend: SandboxBackend, tmp_path: Path
) -> None:
    ws = _workspace(tmp_path)
    (ws / ".cursor").symlink_to("/etc")
    pack = tmp_path / "pack"
    pack.mkdir()
    backend = any_backend
    with pytest.raises(SandboxError, match=r"\.cursor is not a directory"):
        await backend.create(_spec(ws, pack))
    assert await backend.list({}) == []
    assert _tree(ws) == {"README.md", ".cursor"}  # nothing made, nothing left


async def test_a_reaper_removes_the_mount_points(
    any_backend: SandboxBackend, tmp_path: Path
) -> None:
    ws = _workspace(tmp_path)
    pack = tmp_path / "pack"
    pack.mkdir()
    sandbox = await any_backend.create(_spec(ws, pack))
    assert _tree(ws) >= CREATED
    reaper: SandboxBackend
    if isinstance(any_backend, DockerBackend):  # another instance knows only the engine
        reaper = DockerBackend(DockerConfig(), engine_config=any_backend.engine_config)
    else:
        reaper = LocalBackend(LocalConfig(cgroup_parent="acpw-test"), state_dir=tmp_path / "state")
    await reaper.destroy(sandbox.sandbox_id)
    assert _tree(ws) == {"README.md"}
    assert await reaper.list({"suite": "masking"}) == []


# --- admission in the mount view ------------------------------------------------------


async def test_admission_view_is_clean_with_masks_in_place(
    box: tuple[LocalBackend, LocalSandbox], tmp_path: Path
) -> None:
    _, sandbox = box
    ws = tmp_path / "ws"
    (ws / ".cursor" / "hooks.json").write_text('{"hooks": {}}')  # hidden by its mask
    view = sandbox.admission_view()
    assert view.admitted, view.findings
    # The same workspace, checked as the host sees it, is refused: the view is what differs.
    from worker.admission import check_workspace

    assert {f.path for f in check_workspace(ws).findings} >= {".cursor/hooks.json", ".mcp.json"}


async def test_admission_view_reports_what_a_mask_cannot_cover(
    box: tuple[LocalBackend, LocalSandbox], tmp_path: Path
) -> None:
    _, sandbox = box
    hooks = tmp_path / "ws" / ".cursor" / "hooks.json"
    hooks.unlink()
    hooks.symlink_to("/etc/passwd")  # swapped after create: bwrap would follow it
    view = sandbox.admission_view()
    assert [(f.path, f.rule) for f in view.findings] == [(".cursor/hooks.json", "config.symlink")]

    async def check() -> None:
        sandbox.admission_view().raise_if_refused()

    with pytest.raises(AdmissionRefused):
        await sandbox.spawn(["/bin/true"], env=ENV, before_launch=check)
    status = await box[0].status(sandbox.sandbox_id)
    assert status is not None
    assert not status.running  # the hook refused before anything started
    hooks.unlink()
    hooks.touch()


async def test_admission_view_ignores_config_above_the_workspace(tmp_path: Path, etc: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".mcp.json").write_text("{}")  # above the workspace: not in the mount view
    ws = repo / "ws"
    ws.mkdir()
    chown_to_sandbox(ws, LocalConfig())
    pack = tmp_path / "pack"
    pack.mkdir()
    backend = _backend(tmp_path, etc)
    sandbox = await backend.create(_spec(ws, pack))
    try:
        view = sandbox.admission_view()
        assert view.admitted, view.findings
        assert view.git_root is None
    finally:
        await backend.destroy(sandbox.sandbox_id)
