"""Files the agent points at (generated images, tool resources) → ``artifact.referenced``.

The containment check itself is I/O and lives at the host seam
(:class:`worker.acp.paths.WorkspacePaths`); this module only maps a verdict to events.
A path is never read or uploaded: the event says ``registered: false``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.events.bounded import bounded

Out = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A checked path: ``relative`` and ``size`` when admitted, else ``reason``."""

    relative: str | None = None
    size: int = 0
    reason: str | None = None


ArtifactCheck = Callable[[str], Verdict]


def refuse_all(path: str) -> Verdict:
    """The check used when the worker cannot see the workspace from the host."""
    return Verdict(reason="workspace_not_reachable")


def referenced(
    check: ArtifactCheck,
    path: Any,
    kind: str,
    *,
    tool_call_id: str | None,
    description: str | None = None,
) -> Out:
    """One ``artifact.referenced`` event, or a ``notice`` saying why the path was refused."""
    if not isinstance(path, str) or not path:
        return []
    verdict = check(path)
    if verdict.relative is None:
        return [_refused(path, kind, verdict.reason or "refused")]
    data: dict[str, Any] = {
        "path": verdict.relative,
        "kind": kind,
        "registered": False,
        "bytes": verdict.size,
        "tool_call_id": tool_call_id,
    }
    if description is not None:
        data["description"] = bounded(description, 2048)["text"]
    return [("artifact.referenced", data)]


def _refused(path: str, kind: str, reason: str) -> tuple[str, dict[str, Any]]:
    return (
        "notice",
        {
            "level": "warning",
            "code": "artifact_refused",
            "message": f"the agent referenced a file that is not a regular file inside the "
            f"workspace ({reason}); it was not passed on",
            "details": {"path": bounded(path, 512)["text"], "kind": kind, "reason": reason},
        },
    )


def image_events(check: ArtifactCheck, params: Mapping[str, Any]) -> Out:
    """``cursor/generate_image``: the generated file and every reference image."""
    tool_call_id = params.get("toolCallId")
    tcid = tool_call_id if isinstance(tool_call_id, str) else None
    description = params.get("description")
    desc = description if isinstance(description, str) else None
    out = referenced(
        check, params.get("filePath"), "generated_image", tool_call_id=tcid, description=desc
    )
    references = params.get("referenceImagePaths")
    for path in references if isinstance(references, list) else []:
        out += referenced(check, path, "reference_image", tool_call_id=tcid)
    return out
