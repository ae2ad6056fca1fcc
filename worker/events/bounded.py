"""Bounding untrusted text for events: cut at a UTF-8 byte limit and say so."""

from __future__ import annotations

import json
from typing import Any


def bounded(text: str, limit: int) -> dict[str, Any]:
    """``{"text", "truncated", "bytes"}`` with ``text`` cut to at most ``limit`` bytes."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return {"text": text, "truncated": False, "bytes": len(raw)}
    cut = raw[:limit].decode("utf-8", "ignore")  # never split a code point
    return {"text": cut, "truncated": True, "bytes": len(raw)}


def bounded_json(value: Any, limit: int) -> dict[str, Any]:
    """A JSON value serialized, then bounded like :func:`bounded`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return bounded(text, limit)
