"""Scrubbing bound secret values out of everything the worker writes.

Every secret the worker resolves for a job is registered here; events, log lines, error
messages and diagnostic previews pass through :meth:`Redactor.scrub` before they leave
the process. Values are matched raw, JSON-escaped (once and twice: a text field holding
the escaped form is escaped again when the event is serialized) and as the base64 of the
whole value (standard and URL-safe alphabets, with or without padding).

Streamed text (an answer in token chunks, a tool's output in pieces) needs more than
matching each piece: :meth:`Redactor.scrub_text` and :meth:`Redactor.holdback` let
``worker.events.channels`` hold back the end of a chunk that could be the start of a
secret until the next chunk of the same channel shows what follows.
"""

from __future__ import annotations

import base64
import json

MASK = "[REDACTED]"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary text and leak their length anyway


def _encodings(secret: str) -> set[str]:
    """The forms of ``secret`` looked for in decoded text."""
    raw = secret.encode("utf-8", "surrogatepass")
    forms = {secret, json.dumps(secret, ensure_ascii=False)[1:-1], json.dumps(secret)[1:-1]}
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        forms |= {text, text.rstrip("=")}
    return forms


def _escaped(text: str) -> set[str]:
    """How ``text`` appears inside a serialized JSON string."""
    return {text, json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text)[1:-1]}


class Redactor:
    """Replaces registered secret values with ``[REDACTED]``."""

    __slots__ = ("_chars", "_needles", "_text_needles")

    def __init__(self) -> None:
        self._needles: list[str] = []  # forms in a serialized line
        self._text_needles: list[str] = []  # forms in decoded text
        self._chars: frozenset[str] = frozenset()  # every character of those

    def register(self, secret: str) -> None:
        if len(secret) < _MIN_SECRET_LEN:
            return
        text_forms = _encodings(secret)
        line_forms = {form for text in text_forms for form in _escaped(text)}
        for needles, forms in ((self._text_needles, text_forms), (self._needles, line_forms)):
            needles.extend(form for form in forms if form not in needles)
            needles.sort(key=len, reverse=True)  # longest first: no partial leftovers
        self._chars = frozenset("".join(self._text_needles))

    def __bool__(self) -> bool:
        return bool(self._needles)

    def scrub(self, text: str) -> str:
        """``text`` (a serialized line, a message) with every form of every secret masked."""
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def scrub_text(self, text: str) -> str:
        """Decoded text (a chunk's ``text``) with every form of every secret masked."""
        for needle in self._text_needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def holdback(self, text: str) -> int:
        """The length of the longest end of ``text`` that is the start of a secret (in any
        form, shorter than the whole): what a stream must hold until it sees what follows.
        """
        if not text or text[-1] not in self._chars:
            return 0  # the usual chunk, ending in a space or a mark no secret has
        best = 0
        size = len(text)
        for needle in self._text_needles:
            # Only ends shorter than the needle; their first character must be the needle's.
            first = needle[0]
            i = text.find(first, max(size - len(needle) + 1, 0))
            while i != -1 and size - i > best:
                if needle.startswith(text[i:]):
                    best = size - i
                    break
                i = text.find(first, i + 1)
        return best
