"""Turns event models into canonical events: numbering, time, redaction, size cap.

The emitter owns the invariants every consumer relies on: ``seq`` starts at 1 and has no
gaps within an attempt; every event is redacted before it leaves; an event over the size
cap is replaced by a ``notice`` saying so (never silently truncated); exactly one
``job.completed`` closes the stream.

Fan-out isolates the sinks: a sink whose ``write`` raises gets nothing more, while every
other sink keeps receiving every event (stdout still sees the job settle when Redis is
gone). The failure is raised once, from the ``emit`` that met it, so that whoever emitted
(an ACP handler, a job phase) fails the job with a typed error; ``close`` raises it again.

This is the hot path of a streaming answer (one event per token chunk): the line is
assembled from a per-attempt head serialized once, and timestamps reuse the formatted
second, so typed events cost no more than the dicts they replaced.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime

from worker.credentials.redact import Redactor
from worker.errors import SinkUnavailable, WorkerError
from worker.events import notices
from worker.events.channels import TextChannels
from worker.events.completed import job_completed
from worker.events.models import EVENT_TYPES, EVENT_VERSION, TERMINAL_TYPE, EventData
from worker.events.sinks import EventSink

_SURROGATE = re.compile("[\ud800-\udfff]")
#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, without rebuilding
#: the encoder on every call.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_TYPE_JSON = {type_: _ENCODE(type_) for type_ in EVENT_TYPES}

#: How a producer hands an event over (:meth:`EventEmitter.emit`, or a test's list).
Emit = Callable[[EventData], Awaitable[object]]


def utc_timestamp(now: float | None = None) -> str:
    """RFC 3339 UTC with milliseconds, exactly as ``datetime.fromtimestamp(now, UTC)``
    would print it (same half-even rounding to microseconds, then truncation)."""
    fraction, whole = math.modf(time.time() if now is None else now)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        micros, whole = micros - 1_000_000, whole + 1
    elif micros < 0:
        micros, whole = micros + 1_000_000, whole - 1
    return f"{_second(int(whole))}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=8)
def _second(whole: int) -> str:
    return datetime.fromtimestamp(whole, tz=UTC).isoformat(timespec="seconds")[:19]


def envelope_head(job_id: str, attempt: int) -> str:
    """The start of every line of one attempt, up to the value of ``seq``."""
    return f'{{"v":{EVENT_VERSION},"job_id":{_ENCODE(job_id)},"attempt":{_ENCODE(attempt)},"seq":'


def event_line(head: str, *, seq: int, ts: str, type_: str, data: Mapping[str, object]) -> str:
    """One event as its JSON line: what ``json.dumps`` of the envelope dict gives (compact,
    non-ASCII kept), assembled from ``head`` (:func:`envelope_head`). ``ts`` comes from
    :func:`utc_timestamp`, which never needs escaping."""
    kind = _TYPE_JSON.get(type_) or _ENCODE(type_)
    return f'{head}{seq},"ts":"{ts}","type":{kind},"data":{_ENCODE(data)}}}'


def serialize(*, job_id: str, attempt: int, seq: int, ts: str, data: EventData) -> str:
    """The line of one event written outside an emitter (the reaper's ``job.completed``
    ``lost``): the same serialization, without the emitter's numbering and redaction."""
    head = envelope_head(job_id, attempt)
    return event_line(head, seq=seq, ts=ts, type_=data.TYPE, data=data.wire())


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
        self._channels = TextChannels(self._redactor)
        self._max_bytes = max_bytes
        self._clock = clock
        self._started = clock()
        self._seq = 0
        self._head = envelope_head(job_id, attempt)
        self.completed: Mapping[str, object] | None = None

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

    async def emit(self, event: EventData, /) -> Mapping[str, object]:
        """Emit one event and return it as sent (after redaction); its class names its type.

        With a secret bound, streamed text is redacted as a stream (:mod:`.channels`): the
        end of a chunk that could start a secret waits for the channel's next chunk, so
        the event may go out shorter, later, or not at all (then ``{}`` is returned).

        Raises:
            RuntimeError: an event after ``job.completed`` (a bug, not an input error).
            WorkerError: a sink failed on this event (``SinkUnavailable``, or the sink's
                own error such as ``LeaseLost``). The other sinks got the event; the failed
                one gets nothing more. Never raised for ``job.completed``: ``close`` does.
        """
        if not self._redactor:  # nothing to hold back: the hot path stays one call
            return await self._emit(event.TYPE, event.wire())
        type_ = event.TYPE
        if type_ == TERMINAL_TYPE:
            # Held text goes out first; a sink failing on it must not stop the settlement.
            with contextlib.suppress(WorkerError):
                await self.flush_text()
        sent: Mapping[str, object] = {}
        for kind, data in self._channels.process(type_, event.wire()):
            sent = await self._emit(kind, data)
        return sent

    async def flush_text(self) -> None:
        """Emit the text every channel holds back (the turn ended; ``job.completed``
        does it itself). See :mod:`worker.events.channels`."""
        for kind, data in self._channels.flush():
            await self._emit(kind, data)

    async def _emit(self, type_: str, data: Mapping[str, object]) -> Mapping[str, object]:
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
            notice = notices.event_too_large(type_, size, self._max_bytes)
            event, line = self._serialize(notice.TYPE, notice.wire(), self._seq + 1)
        self._seq += 1
        if self._redactor:
            event = json.loads(line)  # the dict form must be as scrubbed as the line
        failure = await self._fan_out(event, line)
        if event["type"] == TERMINAL_TYPE:
            self.completed = event
        elif failure is not None:
            raise failure
        return event

    async def _fan_out(self, event: Mapping[str, object], line: str) -> WorkerError | None:
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
        self, type_: str, data: Mapping[str, object], seq: int
    ) -> tuple[dict[str, object], str]:
        ts = utc_timestamp(self._clock())
        event = {
            "v": EVENT_VERSION,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "seq": seq,
            "ts": ts,
            "type": type_,
            "data": data,
        }
        line = event_line(self._head, seq=seq, ts=ts, type_=type_, data=data)
        return event, (self._redactor.scrub(line) if self._redactor else line)

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
        await self.emit(job_completed(status="failed", error=error, duration_ms=duration_ms))


def _sink_error(sink: EventSink, exc: Exception) -> WorkerError:
    """The typed form of a sink's failure (a sink may raise an OS error: stdout closed)."""
    if isinstance(exc, WorkerError):
        return exc
    name = type(sink).__name__
    error = SinkUnavailable(f"the {name} event sink failed: {exc}", sink=name)
    error.__cause__ = exc
    return error
