"""The workspace and the writable HOME mounts, into a Daytona sandbox and back.

In: one tar of the staged workspace (as ``workspace/…``) and of each writable mount's
source (as its target below HOME, without the leading ``/``), uploaded through the SDK's
file API and unpacked by a session command at ``/``.

Out (``destroy`` of the process that made the sandbox, once the agent is stopped and
before the sandbox is deleted): a session command tars the same paths, the tar is
downloaded as a stream bounded by ``daytona_sync_max_bytes``, and extracted with
``worker.safetree.extract_tar`` (regular files, directories and symbolic links — made as
links, never followed —, no ``..``, no overwrite, nothing below a link, bounded by bytes
and entries: what the agent wrote is untrusted) into a fresh directory inside the
workspace; the workspace's and each mount's old contents are then replaced by what came
back, never listing, entering or moving anything through a link, so the change capture
compares the sandbox's final tree with the one staged, as on docker (a repository's own
links come back as they went in). A hard link, device or other special file the agent
left refuses the whole archive (``archive_refused``): nothing is replaced, the error is
the destroy's.

Masks (Daytona has no bind mounts from the host): when the spec asks for masks
(``spec.mask_config``), what a mask of ``worker.admission.mask_plan`` covers is left out
of the upload, so an admitted ``.claude/settings.json`` or a ``.codex`` directory never
reaches the agent; for the agent's run the relay makes those paths locked read-only mounts
inside the sandbox (``relay.py``), so it reads them as empty and cannot write there. On
the way back a masked path is neither reported deleted (the host copy stays exactly as it
was) nor taken back: whatever is there (say, the relay's empty mask points when it was
killed before removing them) is discarded and logged (``daytona: discarded …``).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from worker.admission import MaskEntry, mask_plan
from worker.safetree.bounds import Bounds
from worker.safetree.extract import extract_tar
from worker.safetree.remove import remove_tree
from worker.sandbox.base import WORKSPACE, SandboxSpec
from worker.sandbox.mountpoints import covering

log = logging.getLogger(__name__)

IN_TAR = "/tmp/acpw-in.tar"  # noqa: S108 - inside the sandbox
OUT_TAR = "/tmp/acpw-out.tar"  # noqa: S108 - inside the sandbox


def roots(spec: SandboxSpec) -> list[tuple[Path, str]]:
    """(host directory, its path in the sandbox without the leading ``/``) of every tree
    that goes in and comes back."""
    pairs = [(spec.workspace, WORKSPACE.lstrip("/"))]
    pairs += [(m.source, m.target.lstrip("/")) for m in spec.state_mounts]
    return pairs


def masks(spec: SandboxSpec) -> tuple[MaskEntry, ...]:
    """The masks the spec asks for (none when ``mask_config`` is off).

    Raises:
        WorkspaceUnavailable: the workspace is missing.
    """
    return tuple(mask_plan(spec.workspace)) if spec.mask_config else ()


def pack_in(spec: SandboxSpec, dest: Path, *, masked: Sequence[MaskEntry] = ()) -> None:
    """Write the tar that goes in (owner names and ids dropped: the sandbox user owns
    what it unpacks), without what ``masked`` covers in the workspace."""
    prefix = WORKSPACE.lstrip("/") + "/"

    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.name.startswith(prefix) and covering(masked, info.name[len(prefix) :]):
            return None  # and, for a directory, nothing below it
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


def bring_back(
    spec: SandboxSpec,
    tar_path: Path,
    *,
    max_bytes: int,
    max_entries: int,
    masked: Sequence[MaskEntry] = (),
) -> list[str]:
    """Extract the downloaded tar safely and replace each tree's contents with it; in the
    workspace, what ``masked`` covers is kept on the host as it was and discarded from
    what came back. Returns the discarded workspace-relative paths (sorted).

    Raises:
        ArchiveRefused: the archive holds something unsafe or exceeds the bounds.
        OSError: a tree could not be replaced.
    """
    staging = spec.workspace / f".acpw-daytona-{secrets.token_hex(4)}"
    staging.mkdir(mode=0o700)
    try:
        with tar_path.open("rb") as src:
            extract_tar(
                src, staging, compressed=False, symlinks=True,
                bounds=Bounds(max_bytes=max_bytes, max_entries=max_entries),
                file_mode=lambda mode: mode & 0o755, max_stream=2 * max_bytes + 1024**2,
            )  # fmt: skip
        discarded: list[str] = []
        for n, (host, inside) in enumerate(roots(spec)):
            merge = _Merge(masked if n == 0 else (), keep=(staging.name,))
            merge.replace(host, staging / inside, PurePosixPath("."))
            discarded += merge.discarded
    finally:
        remove_tree(staging)
    if discarded:
        log.warning(
            "daytona: discarded %d path(s) the agent made at masked config paths: %s",
            len(discarded), ", ".join(sorted(discarded)[:20]),
        )  # fmt: skip
    return sorted(discarded)


class _Merge:
    """Replace a host tree's contents with what came back, around the masks."""

    def __init__(self, masked: Sequence[MaskEntry], *, keep: Sequence[str]) -> None:
        self.masked = masked
        self.keep = keep
        #: Directories that hold a masked path: merged entry by entry, never replaced.
        self.holders = {str(p) for e in masked for p in e.path.parents if str(p) != "."}
        self.discarded: list[str] = []

    def replace(self, host: Path, came_back: Path, rel: PurePosixPath) -> None:
        held: list[str] = []
        for entry in os.listdir(host):
            sub = rel / entry
            top = rel == PurePosixPath(".") and entry in self.keep
            if top or covering(self.masked, str(sub)):
                continue
            path = host / entry
            if str(sub) in self.holders and _real_dir(path):
                held.append(entry)
            elif _real_dir(path):
                remove_tree(path)
            else:
                path.unlink()
        for entry in held:  # what the agent removed: emptied around the masked paths
            if not _real_dir(came_back / entry):
                self.replace(host / entry, came_back / entry, rel / entry)
        if not _real_dir(came_back):  # gone, or a link: never listed through
            return
        for entry in os.listdir(came_back):
            self._take(host, came_back, rel, entry)

    def _take(self, host: Path, came_back: Path, rel: PurePosixPath, entry: str) -> None:
        sub, source, target = rel / entry, came_back / entry, host / entry
        if covering(self.masked, str(sub)):
            self.discarded.append(str(sub))
            return
        made = False
        if str(sub) in self.holders and _real_dir(source) and not os.path.lexists(target):
            target.mkdir()  # a new config directory: merged, so its masked paths stay out
            shutil.copymode(source, target)
            made = True
        if _real_dir(target):  # a holder
            if _real_dir(source):
                self.replace(target, source, sub)
            else:  # a file where the host keeps masked config: not taken
                self.discarded.append(str(sub))
            if made and not os.listdir(target):
                target.rmdir()  # only masked paths were in it (and no empty dir comes back)
        else:
            shutil.move(str(source), str(target))


def _real_dir(path: Path) -> bool:
    """A directory itself, not a link to one: what came back may hold links the agent
    made (to ``/etc``, say), and none is ever listed, entered or moved through."""
    return path.is_dir() and not path.is_symlink()
