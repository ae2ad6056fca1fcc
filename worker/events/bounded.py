"""Bounding untrusted text for events: cut at a UTF-8 byte limit and say so."""

from __future__ import annotations

import json
from typing import Any

from worker.events.models import Bounded


def bounded(text: str, limit: int) -> dict[str, Any]:
    """``{"text", "truncated", "bytes"}`` with ``text`` cut to at most ``limit`` bytes."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return {"text": text, "truncated": False, "bytes": len(raw)}
    cut = raw[:limit].decode("utf-8", "ignore")  # never split a code point
    return {"text": cut, "truncated": True, "bytes": len(raw)}


def bounded_json(value: object, limit: int) -> dict[str, Any]:
    """A JSON value serialized, then bounded like :func:`bounded`.

    A value nested too deeply to serialize again (the agent's JSON can sit just under
    the parser's depth limit) is replaced by a marker and counted as cut.
    """
    if isinstance(value, str):
        return bounded(value, limit)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except RecursionError:
        return {"text": "<nested too deeply to show>", "truncated": True, "bytes": -1}
    return bounded(text, limit)


def bound(text: str, limit: int) -> Bounded:
    """:func:`bounded` as the event field it fills."""
    return Bounded(**bounded(text, limit))


def bound_json(value: object, limit: int) -> Bounded:
    """:func:`bounded_json` as the event field it fills."""
    return Bounded(**bounded_json(value, limit))
