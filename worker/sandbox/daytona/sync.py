"""The workspace and the writable HOME mounts, into a Daytona sandbox and back.

In: one tar of the staged workspace (as ``workspace/…``) and of each writable mount's
source (as its target below HOME, without the leading ``/``), uploaded through the SDK's
file API and unpacked by a session command at ``/``.

Out (``destroy`` of the process that made the sandbox, once the agent is stopped and
before the sandbox is deleted): a session command tars the same paths, the tar is
downloaded as a stream bounded by ``daytona_sync_max_bytes``, and extracted with
``worker.safetree.extract_tar`` (regular files and directories only, no ``..``, no
overwrite, bounded by bytes and entries: what the agent wrote is untrusted) into a fresh
directory inside the workspace; the workspace's and each mount's old contents are then
replaced by what came back, so the change capture compares the sandbox's final tree with
the one staged, as on docker. A symlink or special file the agent left refuses the whole
archive (``archive_refused``): nothing is replaced, the error is the destroy's.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from worker.safetree.bounds import Bounds
from worker.safetree.extract import extract_tar
from worker.safetree.remove import remove_tree
from worker.sandbox.base import WORKSPACE, SandboxSpec

IN_TAR = "/tmp/acpw-in.tar"  # noqa: S108 - inside the sandbox
OUT_TAR = "/tmp/acpw-out.tar"  # noqa: S108 - inside the sandbox


def roots(spec: SandboxSpec) -> list[tuple[Path, str]]:
    """(host directory, its path in the sandbox without the leading ``/``) of every tree
    that goes in and comes back."""
    pairs = [(spec.workspace, WORKSPACE.lstrip("/"))]
    pairs += [(m.source, m.target.lstrip("/")) for m in spec.state_mounts]
    return pairs


def pack_in(spec: SandboxSpec, dest: Path) -> None:
    """Write the tar that goes in (owner names and ids dropped: the sandbox user owns
    what it unpacks)."""

    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(dest, "w") as tar:
        for host, inside in roots(spec):
            tar.add(host, arcname=inside, recursive=True, filter=anonymous)


def unpack_in_command(spec: SandboxSpec) -> str:
    """The command that unpacks the uploaded tar at ``/`` and removes it."""
    dirs = " ".join(f"/{inside}" for _, inside in roots(spec))
    return (
        f"mkdir -p {dirs} && tar -xf {IN_TAR} -C / --no-same-owner --no-same-permissions "
        f"&& rm -f {IN_TAR}"
    )


def pack_out_command(spec: SandboxSpec) -> str:
    """The command that tars what comes back."""
    paths = " ".join(inside for _, inside in roots(spec))
    return f"tar -cf {OUT_TAR} -C / {paths}"


def bring_back(spec: SandboxSpec, tar_path: Path, *, max_bytes: int, max_entries: int) -> None:
    """Extract the downloaded tar safely and replace each tree's contents with it.

    Raises:
        ArchiveRefused: the archive holds something unsafe or exceeds the bounds.
        OSError: a tree could not be replaced.
    """
    staging = spec.workspace / f".acpw-daytona-{secrets.token_hex(4)}"
    staging.mkdir(mode=0o700)
    try:
        with tar_path.open("rb") as src:
            extract_tar(
                src, staging, compressed=False,
                bounds=Bounds(max_bytes=max_bytes, max_entries=max_entries),
                file_mode=lambda mode: mode & 0o755, max_stream=2 * max_bytes + 1024**2,
            )  # fmt: skip
        for host, inside in roots(spec):
            _replace(host, staging / inside, keep=(staging.name,))
    finally:
        remove_tree(staging)


def _replace(host: Path, came_back: Path, *, keep: Sequence[str]) -> None:
    for entry in os.listdir(host):
        if entry in keep:
            continue
        path = host / entry
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            path.unlink()
    if not came_back.is_dir():
        return
    for entry in os.listdir(came_back):
        shutil.move(str(came_back / entry), str(host / entry))
