"""The exported JSON Schema is valid, covers every type, and rejects malformed events."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from worker.events.models import EVENT_TYPES
from worker.events.schema import event_schema

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = event_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _event(type_: str, data: dict[str, object]) -> dict[str, object]:
    return {
        "v": 1,
        "job_id": "j",
        "attempt": 1,
        "seq": 1,
        "ts": "2026-01-01T00:00:00.000Z",
        "type": type_,
        "data": data,
    }


def test_schema_lists_every_type() -> None:
    assert set(event_schema()["properties"]["type"]["enum"]) == set(EVENT_TYPES)


def test_valid_terminal_event(validator: jsonschema.Draft202012Validator) -> None:
    data = {"status": "succeeded", "stop_reason": "end_turn", "error": None, "duration_ms": 1.0}
    validator.validate(_event("job.completed", data))


@pytest.mark.parametrize(
    "event",
    [
        _event(
            "job.completed",
            {"status": "exploded", "stop_reason": None, "error": None, "duration_ms": 1},
        ),
        _event("message.delta", {"role": "assistant"}),
        _event("no.such.type", {}),
        {**_event("notice", {"level": "info", "code": "c", "message": "m"}), "seq": 0},
        {**_event("notice", {"level": "info", "code": "c", "message": "m"}), "extra": 1},
        _event("usage.reported", {}),
    ],
)
def test_invalid_events_are_rejected(
    validator: jsonschema.Draft202012Validator, event: dict[str, object]
) -> None:
    assert list(validator.iter_errors(event))


def test_golden_files_validate(validator: jsonschema.Draft202012Validator) -> None:
    files = sorted(GOLDEN.glob("*.jsonl"))
    assert files, "no golden event files found"
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            errors = list(validator.iter_errors(json.loads(line)))
            assert not errors, f"{path.name}:{number}: {errors[0].message}"
