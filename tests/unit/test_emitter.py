"""The emitter's invariants: contiguous seq, redaction, size cap, one terminal event."""

from __future__ import annotations

import json

import pytest

from worker.credentials.redact import MASK, Redactor
from worker.events.emitter import EventEmitter
from worker.events.sinks import MemorySink


def _emitter(
    sink: MemorySink, redactor: Redactor | None = None, max_bytes: int = 4096
) -> EventEmitter:
    return EventEmitter(
        job_id="j1", attempt=2, sinks=[sink], redactor=redactor, max_bytes=max_bytes
    )


async def test_seq_is_contiguous_from_one() -> None:
    sink = MemorySink()
    emitter = _emitter(sink)
    for i in range(5):
        await emitter.emit("notice", {"level": "info", "code": "c", "message": str(i)})
    assert [e["seq"] for e in sink.events] == [1, 2, 3, 4, 5]
    assert {e["attempt"] for e in sink.events} == {2}
    assert all(
        json.loads(line) == event for line, event in zip(sink.lines, sink.events, strict=True)
    )


async def test_secret_is_scrubbed_raw_and_json_escaped() -> None:
    sink = MemorySink()
    redactor = Redactor()
    secret = 'tok"en\\with-quote'
    redactor.register(secret)
    emitter = _emitter(sink, redactor)
    await emitter.emit("notice", {"level": "info", "code": "c", "message": f"key={secret}"})
    assert secret not in sink.events[0]["data"]["message"]
    assert MASK in sink.events[0]["data"]["message"]
    assert json.dumps(secret)[1:-1] not in sink.lines[0]


async def test_oversize_event_becomes_a_notice_not_a_cut() -> None:
    sink = MemorySink()
    emitter = _emitter(sink, max_bytes=1024)
    await emitter.emit("message.delta", {"role": "assistant", "text": "x" * 5000})
    event = sink.events[0]
    assert event["type"] == "notice"
    assert event["seq"] == 1
    assert event["data"]["code"] == "event_too_large"
    assert event["data"]["details"]["type"] == "message.delta"


async def test_nothing_after_job_completed() -> None:
    sink = MemorySink()
    emitter = _emitter(sink)
    await emitter.emit("job.completed", {"status": "succeeded"})
    with pytest.raises(RuntimeError):
        await emitter.emit("notice", {"level": "info", "code": "c", "message": "late"})
    assert len(sink.events) == 1


def test_short_values_are_not_registered() -> None:
    redactor = Redactor()
    redactor.register("ab")
    assert redactor.scrub("about") == "about"
