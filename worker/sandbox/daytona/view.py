"""Admission in a Daytona sandbox's own view, rebuilt on this host from its file API.

The sandbox's filesystem is on Daytona's runner, so the view cannot be opened as on
docker (``/proc/<pid>/root``). Instead the bounded set of paths admission looks at is
asked for, one file-info call each, and rebuilt in a private temporary directory:

- at each level from ``/workspace`` up to ``/`` (the walk stops at the level holding a
  ``.git`` directory; past a gitfile or a ``.git`` link, whose target is not rebuilt,
  it goes on, so admission there judges more levels than the sandbox's Git would, never
  fewer): ``.git``, the top-level project config (``.mcp.json``),
  the config directories (``.cursor``, ``.claude``, ``.codex``) and the config paths in
  them;
- the provider's system locations (``/etc/cursor/hooks.json``, …).

A directory is rebuilt as a directory, a regular file as an empty file except where
admission reads the content (Claude settings, a gitfile), which is downloaded bounded by
:data:`worker.admission.MAX_SETTINGS_BYTES` (one byte more, so "too large" stays
visible); a symbolic link as a link to nowhere, anything else as a FIFO. Then
:func:`worker.admission.check_view` runs on it, so its findings read as in the sandbox.
Masks are applied by content (``sync.py``) and the relay binds what is at a masked path
read-only onto itself, so the agent sees what is there: a finding at a masked path is
kept, with one exception: a finding at a file or directory mask's own path where the
sandbox holds an empty regular file or an empty directory (listed: one more call) —
what the relay makes as a mask point (a warm slot's running relay made them before its
job's admission), which the agent sees empty and cannot write.
At most ``_MAX_CALLS`` file API calls and ``_MAX_BYTES`` bytes.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from worker.admission import MAX_SETTINGS_BYTES, AdmissionResult, MaskEntry, MaskKind, check_view
from worker.admission import rules as admission_rules
from worker.admission.probe import Kind
from worker.errors import SandboxError
from worker.sandbox.base import WORKSPACE
from worker.sandbox.daytona import remote

_MAX_CALLS = 128
_MAX_BYTES = 8 * MAX_SETTINGS_BYTES
_GIT_FILE_BYTES = 4096


class _Rebuild:
    """The view under ``root``, filled from the sandbox within the bounds."""

    def __init__(self, sandbox: remote.Box, root: Path) -> None:
        self.box = sandbox
        self.root = root
        self.calls = 0
        self.bytes = 0
        #: sandbox paths of the regular files found empty (their size by file info)
        self.empty: set[PurePosixPath] = set()
        #: sandbox paths of the directories found
        self.dirs: set[PurePosixPath] = set()

    async def stat(self, path: PurePosixPath) -> Any | None:
        self.calls += 1
        if self.calls > _MAX_CALLS:
            raise SandboxError("daytona: the admission view asks too much", calls=self.calls)
        return await remote.stat(self.box, str(path))

    async def copy(self, path: PurePosixPath, *, content: int | None = None) -> Kind:
        """Rebuild ``path`` (absolute in the sandbox) in the view; ``content``: how many
        bytes of a regular file admission reads. Its kind (``MISSING`` if absent)."""
        info = await self.stat(path)
        if info is None:
            return Kind.MISSING
        kind = remote.kind_of(info)
        local = self.root / path.relative_to("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if kind is Kind.DIR:
            local.mkdir(exist_ok=True)
            self.dirs.add(path)
        elif kind is Kind.SYMLINK:
            local.symlink_to("/nonexistent/acpw-daytona-link")
        elif kind is Kind.FILE:
            # An empty file (a warm slot's mask points, made by its running relay) is not
            # downloaded: the SDK refuses a download that yields no data.
            size = remote.size_of(info)
            if size == 0:
                self.empty.add(path)
            local.write_bytes(await self._read(path, content) if content and size else b"")
        else:
            os.mkfifo(local)
        return kind

    async def _read(self, path: PurePosixPath, limit: int) -> bytes:
        self.calls += 1
        data = await remote.read_bounded(self.box, str(path), limit)
        self.bytes += len(data)
        if self.bytes > _MAX_BYTES:
            raise SandboxError("daytona: the admission view reads too much", bytes=self.bytes)
        return data

    async def is_empty_dir(self, path: PurePosixPath) -> bool:
        self.calls += 1
        if self.calls > _MAX_CALLS:
            raise SandboxError("daytona: the admission view asks too much", calls=self.calls)
        fs = self.box.remote.fs
        found = await self.box.api.call("list files", lambda: fs.list_files(str(path)))
        return not found

    async def mask_point(self, entry: MaskEntry) -> bool:
        """Whether the sandbox holds at ``entry``'s path what the relay makes there: an
        empty regular file for a file mask, an empty directory for a directory mask."""
        path = PurePosixPath(WORKSPACE) / entry.path
        if entry.kind is MaskKind.FILE:
            return path in self.empty
        return entry.kind is MaskKind.DIR and path in self.dirs and await self.is_empty_dir(path)

    async def level(self, level: PurePosixPath) -> Kind:
        """Rebuild one level's config paths; the kind of its ``.git``."""
        git = await self.copy(level / ".git", content=_GIT_FILE_BYTES)
        for spec in admission_rules.PROJECT_CONFIG:
            if spec.path.parent == PurePosixPath("."):
                await self.copy(level / spec.path, content=_limit(spec))
        for name in admission_rules.CONFIG_DIRS:
            if await self.copy(level / name) is not Kind.DIR:
                continue
            for spec in admission_rules.PROJECT_CONFIG:
                if spec.path.parent.name == name:
                    await self.copy(level / spec.path, content=_limit(spec))
        return git

    async def system(self, provider: str) -> None:
        for spec in admission_rules.SYSTEM_CONFIG.get(provider, ()):
            await self.copy(PurePosixPath("/") / spec.path, content=_limit(spec))


def _limit(spec: admission_rules.ConfigPath) -> int | None:
    return MAX_SETTINGS_BYTES if spec.keys is not None else None


async def sandbox_admission(
    sandbox: remote.Box, *, provider: str, masks: Sequence[MaskEntry] = ()
) -> AdmissionResult:
    """The admission check as the sandbox sees ``/workspace`` (see the module).

    Raises:
        SandboxError: Daytona failed, or the view needed more than its bounds.
        InvalidInput: an unknown provider.
        WorkspaceUnavailable: the sandbox has no ``/workspace`` directory.
    """
    with tempfile.TemporaryDirectory(prefix="acpw-daytona-view-") as tmp:
        root = Path(tmp)
        rebuild = _Rebuild(sandbox, root)
        if await rebuild.copy(PurePosixPath(WORKSPACE)) is Kind.DIR:
            level = PurePosixPath(WORKSPACE)
            while True:
                git = await rebuild.level(level)
                if git is Kind.DIR or level == level.parent:
                    break
                level = level.parent
        await rebuild.system(provider)
        result = check_view(root, workspace=WORKSPACE, provider=provider)
    points = {e.path: e for e in masks if e.kind is not MaskKind.ANCHOR}
    kept = []
    for finding in result.findings:
        entry = points.get(PurePosixPath(finding.path))
        if entry is None or not await rebuild.mask_point(entry):
            kept.append(finding)
    return dataclasses.replace(result, findings=tuple(kept))
