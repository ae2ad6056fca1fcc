"""The emitter's invariants: contiguous seq, redaction, size cap, one terminal event."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from worker.credentials.redact import MASK, Redactor
from worker.errors import LeaseLost, SinkUnavailable
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter, utc_timestamp
from worker.events.models import JobCompleted, MessageDelta, Notice, ToolUpdated
from worker.events.sinks import MemorySink


def _emitter(
    sink: MemorySink, redactor: Redactor | None = None, max_bytes: int = 4096
) -> EventEmitter:
    return EventEmitter(
        job_id="j1", attempt=2, sinks=[sink], redactor=redactor, max_bytes=max_bytes
    )


def _completed(status: Any) -> JobCompleted:
    return job_completed(status=status, error=None, duration_ms=1.0)


async def test_seq_is_contiguous_from_one() -> None:
    sink = MemorySink()
    emitter = _emitter(sink)
    for i in range(5):
        await emitter.emit(Notice(level="info", code="c", message=str(i)))
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
    await emitter.emit(Notice(level="info", code="c", message=f"key={secret}"))
    assert secret not in sink.events[0]["data"]["message"]
    assert MASK in sink.events[0]["data"]["message"]
    assert json.dumps(secret)[1:-1] not in sink.lines[0]


async def test_oversize_event_becomes_a_notice_not_a_cut() -> None:
    sink = MemorySink()
    emitter = _emitter(sink, max_bytes=1024)
    await emitter.emit(MessageDelta(role="assistant", text="x" * 5000))
    event = sink.events[0]
    assert event["type"] == "notice"
    assert event["seq"] == 1
    assert event["data"]["code"] == "event_too_large"
    assert event["data"]["details"]["type"] == "message.delta"


async def test_nothing_after_job_completed() -> None:
    sink = MemorySink()
    emitter = _emitter(sink)
    await emitter.emit(_completed("succeeded"))
    with pytest.raises(RuntimeError):
        await emitter.emit(Notice(level="info", code="c", message="late"))
    assert len(sink.events) == 1


def test_short_values_are_not_registered() -> None:
    redactor = Redactor()
    redactor.register("ab")
    assert redactor.scrub("about") == "about"


class _BrokenPipeSink(MemorySink):
    """Takes ``ok`` events, then fails like stdout whose reader went away."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok
        self.calls = 0

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        self.calls += 1
        if self.calls > self.ok:
            raise BrokenPipeError(32, "Broken pipe")
        await super().write(event, line)


class _FencedOut(MemorySink):
    async def write(self, event: Mapping[str, Any], line: str) -> None:
        raise LeaseLost("the job's lease belongs to another owner", job_id="j1")


async def _notice(emitter: EventEmitter, text: str) -> None:
    await emitter.emit(Notice(level="info", code="c", message=text))


async def test_a_failing_sink_does_not_take_the_others_down() -> None:
    before, broken, after = MemorySink(), _BrokenPipeSink(ok=1), MemorySink()
    emitter = EventEmitter(job_id="j1", attempt=1, sinks=[before, broken, after])
    await _notice(emitter, "1")
    with pytest.raises(SinkUnavailable) as info:  # raised once, typed, to whoever emitted
        await _notice(emitter, "2")
    assert isinstance(info.value.__cause__, BrokenPipeError)
    await _notice(emitter, "3")  # not raised again: the failed sink is out of the fan-out
    await emitter.emit(_completed("failed"))
    for sink in (before, after):
        assert [e["seq"] for e in sink.events] == [1, 2, 3, 4]
    assert broken.calls == 2
    with pytest.raises(SinkUnavailable):  # and reported again when the sinks are closed
        await emitter.close()
    assert emitter.failure is info.value


async def test_a_sink_failing_on_job_completed_does_not_unwind_the_settling() -> None:
    good, broken = MemorySink(), _BrokenPipeSink(ok=0)
    emitter = EventEmitter(job_id="j1", attempt=1, sinks=[broken, good])
    event = await emitter.emit(_completed("succeeded"))
    assert emitter.completed is event
    assert [e["type"] for e in good.events] == ["job.completed"]
    with pytest.raises(SinkUnavailable):
        await emitter.close()


async def test_a_sink_failure_that_unwound_the_job_is_settled_at_close() -> None:
    good = MemorySink()
    emitter = EventEmitter(job_id="j1", attempt=3, sinks=[good, _FencedOut()])
    with pytest.raises(LeaseLost):  # a sink's own typed error passes through as it is
        await _notice(emitter, "1")
    with pytest.raises(LeaseLost):  # nobody settled the job: close() does, then reports
        await emitter.close()
    assert [(e["seq"], e["type"]) for e in good.events] == [(1, "notice"), (2, "job.completed")]
    done = good.events[-1]["data"]
    assert (done["status"], done["error"]["code"]) == ("failed", "lease_lost")
    assert done["duration_ms"] >= 0


async def test_a_lone_surrogate_from_an_agent_becomes_a_replacement_character() -> None:
    # JSON lets an agent write "\ud800"; decoded, it is a str no UTF-8 can carry.
    text = json.loads('"ok \\ud800 and \\udfff, \\ud83d\\ude00 kept"')
    sink = MemorySink()
    emitter = EventEmitter(job_id="j", attempt=1, sinks=[sink])
    sent = await emitter.emit(MessageDelta(role="assistant", text=text))
    assert sent["data"]["text"] == "ok \ufffd and \ufffd, \U0001f600 kept"
    assert sink.lines[-1].encode("utf-8")  # every sink gets a line that encodes
    assert json.loads(sink.lines[-1])["data"]["text"] == sent["data"]["text"]


async def test_the_type_comes_from_the_model_and_only_the_fields_set_go_out() -> None:
    sink = MemorySink()
    await _emitter(sink).emit(ToolUpdated(tool_call_id="t", status=None))
    [event] = sink.events
    assert event["type"] == "tool.updated"
    # `status` was set to None: sent as null; title, diffs, locations… were not: absent.
    assert event["data"] == {"tool_call_id": "t", "status": None}


@pytest.mark.parametrize(
    ("job_id", "data"),
    [
        ("j1", {"level": "info", "code": "c", "message": "plain"}),
        ('j"\\ü', {"level": "info", "code": "c", "message": 'ü \u2028 " \\ \n \t \x01'}),
        ("j", {"level": "warning", "code": "c", "message": "", "details": {"f": 0.1, "i": 3}}),
        ("j", {"level": "error", "code": "c", "message": "m", "details": {"big": 10**30}}),
        ("j", {"level": "info", "code": "c", "message": "m", "details": {"l": [1e16, None]}}),
    ],
)
async def test_the_line_is_what_json_dumps_gives_for_the_event(
    job_id: str, data: dict[str, Any]
) -> None:
    sink = MemorySink()
    emitter = EventEmitter(job_id=job_id, attempt=7, sinks=[sink])
    await emitter.emit(Notice(**data))
    [event], [line] = sink.events, sink.lines
    assert line == json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    assert list(event) == ["v", "job_id", "attempt", "seq", "ts", "type", "data"]


@pytest.mark.parametrize(
    "now",
    [0.0, 1764590000.0, 1764590000.1234, 1764590000.9994, 1764590000.9995, 1764590000.9999996,
     1764590059.9999999, 1767225599.9995, 951782399.5, 4102444800.0005, 1e9 + 0.0005],
)  # fmt: skip
def test_timestamps_are_what_datetime_prints(now: float) -> None:
    moment = datetime.fromtimestamp(now, tz=UTC)
    assert utc_timestamp(now) == moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_timestamps_match_datetime_on_random_instants() -> None:
    rng = random.Random(12)
    for _ in range(20000):
        now = rng.uniform(0, 4e9)
        expected = datetime.fromtimestamp(now, tz=UTC).isoformat(timespec="milliseconds")
        assert utc_timestamp(now) == expected.replace("+00:00", "Z"), now
