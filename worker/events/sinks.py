"""Where canonical events go: the ``EventSink`` seam and its implementations.

A sink receives each event already serialized (one JSON line, redacted) together with
its dict form. ``JsonlSink`` writes lines to a file or stdout, ``MemorySink`` keeps them
for tests. The job's Redis Stream is written only through the lease:
:class:`worker.store.fenced.FencedStreamSink` (service jobs and ``acp-worker run --redis``
alike), so every stream keeps one contiguous ``seq`` per attempt and one ``job.completed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Protocol


class EventSink(Protocol):
    async def write(self, event: Mapping[str, object], line: str) -> None:
        """Accept one event; may buffer. Order of calls is the order of events.

        A sink that raises gets nothing more from the emitter (the other sinks do); the
        failure fails the job (``worker.events.emitter``).
        """
        ...

    async def close(self) -> None:
        """Flush everything accepted so far.

        Raises:
            SinkUnavailable: buffered events could not be delivered.
        """
        ...


class MemorySink:
    """Keeps events in a list (test double and in-process consumers)."""

    def __init__(self) -> None:
        self.events: list[Mapping[str, object]] = []
        self.lines: list[str] = []

    async def write(self, event: Mapping[str, object], line: str) -> None:
        self.events.append(event)
        self.lines.append(line)

    async def close(self) -> None:
        return None


class JsonlSink:
    """One JSON object per line to a text stream (stdout with ``--json``, or a file)."""

    def __init__(self, stream: IO[str], *, flush_each: bool = True) -> None:
        self._stream = stream
        self._flush_each = flush_each

    async def write(self, event: Mapping[str, object], line: str) -> None:
        self._stream.write(line + "\n")
        if self._flush_each:
            self._stream.flush()

    async def close(self) -> None:
        self._stream.flush()
