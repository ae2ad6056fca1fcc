"""What the sandbox masks so config cannot appear or change while the agent runs.

Admission proves the workspace clean at one instant; the agent's own tools could create
``.cursor/hooks.json`` a second later. :func:`mask_plan` lists the mounts that make every
config path of :data:`MASKED_PATHS` an empty, read-only file or directory for the whole
run, at every level the agent's config discovery can reach inside the writable workspace
(a directory of :data:`WHOLE_DIRS` is masked whole, so the files in it read as absent).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from worker.admission import rules
from worker.admission.walk import physical_workspace
from worker.errors import InvalidInput

#: Config directories masked whole, as an empty read-only directory, instead of anchored
#: with their config files masked inside. Nothing in a project's ``.codex`` is needed to
#: run a job, and its ``config.toml`` must read as *absent*: codex-acp refuses
#: ``session/new`` when the file exists but cannot be opened (a masked file).
WHOLE_DIRS: tuple[str, ...] = (".codex",)

#: Config paths masked at each level, relative to that level.
MASKED_PATHS: tuple[PurePosixPath, ...] = (
    *(spec.path for spec in rules.PROJECT_CONFIG if spec.path.parts[0] not in WHOLE_DIRS),
    *(PurePosixPath(name) for name in WHOLE_DIRS),
)


class MaskKind(enum.Enum):
    """How one path is mounted inside the sandbox."""

    #: A config directory (``.cursor``, ``.claude``, ``.codex``) pinned as a mount point:
    #: bind it onto itself read-write (``--bind P P``). Mount points cannot be renamed or
    #: removed (EBUSY), so the agent cannot move it aside and build an unmasked twin; its
    #: other content (e.g. ``.cursor/rules``) stays editable.
    ANCHOR = "anchor"
    #: An empty read-only file: ``--ro-bind /dev/null P``.
    FILE = "file"
    #: An empty read-only directory: ``--ro-bind EMPTY P`` with a host-side empty directory
    #: (or ``--tmpfs P --remount-ro P``).
    DIR = "dir"


@dataclass(frozen=True, slots=True)
class MaskEntry:
    """One mount: ``path`` relative to the workspace, mounted as ``kind``."""

    path: PurePosixPath
    kind: MaskKind


def mask_plan(workspace: Path, *, cwd: Path | None = None) -> list[MaskEntry]:
    """The mounts, in order, that freeze config paths from ``cwd`` up to ``workspace``.

    ``cwd`` is the agent's starting directory (default: the workspace itself). Every level
    from it up to the workspace is masked, Git root or not: the agent could delete a
    ``.git`` mid-run and so extend the walk its config discovery makes. Levels above the
    workspace are not in this plan; the sandbox must keep them read-only or absent.

    What the sandbox must do, in list order (anchors come before what they contain):

    * Each mount point must exist before binding, or bubblewrap would create it inside
      the host workspace on its own terms. Create missing ones on the host without
      following symlinks (``mkdir``/``O_CREAT|O_EXCL|O_NOFOLLOW`` under an ``O_NOFOLLOW``
      directory fd): the ``.cursor``/``.claude``/``.codex`` anchor directories, then empty files for
      FILE and empty directories for DIR entries. Remove after the run only what it
      created, and only while still empty.
    * An existing admitted file (ordinary ``.claude/settings.json``) is hidden by the
      empty mask for the run; Cursor only takes hooks/plugins/MCP from it.
    * Run :func:`worker.admission.check_workspace` again in the sandbox's mount view just
      before launch: it must be admitted, and the masks must be in place.

    Raises :class:`~worker.errors.WorkspaceUnavailable` when the workspace or ``cwd`` is
    missing and :class:`~worker.errors.InvalidInput` when ``cwd`` is outside the workspace.
    """
    root = physical_workspace(workspace)
    start = root if cwd is None else _inside(root, cwd)
    chain = (start, *start.parents)
    inside = chain[: chain.index(root) + 1]
    return [entry for level in reversed(inside) for entry in _level_plan(root, level)]


def _inside(root: Path, cwd: Path) -> Path:
    start = physical_workspace(cwd)
    if start != root and root not in start.parents:
        raise InvalidInput(f"cwd {cwd} is outside the workspace {root}", cwd=str(cwd))
    return start


def _level_plan(root: Path, level: Path) -> list[MaskEntry]:
    rel = PurePosixPath(level.relative_to(root).as_posix())
    anchors = [
        MaskEntry(rel / name, MaskKind.ANCHOR)
        for name in rules.CONFIG_DIRS
        if name not in WHOLE_DIRS
    ]
    masks = [
        MaskEntry(rel / spec.path, MaskKind(spec.expect.value))
        for spec in rules.PROJECT_CONFIG
        if spec.path.parts[0] not in WHOLE_DIRS
    ]
    return anchors + masks + [MaskEntry(rel / name, MaskKind.DIR) for name in WHOLE_DIRS]
