"""Admission in a sandbox pod's own view, from outside the pod.

The worker cannot see a pod's mounts (it may not even run on the pod's node), so right
before launch it execs two bounded reads in the pod: ``/proc/self/mountinfo`` (the
container's mounts, as every exec shares its mount namespace) and a tar of the
locations admission looks at — the config entries of ``/workspace`` and of ``/`` (the
level above it, when a ``.git`` there makes it the Git root), the ``.git`` markers
alone (not their contents) and the provider's system locations. The archive is
extracted into a temporary root (``transfer``'s filter: links kept verbatim, so the
check sees them as links) and :func:`worker.admission.check_view` runs on it.

The masks must be in place: every one is a mount point of the container at its path
(file and directory masks read-only), or the sandbox is refused (``SandboxError``);
a finding at a masked path is then dropped, as the agent sees the empty mask there.
"""

from __future__ import annotations

import io
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from worker.admission import AdmissionResult, MaskEntry, MaskKind, check_view, rules
from worker.errors import SandboxError
from worker.sandbox import mountpoints
from worker.sandbox.base import WORKSPACE
from worker.sandbox.kubernetes import transfer
from worker.sandbox.kubernetes.api import PodApi

#: Bound on what the pod may send for the check (mount table, config archive).
VIEW_BYTES = 16 * 1024 * 1024
_LEVELS = (WORKSPACE.lstrip("/"), "")


def view_paths(provider: str) -> tuple[list[str], list[str]]:
    """Root-relative paths of the view: ``.git`` markers (the entry alone) and config
    locations (whole)."""
    markers = [f"{level}/.git".lstrip("/") for level in _LEVELS]
    # A path below a config directory comes with it (twice, tar would make it a link).
    top = [s.path for s in rules.PROJECT_CONFIG if s.path.parts[0] not in rules.CONFIG_DIRS]
    names = [*rules.CONFIG_DIRS, *(str(path) for path in top)]
    config = [f"{level}/{name}".lstrip("/") for level in _LEVELS for name in names]
    system = [str(s.path) for s in rules.SYSTEM_CONFIG.get(provider, ())]
    return markers, sorted(set(config)) + system


def view_command(provider: str) -> list[str]:
    """A shell command in the pod that writes the view's archive on stdout (GNU tar:
    the names come NUL-separated from ``find``, which gives a marker alone)."""
    markers, config = view_paths(provider)
    quoted = " ".join(shlex.quote(p) for p in config)
    marks = " ".join(shlex.quote(p) for p in markers)
    script = (
        "cd / || exit 1\n"
        "{ for p in " + marks + "; do "
        'if [ -e "$p" ] || [ -h "$p" ]; then printf "%s\\0" "$p"; fi; done\n'
        "  for p in " + quoted + "; do "
        'if [ -e "$p" ] || [ -h "$p" ]; then find "$p" -print0; fi; done\n'
        "} | exec tar -c -f - --null --no-recursion -T - " + shlex.quote(WORKSPACE.lstrip("/"))
    )
    return ["/bin/sh", "-c", script]


def mounted(mountinfo: str) -> dict[str, bool]:
    """Mount points of a ``/proc/<pid>/mountinfo`` table → read-only (the last mount at
    a point is the one seen)."""
    points: dict[str, bool] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) >= 6:
            point = fields[4].encode().decode("unicode_escape")
            points[point] = "ro" in fields[5].split(",")
    return points


def check_masks(points: dict[str, bool], masks: Sequence[MaskEntry]) -> None:
    """Every mask is a mount point (file and directory masks read-only).

    Raises:
        SandboxError: one is not (``missing``: their paths).
    """
    missing = [
        str(e.path)
        for e in masks
        if points.get(f"{WORKSPACE}/{e.path}") is not (e.kind is not MaskKind.ANCHOR)
    ]
    if missing:
        raise SandboxError("the config masks are not in place in the sandbox pod", missing=missing)


def pod_admission(
    api: PodApi, pod: str, container: str, *, masks: Sequence[MaskEntry], provider: str
) -> AdmissionResult:
    """The admission check in ``pod``'s own view (see the module docstring).

    Raises:
        SandboxError: a read in the pod failed or sent too much, a mask is not in place.
        WorkspaceUnavailable: the view has no workspace directory.
    """
    command = ["cat", "/proc/self/mountinfo"]
    table = transfer.read_output(api, pod, container, command, VIEW_BYTES)
    check_masks(mounted(table.decode(errors="replace")), masks)
    archive = transfer.read_output(api, pod, container, view_command(provider), VIEW_BYTES)
    with tempfile.TemporaryDirectory(prefix="acpw-k8s-view-") as root:
        transfer.extract(io.BytesIO(archive), Path(root))
        result = check_view(Path(root), workspace=WORKSPACE, provider=provider)
    kept = tuple(f for f in result.findings if mountpoints.covering(masks, f.path) is None)
    return replace(result, findings=kept)
