"""A line over the bound, described from its first bytes only.

The reader never holds an oversize line: it keeps the first :data:`PREFIX_BYTES` and
counts the rest while discarding it up to the next newline. What the line was is read
from that prefix by a small scanner that follows the JSON structure (string escapes,
nesting) without parsing the whole: the top-level ``method`` and ``id``, whether it is a
response (``result``/``error``), and for a ``session/update`` its ``sessionId`` and the
scalar fields of ``update`` (``sessionUpdate``, ``toolCallId``, ``status``, ``title``),
plus the text of a tool's content blocks (or of its terminal ``_meta`` output) as far as
the prefix reaches (a preview), and its ``rawOutput`` (Cursor's shell puts its
``stdout`` there) rendered as far as the prefix reaches, as the normalizer renders a whole
one (``json.dumps``, ``ensure_ascii=False``), so the preview is the start of the output
the tool event would have shown. A field that comes after the cut is simply not known.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from worker.rpc.wire import JsonValue

#: How much of an oversize line is kept to describe it (the normalizer's text bound).
PREFIX_BYTES = 16 * 1024

Kind = Literal["request", "notification", "response", "unknown"]
_Path = tuple[str | None, ...]  # object keys; None for an array element

_UPDATE = ("params", "update")
_WANTED: frozenset[_Path] = frozenset(
    {
        ("id",),
        ("method",),
        ("params", "sessionId"),
        (*_UPDATE, "sessionUpdate"),
        (*_UPDATE, "toolCallId"),
        (*_UPDATE, "status"),
        (*_UPDATE, "title"),
    }
)
#: A tool's raw output: its output when it has no text content (``rawOutput`` as JSON).
_RAW: _Path = (*_UPDATE, "rawOutput")
#: Where a tool's output text is: its ``content`` blocks (``[{type: content, content:
#: {type: text, text}}]``) and the command output chunk of its terminal ``_meta``
#: (``terminal_output_delta`` / ``terminal_output`` ``{data}``, as
#: ``worker.events.content.terminal_meta`` reads them).
_TEXTS: frozenset[_Path] = frozenset(
    {
        (*_UPDATE, "content", None, "content", "text"),
        (*_UPDATE, "_meta", "terminal_output_delta", "data"),
        (*_UPDATE, "_meta", "terminal_output", "data"),
    }
)

_SPACE = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_PARTIAL = re.compile(r'[^"\\]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\]*)*')
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")
_UPDATE_KEYS = {"sessionUpdate", "toolCallId", "status", "title"}
_SEPARATORS = {",": ", ", ":": ": "}


@dataclass(frozen=True, slots=True)
class OversizeLine:
    """One line over the bound, skipped: its size and what its prefix tells.

    ``complete`` is False when the stream ended before the line's newline (``size`` is
    then what was read). ``update`` holds the scalar fields of a ``session/update``'s
    ``update`` read from the prefix; ``output_preview`` the text of its tool content
    blocks as far as the prefix reaches (cut: the rest of the line is gone);
    ``raw_output_preview`` the start of its ``rawOutput`` as JSON text, as far as the
    prefix reaches.
    """

    size: int
    limit: int
    complete: bool
    kind: Kind = "unknown"
    method: str | None = None
    id: JsonValue = None
    session_id: str | None = None
    update: dict[str, JsonValue] = field(default_factory=dict)
    output_preview: str | None = None
    raw_output_preview: str | None = None


def describe(prefix: bytes, *, size: int, limit: int, complete: bool) -> OversizeLine:
    """The :class:`OversizeLine` for a line of ``size`` bytes that began with ``prefix``."""
    # A code point cut at the end of the prefix is held back, not replaced.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(prefix, final=False)
    scanner = _scan(text)
    values, texts, top = scanner.values, scanner.texts, scanner.top
    method = values.get(("method",))
    has_id = ("id",) in values
    kind: Kind = "unknown"
    if "result" in top or "error" in top:
        kind = "response"
    elif isinstance(method, str):
        kind = "request" if has_id else "notification"
    session_id = values.get(("params", "sessionId"))
    return OversizeLine(
        size=size,
        limit=limit,
        complete=complete,
        kind=kind,
        method=method if isinstance(method, str) else None,
        id=values.get(("id",)),
        session_id=session_id if isinstance(session_id, str) else None,
        update={
            str(path[-1]): value
            for path, value in values.items()
            if path[:-1] == _UPDATE and path[-1] in _UPDATE_KEYS
        },
        output_preview="\n".join(texts) if texts else None,
        raw_output_preview="".join(scanner.raw) if scanner.raw else None,
    )


def _scan(text: str) -> _Scanner:
    """Walk the JSON ``text`` (cut anywhere): the wanted scalars by path, the tool
    content texts (the last one possibly cut), the ``rawOutput`` rendered, the top-level
    keys seen. Stops at the cut or at the first thing that is not JSON."""
    scanner = _Scanner(text)
    while scanner.step():
        pass
    return scanner


class _Scanner:
    """One token per :meth:`step`, tracking the path of object keys to the cursor.

    ``raw`` collects the tokens of the ``rawOutput`` value rendered as ``json.dumps``
    (``ensure_ascii=False``, its default separators) would render them: from the token
    that starts the value to the one that ends it, or to the cut.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.values: dict[_Path, JsonValue] = {}
        self.texts: list[str] = []
        self.top: list[str] = []
        self._frames: list[list[str | None]] = []  # ["o", key] an object, ["a", None] an array
        self._expect_key = False
        self._i = 0
        self.raw: list[str] = []
        self._value = False  # the next token is an object's value (it follows a ":")
        self._raw_level: int | None = None  # depth of the rawOutput value while it is read

    def step(self) -> bool:
        """Read one token; False at the cut or at what is not JSON."""
        text, frames = self.text, self._frames
        i = self._i = _skip_space(text, self._i)
        if i >= len(text):
            return False
        c = text[i]
        if self._value and self._raw_level is None and not self.raw and _path(frames) == _RAW:
            self._raw_level = len(frames)
        self._value = c == ":"
        if c == '"':
            return self._string()
        if c in "{[":
            frames.append(["o" if c == "{" else "a", None])
            self._expect_key = c == "{"
        elif c in "}]":
            if not frames:
                return False
            frames.pop()
            self._expect_key = False
        elif c in ",:":
            self._expect_key = c == "," and bool(frames) and frames[-1][0] == "o"
        else:
            return self._scalar()
        self._render(_SEPARATORS.get(c, c))
        self._i = i + 1
        return True

    def _rendered(self, value: str, *, closed: bool) -> str:
        """A string token as ``json.dumps`` renders it (without its closing quote when
        the cut falls inside it); a ``rawOutput`` that is a string is shown as it is."""
        if self._raw_level == len(self._frames):
            return value
        literal = json.dumps(value, ensure_ascii=False)
        return literal if closed else literal[:-1]

    def _render(self, token: str) -> None:
        """Add ``token`` to ``raw`` while the ``rawOutput`` value is being read; that
        value ends when the depth it started at is back."""
        if self._raw_level is None:
            return
        self.raw.append(token)
        if len(self._frames) == self._raw_level:
            self._raw_level = None

    def _string(self) -> bool:
        match = _STRING.match(self.text, self._i)
        path = _path(self._frames)
        if match is None:  # the cut falls inside this string
            partial = _partial(self.text[self._i + 1 :])
            if not self._expect_key and path in _TEXTS:
                self.texts.extend(partial)
            for piece in partial:
                self._render(self._rendered(piece, closed=False))
            return False
        value = _decoded(match.group())
        if value is None:
            return False
        self._i = match.end()
        self._render(self._rendered(value, closed=True))
        frames = self._frames
        if self._expect_key and frames and frames[-1][0] == "o":
            frames[-1][1] = value
            self._expect_key = False
            if len(frames) == 1:
                self.top.append(value)
        else:
            self._record(path, value)
        return True

    def _scalar(self) -> bool:
        match = _SCALAR.match(self.text, self._i)
        if match is None or match.end() == len(self.text):  # not JSON, or the cut may end it
            return False
        value = json.loads(match.group())
        self._record(_path(self._frames), value)
        self._render(json.dumps(value))
        self._i = match.end()
        return True

    def _record(self, path: _Path, value: JsonValue) -> None:
        if path in _WANTED:
            self.values.setdefault(path, value)
        elif path in _TEXTS and isinstance(value, str):
            self.texts.append(value)


def _skip_space(text: str, i: int) -> int:
    match = _SPACE.match(text, i)
    return i if match is None else match.end()


def _path(frames: list[list[str | None]]) -> _Path:
    return tuple(key if kind == "o" else None for kind, key in frames)


def _decoded(literal: str) -> str | None:
    try:
        value = json.loads(literal, strict=False)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _partial(body: str) -> list[str]:
    """The decodable start of a string the cut ends (no half escape)."""
    match = _PARTIAL.match(body)
    value = _decoded('"' + (match.group() if match else "") + '"')
    return [] if value is None else [value]


class LineSplitter:
    """The agent's bytes → its lines (stripped, empty ones dropped) and, for each line
    over ``limit``, an :class:`OversizeLine`. Memory stays bounded by ``limit`` plus one
    chunk: an oversize line is described from its prefix and discarded as it streams.

    A chunk is split at its newlines in one call; the start of a line that spans chunks
    is kept as a list of pieces, joined once its newline comes (no copy per chunk).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending: list[bytes] = []  # the start of the current line, in pieces
        self._pending_size = 0
        self._prefix: bytearray | None = None  # set while skipping an oversize line
        self._skipped = 0

    @property
    def held(self) -> int:
        """Bytes held now: a partial line, or the prefix of a line being skipped."""
        return self._pending_size + (0 if self._prefix is None else len(self._prefix))

    def feed(self, chunk: bytes) -> list[bytes | OversizeLine]:
        """The lines ``chunk`` completes, in order."""
        out: list[bytes | OversizeLine] = []
        if self._prefix is not None:
            end = chunk.find(b"\n")
            self._skip(chunk if end == -1 else chunk[:end])
            if end == -1:
                return out
            out.append(self._skipped_line(complete=True))
            chunk = chunk[end + 1 :]
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if lines and self._pending:
            lines[0] = b"".join((*self._pending, lines[0]))
            self._pending, self._pending_size = [], 0
        limit = self._limit
        for line in lines:
            if len(line) > limit:
                out.append(self._oversize(line[:PREFIX_BYTES], len(line)))
            elif stripped := line.strip():
                out.append(stripped)
        if rest:
            self._pending.append(rest)
            self._pending_size += len(rest)
            if self._pending_size > limit:  # no newline yet: skip it as it streams
                start = b"".join(self._pending)
                self._pending, self._pending_size = [], 0
                self._prefix = bytearray()
                self._skip(start)
        return out

    def end(self) -> OversizeLine | None:
        """At the end of the stream: the oversize line it cut, if one was being skipped
        (a short last line without its newline is dropped, as before)."""
        return None if self._prefix is None else self._skipped_line(complete=False)

    def _skip(self, data: bytes) -> None:
        assert self._prefix is not None
        room = PREFIX_BYTES - len(self._prefix)
        if room > 0:
            self._prefix += data[:room]
        self._skipped += len(data)

    def _skipped_line(self, *, complete: bool) -> OversizeLine:
        assert self._prefix is not None
        line = self._oversize(self._prefix, self._skipped, complete=complete)
        self._prefix, self._skipped = None, 0
        return line

    def _oversize(
        self, prefix: bytes | bytearray, size: int, *, complete: bool = True
    ) -> OversizeLine:
        return describe(bytes(prefix).lstrip(), size=size, limit=self._limit, complete=complete)
