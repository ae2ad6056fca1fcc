"""``KubernetesWorkspaceFiles`` against the API double (a real pod on Podman): what the
whole-job tests (``job_backend``'s ``kubernetes``: fs, links, artifacts) do not reach —
the read limit, links in a component for fs/*, FIFOs and directories, new files owned by
the sandbox user, and artifacts answered only once looked up. One pod for all of it, on
a v5 server and on a v4-only one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.integration.docker_engine import base_image, docker_host, engine_config
from tests.integration.test_kubernetes_backend import ENV, _backend, _on_base, _spec
from tests.k8s_double.fixtures import Cluster, base_by_digest, cluster, images
from worker.events.artifacts import Verdict
from worker.images.engine import EngineConfig
from worker.sandbox.base import SANDBOX_UID
from worker.sandbox.files import PathRefused
from worker.sandbox.kubernetes.backend import KubernetesSandbox
from worker.sandbox.kubernetes.files import KubernetesWorkspaceFiles
from worker.sandbox.kubernetes.manifests import CONTAINER

__all__ = ["base_by_digest", "base_image", "cluster", "docker_host", "engine_config", "images"]

pytestmark = pytest.mark.integration

SETUP = (
    "mkdir -p d && printf 0123456789 > ten && ln -s d linkdir && ln -s ten link "
    "&& mkfifo fifo && ln -s /etc outside"
)


async def _sh(sandbox: KubernetesSandbox, script: str) -> bytes:
    proc = await sandbox.spawn(["/bin/sh", "-c", script], env=ENV)
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 30) == 0, await proc.stderr.read()
    return await proc.stdout.read()


async def _reason(files: KubernetesWorkspaceFiles, op: str, path: str) -> str:
    use = files.read_text(path, limit=10) if op == "read" else files.write_text(path, "x")
    with pytest.raises(PathRefused) as refused:
        await use
    return refused.value.reason


@pytest.mark.parametrize("cluster", ["v5", "v4"], indirect=True)
async def test_fs_and_artifacts_in_the_pod(
    tmp_path: Path, cluster: Cluster, images: EngineConfig, base_by_digest: str
) -> None:
    """On a v5 server and on one that negotiates only v4 (no stdin EOF: writes and the
    copy in and out must not wait for it)."""
    backend = _on_base(_backend(tmp_path, cluster, images), base_by_digest)
    spec = _spec(tmp_path)
    (spec.workspace / ".claude").mkdir()
    (spec.workspace / ".claude" / "settings.json").write_text(json.dumps({"x": 1}))
    sandbox = await backend.create(spec)
    try:
        await _sh(sandbox, SETUP)
        files = sandbox.workspace_files()
        assert sandbox.workspace_files() is files
        # The read limit: on the size, exactly at it is fine.
        assert await files.read_text("/workspace/ten", limit=10) == "0123456789"
        with pytest.raises(PathRefused, match="too_large"):
            await files.read_text("ten", limit=9)
        # New file and folder, the sandbox user's (the agent may change them).
        await files.write_text("new/deep/f.txt", "é\n")
        owners = await _sh(sandbox, "stat -c '%u %a %n' new new/deep new/deep/f.txt")
        assert owners.decode().split("\n")[:3] == [
            f"{SANDBOX_UID} 755 new",
            f"{SANDBOX_UID} 755 new/deep",
            f"{SANDBOX_UID} 644 new/deep/f.txt",
        ]
        await files.write_text("new/ünï 1.txt", "named in UTF-8")
        assert await files.read_text("/workspace/new/ünï 1.txt", limit=99) == "named in UTF-8"
        assert "ünï 1.txt" in (await _sh(sandbox, "ls new")).decode()
        await files.write_text("ten", "short")  # replaced, not appended
        assert await files.read_text("ten", limit=10) == "short"
        reasons = [
            await _reason(files, "read", "linkdir/x"),
            await _reason(files, "write", "linkdir/x"),
            await _reason(files, "write", "outside/x"),
            await _reason(files, "read", "link"),
            await _reason(files, "write", "link"),
            await _reason(files, "read", "fifo"),  # never blocks on it
            await _reason(files, "write", "fifo"),
            await _reason(files, "read", "d"),
            await _reason(files, "write", "d"),
            await _reason(files, "write", "ten/x"),
            await _reason(files, "read", "nothing"),
            await _reason(files, "read", ".claude/settings.json"),
            await _reason(files, "write", "/workspace/.."),
            await _reason(files, "read", "/tmp/x"),
        ]
        assert reasons == [
            "symlink",
            "symlink",
            "symlink",
            "symlink",
            "symlink",
            *["not_regular_file"] * 5,
            "missing",
            "masked",
            "traversal",
            "outside_workspace",
        ]
        assert await _sh(sandbox, "ls d; readlink link") == b"ten\n"  # nothing written
        # Artifacts: answered once looked up (the job awaits look_up before each check).
        fresh = KubernetesWorkspaceFiles(backend.api, sandbox.sandbox_id, CONTAINER)
        names = ["ten", "link", "linkdir/ten", "d", "nothing", "fifo", "../x", "new/deep/f.txt"]
        assert fresh.artifact("ten") == Verdict(reason="workspace_not_reachable")
        await fresh.lookups_done()
        assert fresh.artifact("ten") == Verdict(relative="ten", size=5)
        await fresh.look_up(names)
        assert [fresh.artifact(n).reason for n in names] == [
            None,
            "symlink",
            "symlink",
            "not_regular_file",
            "missing",
            "not_regular_file",
            "traversal",
            None,
        ]
        assert fresh.artifact("new/deep/f.txt").size == len("é\n".encode())
    finally:
        await backend.destroy(sandbox.sandbox_id)
    # What fs wrote comes back with the workspace.
    assert (spec.workspace / "new" / "deep" / "f.txt").read_text() == "é\n"
