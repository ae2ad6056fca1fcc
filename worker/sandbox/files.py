"""The sandbox's ``/workspace`` as the worker reaches it: the ``WorkspaceFiles`` seam.

Artifacts the agent references (``artifact.referenced``), ``resource_link`` prompt
blocks, and the client's ``fs/read_text_file`` / ``fs/write_text_file`` all go through
the files object of the job's sandbox (``Sandbox.workspace_files()``). A backend whose
workspace the worker cannot reach returns ``None``: then ``fs`` is not advertised at
``initialize`` and every artifact and link is refused (``workspace_not_reachable``).

Every backend applies the same containment rules; :func:`relative` holds the part that
needs no I/O, so a backend that reaches files through an API (a pod's exec, Daytona's
file API) applies it before it asks:

- the path is not empty and holds no NUL (``invalid_path``);
- no component is ``..``, even one that would land inside (``traversal``);
- an absolute path lies under ``/workspace`` (``outside_workspace``);
- no config mask covers it (``masked``): the sandbox shows the agent an empty,
  read-only stand-in there (``worker.admission.mask_plan``), and the worker neither
  reads what the stand-in hides nor writes what would appear once it is gone.

The rest is checked against the files themselves, walking down from the workspace's
real root: no existing component is a symbolic link (``symlink``); the file exists for a
read or an artifact (``missing``); it is a regular file (``not_regular_file``); a read
stays within its limit (``too_large``); the worker could open or create it
(``unreadable``, ``not_writable``). New files and directories are owned as the sandbox
user would own them, so the agent may change them afterwards.

A refusal is a :class:`PathRefused` (its ``reason`` is one of :data:`REASONS`) from
``read_text``/``write_text`` and a refused ``Verdict`` (``worker.events.artifacts``,
which maps it to events) from ``artifact``. The
refusal is the path's, not the job's: ``fs/*`` answers it as an error, an artifact
becomes a ``notice``, a link fails the prompt (``prompt_refused``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Protocol

from worker.admission import MaskEntry
from worker.errors import Refused
from worker.events.artifacts import Verdict
from worker.sandbox.mountpoints import covering

#: Every ``PathRefused.reason`` (stable API: they reach events and fs/* errors).
REASONS: tuple[str, ...] = (
    "invalid_path",
    "traversal",
    "outside_workspace",
    "masked",
    "symlink",
    "missing",
    "not_regular_file",
    "too_large",
    "unreadable",
    "not_writable",
    "workspace_not_reachable",
)


class PathRefused(Refused):
    """An agent path that is not admitted; ``reason`` is one of :data:`REASONS`."""

    code = "path_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason=reason)
        self.reason = reason


class WorkspaceFiles(Protocol):
    """The job's workspace, reached through its backend's own file access."""

    def artifact(self, path: str) -> Verdict:
        """The verdict for a file the agent references: a regular file inside the
        workspace (with its size), or why not.

        Synchronous, as the event normalizer that asks is: a backend that cannot answer
        cheaply (a round trip to a remote API) returns a refused verdict rather than
        block; it never raises.
        """
        ...

    async def look_up(self, paths: Sequence[str]) -> None:
        """Make :meth:`artifact` answer for ``paths`` (e.g. the prompt's linked files)
        without a round trip: a backend whose ``artifact`` answers from lookups made
        ahead (Daytona's) makes them now; a backend that answers at once does nothing.
        Never raises for a path: its refusal is ``artifact``'s answer."""
        ...

    async def read_text(self, path: str, *, limit: int) -> str:
        """The file's text (UTF-8, bad bytes replaced).

        Raises:
            PathRefused: the path is not admitted, is no regular file, or holds more
                than ``limit`` bytes.
        """
        ...

    async def write_text(self, path: str, content: str) -> None:
        """Create or replace a file, making missing directories inside the workspace.

        Raises:
            PathRefused: the path is not admitted or names no regular file.
        """
        ...


def relative(path: str, *, agent_root: str, masks: Sequence[MaskEntry] = ()) -> str:
    """The workspace-relative form of an agent path (``.`` for the root), after the rules
    that need no I/O (see the module); ``agent_root`` is where the agent sees the
    workspace (``worker.sandbox.base.WORKSPACE``).

    Raises:
        PathRefused: ``invalid_path``, ``traversal``, ``outside_workspace``, ``masked``.
    """
    if "\x00" in path or not path:
        raise PathRefused("invalid_path")
    if ".." in path.split("/"):
        raise PathRefused("traversal")
    rel = posixpath.normpath(path)
    if path.startswith("/"):
        root = agent_root.rstrip("/")
        if rel == root:
            return "."
        if not rel.startswith(root + "/"):
            raise PathRefused("outside_workspace")
        rel = rel[len(root) + 1 :]
    if rel != "." and covering(masks, rel) is not None:
        raise PathRefused("masked")
    return rel
