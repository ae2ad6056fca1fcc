"""A tool's non-text content (images, audio, resources, resource links) → ``ToolContent``.

Nothing vanishes: a block is kept in the tool event, its data inline while the update's
inline budget (the text bound) lasts, above it by reference only (type, size, sha256);
what no field holds (an unknown block type, data that is not base64, a key of its own,
blocks past :data:`MAX_CONTENT_REFS`) is returned as ``leftovers`` for a partial
``provider.unmapped``. Text and diff blocks are mapped elsewhere (``output``, ``diffs``);
a ``terminal`` block names the tool's own terminal, whose output the worker reports.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.events.bounded import bound, bounded
from worker.events.models import ToolContent

#: Content blocks kept per update; more go to ``provider.unmapped``.
MAX_CONTENT_REFS = 64
_FIELD_LIMIT = 1024
#: Entries of ``content`` mapped by other fields of the tool event.
_MAPPED_ENTRIES = frozenset({"diff", "terminal"})
_KNOWN: dict[str, frozenset[str]] = {
    "image": frozenset({"type", "data", "mimeType", "uri"}),
    "audio": frozenset({"type", "data", "mimeType"}),
    "resource_link": frozenset({"type", "uri", "name", "mimeType", "size", "title", "description"}),
    "resource": frozenset({"type", "resource"}),
}
_RESOURCE_KNOWN = frozenset({"uri", "mimeType", "text", "blob"})


class _Unrepresentable(ValueError):
    """A block whose shape no ``ToolContent`` holds."""


@dataclass(slots=True)
class Media:
    """The content blocks of one update: kept, and what was left over."""

    budget: int
    kept: list[ToolContent] = field(default_factory=list)
    leftovers: list[dict[str, object]] = field(default_factory=list)


def tool_media(content: object, limit: int, *, media_only: bool = False) -> Media:
    """The non-text blocks of a tool's ``content`` list, with ``limit`` bytes of inline
    data and text for the whole update. ``media_only``: the event has no field for text
    and diff blocks either (``tool.started``), so they are left over too."""
    media = Media(budget=limit)
    for index, entry in enumerate(content if isinstance(content, list) else []):
        kind = entry.get("type") if isinstance(entry, Mapping) else None
        inner = entry.get("content") if isinstance(entry, Mapping) else None
        if kind in _MAPPED_ENTRIES and not media_only:
            continue
        if kind != "content" or not isinstance(inner, Mapping):
            media.leftovers.append({"index": index, "entry": entry})
        elif inner.get("type") != "text":
            _add(media, index, inner)
        elif media_only:
            media.leftovers.append({"index": index, "entry": entry})
    return media


def _add(media: Media, index: int, inner: Mapping[str, object]) -> None:
    kind = inner.get("type")
    known = _KNOWN.get(kind) if isinstance(kind, str) else None
    if known is None or len(media.kept) >= MAX_CONTENT_REFS:
        media.leftovers.append({"index": index, "content": dict(inner)})
        return
    try:
        kept = _block(media, str(kind), inner)
    except _Unrepresentable:
        media.leftovers.append({"index": index, "content": dict(inner)})
        return
    media.kept.append(kept)
    extra = {k: v for k, v in inner.items() if k not in known}
    resource = inner.get("resource")
    if isinstance(resource, Mapping) and any(k not in _RESOURCE_KNOWN for k in resource):
        extra["resource"] = {k: v for k, v in resource.items() if k not in _RESOURCE_KNOWN}
    if kind == "resource_link" and "size" in inner and kept.bytes is None:
        extra["size"] = inner["size"]  # not a size: kept as sent
    if extra:
        media.leftovers.append({"index": index, "type": kind, **extra})


def _block(media: Media, kind: str, inner: Mapping[str, object]) -> ToolContent:
    if kind in ("image", "audio"):
        return _data_block(media, kind, inner, inner.get("data"))
    if kind == "resource_link":
        return _link(inner)
    resource = inner.get("resource")
    if not isinstance(resource, Mapping) or not isinstance(resource.get("uri"), str):
        raise _Unrepresentable(kind)
    if isinstance(resource.get("text"), str):
        return _text_resource(media, resource)
    return _data_block(media, kind, resource, resource.get("blob"))


def _data_block(media: Media, kind: str, source: Mapping[str, object], data: object) -> ToolContent:
    """An image, audio or blob resource: decoded to be measured and hashed."""
    if not isinstance(data, str):
        raise _Unrepresentable(kind)
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _Unrepresentable(kind) from None
    inline = len(data) <= media.budget
    if inline:
        media.budget -= len(data)
    return _content(
        type=kind,
        mime_type=_short(source.get("mimeType")),
        uri=_short(source.get("uri")),
        bytes=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        inline=inline,
        data=data if inline else None,
    )


def _text_resource(media: Media, resource: Mapping[str, object]) -> ToolContent:
    text = str(resource["text"])
    raw = text.encode("utf-8", "replace")
    cut = bound(text, media.budget)
    media.budget -= min(len(raw), media.budget)
    return _content(
        type="resource",
        mime_type=_short(resource.get("mimeType")),
        uri=_short(resource["uri"]),
        bytes=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        inline=not cut.truncated,
        text=cut,
    )


def _link(inner: Mapping[str, object]) -> ToolContent:
    if not isinstance(inner.get("uri"), str):
        raise _Unrepresentable("resource_link")
    size = inner.get("size")
    return _content(
        type="resource_link",
        uri=_short(inner["uri"]),
        name=_short(inner.get("name")),
        mime_type=_short(inner.get("mimeType")),
        title=_short(inner.get("title")),
        description=_short(inner.get("description")),
        bytes=size if type(size) is int and size >= 0 else None,
        inline=True,
    )


def _content(**fields: Any) -> ToolContent:
    """The block with only the fields that have a value (absent, not null, otherwise)."""
    return ToolContent(**{k: v for k, v in fields.items() if v is not None})


def _short(value: object) -> str | None:
    return None if value is None else bounded(str(value), _FIELD_LIMIT)["text"]
