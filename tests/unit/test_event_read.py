"""The read side parses events with the write side's models: ``Event`` types ``data`` by
``type``, keeps exactly what was sent, and never drops an event it cannot type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.client.client import StreamEvent, _handed_back_to
from worker.events.models import EVENT_TYPES, Event, JobCompleted, Notice, UnknownData

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ENVELOPE = {"v": 1, "job_id": "j", "attempt": 2, "seq": 7, "ts": "2026-01-01T00:00:00.000Z"}


def _golden_events() -> list[dict[str, object]]:
    return [
        json.loads(line)
        for f in sorted(GOLDEN.glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_every_golden_event_reads_back_as_its_own_model_and_wire() -> None:
    events = _golden_events()
    assert len(events) > 100
    for raw in events:
        event = Event.model_validate(raw)
        assert type(event.data) is EVENT_TYPES[str(raw["type"])]
        assert event.data.wire() == raw["data"]  # nothing added, nothing lost
        assert (event.job_id, event.seq, event.type) == (raw["job_id"], raw["seq"], raw["type"])


def test_a_completion_reads_as_job_completed_with_typed_fields() -> None:
    data = {
        "status": "cancelled",
        "stop_reason": None,
        "error": {"code": "handed_back", "message": "m", "details": {"next_attempt": 3}},
        "duration_ms": 12.5,
    }
    item = StreamEvent.from_line(
        "5-0", json.dumps({**ENVELOPE, "type": "job.completed", "data": data})
    )
    assert isinstance(item.envelope.data, JobCompleted)
    assert item.envelope.data.error is not None
    assert item.envelope.data.error.code == "handed_back"
    assert _handed_back_to(item) == 3
    assert item.event["data"] == data  # the stored JSON, as it was


def test_a_field_this_version_does_not_know_is_left_out_not_fatal() -> None:
    data = {"level": "info", "code": "c", "message": "m", "added_in_v1_later": True}
    event = Event.model_validate({**ENVELOPE, "type": "notice", "data": data})
    assert isinstance(event.data, Notice)
    assert event.data.code == "c"


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("workspace.snapshotted", {"files": 3}),  # a type of a newer worker
        ("job.completed", {"status": "exploded"}),  # a shape the model refuses
    ],
)
def test_what_cannot_be_typed_is_kept_as_sent(event_type: str, data: dict[str, object]) -> None:
    event = Event.model_validate({**ENVELOPE, "type": event_type, "data": data})
    assert isinstance(event.data, UnknownData)
    assert event.data.wire() == data
