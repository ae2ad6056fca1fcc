"""``WorkspaceFiles`` of a Daytona sandbox: ``/workspace`` through the SDK's file API.

The containment rules are those of ``worker.sandbox.files``: :func:`relative` first (no
``..``, inside ``/workspace``, not ``masked`` — the masks applied by content, see
``sync.py``), then every component is looked up with the toolbox's file info, walking
down from ``/workspace``: a symbolic link anywhere refuses (``symlink``), the target must
be a regular file (``not_regular_file``) within the read limit (``too_large``, checked on
the reported size and again on the bytes read, which stop at the limit). A failure of
Daytona's API is the path's refusal (``unreadable``/``not_writable``), not the job's.

What this cannot promise: the checks and the transfer are separate HTTP calls, so an
agent that swaps a component for a link between them is not stopped here (the daemon
reads as the sandbox user, inside the sandbox: nothing of the host is behind a link).

``artifact`` answers from lookups (``worker.sandbox.lookups``: the job awaits
``look_up`` for the paths each notification names before normalizing it); here a lookup
is the same walk, one path at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.admission import MaskEntry
from worker.admission.probe import Kind
from worker.errors import SandboxError
from worker.events.artifacts import Verdict
from worker.sandbox.base import WORKSPACE
from worker.sandbox.daytona import remote
from worker.sandbox.files import PathRefused
from worker.sandbox.lookups import LookedUp


class DaytonaWorkspaceFiles(LookedUp):
    """The sandbox's ``/workspace``, with its masks, reached through Daytona's file API."""

    def __init__(
        self,
        sandbox: remote.Box,
        *,
        masks: Sequence[MaskEntry] = (),
        ttl_s: float = 30.0,
        max_known: int = 1024,
        max_lookups: int = 8,
    ) -> None:
        super().__init__(masks=masks, ttl_s=ttl_s, max_known=max_known, max_lookups=max_lookups)
        self._box = sandbox

    # --- artifacts: looked up through the file API --------------------------------------

    async def _look_up(self, rels: list[str]) -> None:
        for rel in rels:
            await self._verdict(rel)

    async def _verdict(self, rel: str) -> None:
        try:
            info = await self._walk(rel)
            verdict = self._file_verdict(rel, info)
        except PathRefused as refused:
            verdict = Verdict(reason=refused.reason)
        except SandboxError:
            verdict = Verdict(reason="unreadable")
        self.remember(rel, verdict)

    @staticmethod
    def _file_verdict(rel: str, info: object) -> Verdict:
        if remote.kind_of(info) is not Kind.FILE:
            return Verdict(reason="not_regular_file")
        return Verdict(relative=rel, size=remote.size_of(info))

    # --- fs/* -------------------------------------------------------------------------

    async def read_text(self, path: str, *, limit: int) -> str:
        """See :class:`worker.sandbox.files.WorkspaceFiles`."""
        rel = self.relative(path)
        try:
            info = await self._walk(rel)
            if remote.kind_of(info) is not Kind.FILE:
                raise PathRefused("not_regular_file")
            if remote.size_of(info) > limit:
                raise PathRefused("too_large")
            data = await remote.read_bounded(self._box, _remote(rel), limit)
        except SandboxError:
            raise PathRefused("unreadable") from None
        if len(data) > limit:
            raise PathRefused("too_large")
        self.remember(rel, Verdict(relative=rel, size=len(data)))
        return data.decode("utf-8", "replace")

    async def write_text(self, path: str, content: str) -> None:
        """See :class:`worker.sandbox.files.WorkspaceFiles`: missing directories are made
        (mode 755, as the sandbox user: the agent may change them afterwards)."""
        rel = self.relative(path)
        data = content.encode("utf-8")
        fs = self._box.remote.fs
        try:
            info = await self._walk(rel, make_parents=True)
            if info is not None and remote.kind_of(info) is not Kind.FILE:
                raise PathRefused("not_regular_file")
            await self._box.api.call("write file", lambda: fs.upload_file(data, _remote(rel)))
        except SandboxError:
            raise PathRefused("not_writable") from None
        self.remember(rel, Verdict(relative=rel, size=len(data)))

    # --- the walk -----------------------------------------------------------------------

    async def _walk(self, rel: str, *, make_parents: bool = False) -> Any | None:
        """The file info of ``rel`` after every component above it proved a directory and
        no component a link; ``None`` when only the last is missing (``make_parents``:
        missing directories above it are made).

        Raises:
            PathRefused: ``symlink``, ``missing``, ``not_regular_file`` (a component above
                is no directory).
            SandboxError: Daytona failed.
        """
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):
            here = _remote("/".join(parts[:depth]))
            info = await remote.stat(self._box, here)
            last = depth == len(parts)
            if info is None:
                if last and make_parents:
                    return None
                if not make_parents:
                    raise PathRefused("missing")
                await self._make_folder(here)
                continue
            kind = remote.kind_of(info)
            if kind is Kind.SYMLINK:
                raise PathRefused("symlink")
            if last:
                return info
            if kind is not Kind.DIR:
                raise PathRefused("not_regular_file")
        raise AssertionError("unreachable: rel has at least one part")

    async def _make_folder(self, path: str) -> None:
        fs = self._box.remote.fs
        await self._box.api.call("make folder", lambda: fs.create_folder(path, "755"))


def _remote(rel: str) -> str:
    return f"{WORKSPACE}/{rel}"


__all__ = ["DaytonaWorkspaceFiles"]
