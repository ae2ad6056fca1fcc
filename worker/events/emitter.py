"""Turns (type, data) into canonical events: numbering, time, redaction, size cap.

The emitter owns the invariants every consumer relies on: ``seq`` starts at 1 and has no
gaps within an attempt; every event is redacted before it leaves; an event over the size
cap is replaced by a ``notice`` saying so (never silently truncated); exactly one
``job.completed`` closes the stream.

Fan-out isolates the sinks: a sink whose ``write`` raises gets nothing more, while every
other sink keeps receiving every event (stdout still sees the job settle when Redis is
gone). The failure is raised once, from the ``emit`` that met it, so that whoever emitted
(an ACP handler, a job phase) fails the job with a typed error; ``close`` raises it again.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from worker.credentials.redact import Redactor
from worker.errors import SinkUnavailable, WorkerError
from worker.events.models import EVENT_VERSION, TERMINAL_TYPE
from worker.events.sinks import EventSink

_SURROGATE = re.compile("[\ud800-\udfff]")


def utc_timestamp(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventEmitter:
    """Numbers, redacts, bounds and fans out the events of one job attempt."""

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        sinks: Sequence[EventSink],
        redactor: Redactor | None = None,
        max_bytes: int = 196 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self._sinks = list(sinks)
        self._live = list(sinks)  # the sinks that have not failed
        self._failures: list[WorkerError] = []
        self._redactor = redactor or Redactor()
        self._max_bytes = max_bytes
        self._clock = clock
        self._started = clock()
        self._seq = 0
        self.completed: Mapping[str, Any] | None = None

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    @property
    def failure(self) -> WorkerError | None:
        """The first sink failure, if a sink failed."""
        return self._failures[0] if self._failures else None

    async def emit(self, type_: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Emit one event and return it as sent (after redaction).

        Raises:
            RuntimeError: an event after ``job.completed`` (a bug, not an input error).
            WorkerError: a sink failed on this event (``SinkUnavailable``, or the sink's
                own error such as ``LeaseLost``). The other sinks got the event; the failed
                one gets nothing more. Never raised for ``job.completed``: ``close`` does.
        """
        if self.completed is not None:
            raise RuntimeError(f"event {type_!r} after job.completed")
        event, line = self._serialize(type_, data, self._seq + 1)
        try:
            size = len(line.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate (what JSON's "\ud800" decodes to, from an agent): no UTF-8
            # can carry it, and every sink would fail on it. Each becomes U+FFFD.
            line = _SURROGATE.sub("\ufffd", line)
            event = json.loads(line)
            size = len(line.encode("utf-8"))
        if size > self._max_bytes:
            notice = self._oversize_notice(type_, line)
            event, line = self._serialize("notice", notice, self._seq + 1)
        self._seq += 1
        if self._redactor:
            event = json.loads(line)  # the dict form must be as scrubbed as the line
        failure = await self._fan_out(event, line)
        if event["type"] == TERMINAL_TYPE:
            self.completed = event
        elif failure is not None:
            raise failure
        return event

    async def _fan_out(self, event: Mapping[str, Any], line: str) -> WorkerError | None:
        """Write to every live sink; a failing one is dropped and its error returned."""
        failure = None
        for sink in tuple(self._live):
            try:
                await sink.write(event, line)
            except Exception as exc:  # any sink, any failure: the others must go on
                error = _sink_error(sink, exc)
                self._live.remove(sink)
                self._failures.append(error)
                failure = failure or error
        return failure

    def _serialize(
        self, type_: str, data: Mapping[str, Any], seq: int
    ) -> tuple[dict[str, Any], str]:
        event = {
            "v": EVENT_VERSION,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "seq": seq,
            "ts": utc_timestamp(self._clock()),
            "type": type_,
            "data": data,
        }
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        return event, (self._redactor.scrub(line) if self._redactor else line)

    def _oversize_notice(self, type_: str, line: str) -> dict[str, Any]:
        size = len(line.encode("utf-8"))
        return {
            "level": "warning",
            "code": "event_too_large",
            "message": f"a {type_} event of {size} bytes exceeded the {self._max_bytes}-byte "
            "cap and was not sent",
            "details": {"type": type_, "bytes": size, "limit": self._max_bytes},
        }

    async def close(self) -> None:
        """Flush every sink; the first failure is raised after all were tried.

        A sink failure that unwound the job before it settled (``emit`` raised it where
        nothing could settle the job) is settled here: the sinks still working get one
        ``job.completed`` ``failed`` with that error, so their stream is closed all the same.
        """
        if self.completed is None and self._failures:
            await self._settle_failed(self._failures[0])
        errors: list[BaseException] = list(self._failures)
        for sink in self._sinks:
            try:
                await sink.close()
            except Exception as exc:  # collected; the first is re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]

    async def _settle_failed(self, error: WorkerError) -> None:
        duration_ms = round((self._clock() - self._started) * 1000, 2)
        await self.emit(
            TERMINAL_TYPE,
            {
                "status": "failed",
                "stop_reason": None,
                "error": error.to_dict(),
                "duration_ms": duration_ms,
            },
        )


def _sink_error(sink: EventSink, exc: Exception) -> WorkerError:
    """The typed form of a sink's failure (a sink may raise an OS error: stdout closed)."""
    if isinstance(exc, WorkerError):
        return exc
    name = type(sink).__name__
    error = SinkUnavailable(f"the {name} event sink failed: {exc}", sink=name)
    error.__cause__ = exc
    return error
