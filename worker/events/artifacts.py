"""Files the agent points at (generated images, tool resources) → ``artifact.referenced``.

The containment check itself is I/O and lives at the sandbox's seam
(:class:`worker.sandbox.files.WorkspaceFiles`); this module only maps a verdict to events.
A path is never read or uploaded: the event says ``registered: false``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from worker.events import notices
from worker.events.bounded import bounded
from worker.events.models import ArtifactReferenced, EventData

Out = list[EventData]
Kind = Literal["generated_image", "reference_image", "tool_resource"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A checked path: ``relative`` and ``size`` when admitted, else ``reason``."""

    relative: str | None = None
    size: int = 0
    reason: str | None = None


ArtifactCheck = Callable[[str], Verdict]


def refuse_all(path: str) -> Verdict:
    """The check used when the sandbox gives no files (``Sandbox.workspace_files``)."""
    return Verdict(reason="workspace_not_reachable")


def referenced(
    check: ArtifactCheck,
    path: object,
    kind: Kind,
    *,
    tool_call_id: str | None,
    description: str | None = None,
) -> Out:
    """One ``artifact.referenced`` event, or a ``notice`` saying why the path was refused."""
    if not isinstance(path, str) or not path:
        return []
    verdict = check(path)
    if verdict.relative is None:
        return [notices.artifact_refused(path, kind, verdict.reason or "refused")]
    event = ArtifactReferenced(
        path=verdict.relative,
        kind=kind,
        registered=False,
        bytes=verdict.size,
        tool_call_id=tool_call_id,
    )
    if description is not None:  # absent, not null, when the agent gave none
        event.description = bounded(description, 2048)["text"]
    return [event]


def image_events(check: ArtifactCheck, params: Mapping[str, object]) -> Out:
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


def named_paths(method: str, params: object) -> list[str]:
    """The paths in a notification that the normalizer will check as artifacts: the
    ``resource_link`` blocks of a tool's content (``session/update``) and the files of
    ``cursor/generate_image``. A backend whose check answers from lookups (Daytona's
    file API) looks them up first, so that a file written just before it is named is
    judged on what is there, not refused for not having been looked up yet."""
    if not isinstance(params, Mapping):
        return []
    if method == "cursor/generate_image":
        references = params.get("referenceImagePaths")
        named = [params.get("filePath"), *(references if isinstance(references, list) else [])]
        return [p for p in named if isinstance(p, str) and p]
    update = params.get("update") if method == "session/update" else None
    if not isinstance(update, Mapping):
        return []
    content = update.get("content")
    paths = []
    for block in content if isinstance(content, list) else []:
        inner = block.get("content") if isinstance(block, Mapping) else None
        if not isinstance(inner, Mapping) or inner.get("type") != "resource_link":
            continue
        uri = inner.get("uri")
        if not isinstance(uri, str):
            continue
        paths.append(uri.removeprefix("file://"))
    return [p for p in paths if p]
