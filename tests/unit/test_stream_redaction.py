"""Redaction as a stream property: a bound secret split over chunks of one text channel
(an answer, a tool's output) never comes out whole when the chunks are joined, and the
joined text equals what the agent sent with the secret masked (nothing held is lost)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping
from typing import Any

import pytest

from worker.credentials.redact import MASK, Redactor
from worker.events.completed import job_completed
from worker.events.emitter import EventEmitter
from worker.events.models import Bounded, MessageDelta, ToolCompleted, ToolUpdated
from worker.events.progress import ProgressSink
from worker.events.sinks import MemorySink

SECRET = 'sk-live-7Hq2"zX9/pL0+wR4'  # a quote: its JSON-escaped form differs
B64 = base64.b64encode(SECRET.encode()).decode()


def _setup() -> tuple[EventEmitter, MemorySink, Any]:
    redactor = Redactor()
    redactor.register(SECRET)
    sink, stream = MemorySink(), io.StringIO()
    emitter = EventEmitter(
        job_id="j", attempt=1, sinks=[sink, ProgressSink(stream)], redactor=redactor
    )
    return emitter, sink, stream


def _joined(events: list[Mapping[str, Any]], role: str = "assistant") -> str:
    return "".join(
        e["data"]["text"]
        for e in events
        if e["type"] == "message.delta" and e["data"]["role"] == role
    )


def _outputs(events: list[Mapping[str, Any]], tool: str) -> str:
    return "".join(
        e["data"]["output"]["text"]
        for e in events
        if e["type"].startswith("tool.")
        and e["data"].get("tool_call_id") == tool
        and e["data"].get("output")
    )


def _no_leak(sink: MemorySink, stream: Any) -> None:
    everything = "".join(sink.lines) + stream.getvalue()
    for needle in (SECRET, json.dumps(SECRET)[1:-1], B64):
        assert needle not in everything
    for role in ("assistant", "thought"):
        assert SECRET not in _joined(sink.events, role)


@pytest.mark.parametrize("value", [SECRET, B64], ids=["raw", "base64"])
async def test_a_secret_split_at_every_position_stays_masked(value: str) -> None:
    emitter, sink, stream = _setup()
    for cut in range(1, len(value)):
        await emitter.emit(MessageDelta(role="assistant", text=f"<{value[:cut]}"))
        await emitter.emit(MessageDelta(role="thought", text="meanwhile "))  # interleaved
        await emitter.emit(MessageDelta(role="assistant", text=f"{value[cut:]}>"))
    await emitter.emit(job_completed(status="succeeded", error=None, duration_ms=1.0))
    _no_leak(sink, stream)
    want = f"<{MASK}>" * (len(value) - 1)
    assert _joined(sink.events) == want
    progress = stream.getvalue().replace("\n  thinking: meanwhile \n  agent: ", "")
    assert f"agent: {want}\n" in progress  # the progress view joins the deltas
    assert [e["seq"] for e in sink.events] == list(range(1, len(sink.events) + 1))


async def test_held_text_is_flushed_at_the_end_not_lost() -> None:
    emitter, sink, stream = _setup()
    await emitter.emit(MessageDelta(role="assistant", text="the key starts sk-"))
    assert _joined(sink.events) == "the key starts "
    await emitter.flush_text()  # the turn ended
    assert _joined(sink.events) == "the key starts sk-"
    await emitter.emit(MessageDelta(role="assistant", text="... and sk-li"))
    await emitter.emit(job_completed(status="succeeded", error=None, duration_ms=1.0))
    assert _joined(sink.events) == "the key starts sk-... and sk-li"
    assert sink.events[-1]["type"] == "job.completed"
    assert stream.getvalue().count("sk-li") == 1


async def test_tool_output_chunks_split_at_every_position() -> None:
    emitter, sink, stream = _setup()
    for cut in range(1, len(SECRET)):
        tool = f"t{cut}"
        for piece in (f"out {SECRET[:cut]}", f"{SECRET[cut:]} end"):
            await emitter.emit(
                ToolUpdated(
                    tool_call_id=tool,
                    status="in_progress",
                    output=Bounded(text=piece, truncated=False, bytes=len(piece)),
                )
            )
        await emitter.emit(ToolCompleted(tool_call_id=tool, status="completed"))
        assert _outputs(sink.events, tool) == f"out {MASK} end"
    _no_leak(sink, stream)


async def test_tool_output_snapshots_keep_their_meaning() -> None:
    emitter, sink, stream = _setup()
    snapshots = [f"out {SECRET[:5]}", f"out {SECRET} end"]
    for text in snapshots:
        await emitter.emit(
            ToolUpdated(
                tool_call_id="t",
                status="in_progress",
                output=Bounded(text=text, truncated=False, bytes=len(text)),
            )
        )
    await emitter.emit(ToolCompleted(tool_call_id="t", status="completed"))
    outputs = [e["data"]["output"]["text"] for e in sink.events if e["data"].get("output")]
    assert outputs == ["out ", f"out {MASK} end"]  # the last snapshot is the whole output
    _no_leak(sink, stream)


async def test_a_held_tool_output_goes_out_when_the_tool_completes() -> None:
    emitter, sink, _ = _setup()
    for text in ("a", f"b {SECRET[:3]}"):
        await emitter.emit(
            ToolUpdated(
                tool_call_id="t",
                status="in_progress",
                output=Bounded(text=text, truncated=False, bytes=len(text)),
            )
        )
    await emitter.emit(ToolCompleted(tool_call_id="t", status="completed"))
    assert _outputs(sink.events, "t") == f"ab {SECRET[:3]}"
    assert sink.events[-1]["type"] == "tool.completed"


async def test_no_secret_bound_leaves_chunks_untouched() -> None:
    sink = MemorySink()
    emitter = EventEmitter(job_id="j", attempt=1, sinks=[sink])
    await emitter.emit(MessageDelta(role="assistant", text="sk-"))
    assert sink.events[0]["data"]["text"] == "sk-"


def test_holdback_is_the_longest_end_that_starts_a_secret() -> None:
    redactor = Redactor()
    redactor.register("abcabd")
    assert redactor.holdback("xxabcab") == 5
    assert redactor.holdback("xxab") == 2
    assert redactor.holdback("xxabd") == 0
    assert redactor.holdback("") == 0
    assert redactor.scrub_text(base64.b64encode(b"abcabd").decode()) == MASK


class _FailsOnDeltas(MemorySink):
    async def write(self, event: Mapping[str, Any], line: str) -> None:
        if event["type"] == "message.delta":
            raise OSError("stdout closed")
        await super().write(event, line)


async def test_a_sink_failing_on_flushed_text_does_not_stop_the_settlement() -> None:
    redactor = Redactor()
    redactor.register(SECRET)
    good, bad = MemorySink(), _FailsOnDeltas()
    emitter = EventEmitter(job_id="j", attempt=1, sinks=[bad, good], redactor=redactor)
    await emitter.emit(MessageDelta(role="assistant", text="sk-"))  # all held back
    assert good.events == []
    await emitter.emit(job_completed(status="succeeded", error=None, duration_ms=1.0))
    assert [e["type"] for e in good.events] == ["message.delta", "job.completed"]
    assert emitter.completed is not None
    with pytest.raises(Exception, match="stdout closed"):
        await emitter.close()
