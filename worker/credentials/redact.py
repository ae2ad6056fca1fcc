"""Scrubbing bound secret values out of everything the worker writes.

Every secret the worker resolves for a job is registered here; events, log lines, error
messages and diagnostic previews pass through :meth:`Redactor.scrub` before they leave
the process. Values are matched raw and in their JSON-escaped form, because events are
redacted after serialization.
"""

from __future__ import annotations

import json

MASK = "[REDACTED]"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary text and leak their length anyway


class Redactor:
    """Replaces registered secret values with ``[REDACTED]``."""

    __slots__ = ("_needles",)

    def __init__(self) -> None:
        self._needles: list[str] = []

    def register(self, secret: str) -> None:
        if len(secret) < _MIN_SECRET_LEN:
            return
        escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
        ascii_escaped = json.dumps(secret)[1:-1]
        for needle in {secret, escaped, ascii_escaped}:
            if needle not in self._needles:
                self._needles.append(needle)
        self._needles.sort(key=len, reverse=True)  # longest first: no partial leftovers

    def __bool__(self) -> bool:
        return bool(self._needles)

    def scrub(self, text: str) -> str:
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text
