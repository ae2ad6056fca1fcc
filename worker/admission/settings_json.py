"""Strict decoding of a JSON settings document (fail closed on anything odd)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def parse_settings(data: bytes) -> dict[str, object]:
    """Decode one UTF-8 JSON object; ValueError for anything else.

    Duplicate keys are refused: parsers disagree on which one wins, and the checker must
    see what the agent sees.
    """
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError(f"top level is a JSON {type(value).__name__}, not an object")
    return value


def declared(settings: Mapping[str, object], keys: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(key, rule)`` for each watched key whose value configures something (is truthy)."""
    return [(key, rule) for key, rule in keys.items() if settings.get(key)]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out
