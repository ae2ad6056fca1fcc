"""``worker.store.broker.delivery_of``: the job a kombu message in the broker runs, read
from a message the client really publishes; anything else (another task, garbage a
broker key may hold) names no job and never raises."""

from __future__ import annotations

import base64
import json

import pytest

from worker.store import broker


def _message(body: object, *, encoded: bool = True) -> dict[str, object]:
    text = json.dumps(body)
    return {
        "body": base64.b64encode(text.encode()).decode() if encoded else text,
        "headers": {"task": "tasks.run_job"},
        "properties": {"body_encoding": "base64"} if encoded else {},
    }


def test_a_run_message_names_its_job_and_attempt_queued_or_unacked() -> None:
    body = [[{"job_id": "j-1", "prompt": "hi"}], {"attempt": 3, "submitted_at": 1.0}, {}]
    queued = json.dumps(_message(body))
    assert broker.delivery_of(queued) == ("j-1", 3)
    assert broker.delivery_of(json.dumps([_message(body), "", "runs"])) == ("j-1", 3)
    plain = [[], {"job": json.dumps({"job_id": "j-2"})}, {}]  # kwargs, spec as JSON text
    assert broker.delivery_of(json.dumps(_message(plain, encoded=False))) == ("j-2", None)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b"{}",
        json.dumps({"body": "%%%", "properties": {"body_encoding": "base64"}}),
        json.dumps(_message([[], {}, {}])),  # the reaper's own task: no job
        json.dumps(_message([[{"no_id": 1}], {}, {}])),
        json.dumps(_message([["{bad"], {}, {}])),
        json.dumps(_message([[{"job_id": "j"}], {"attempt": "x"}, {}])),
    ],
)
def test_anything_else_names_no_job(raw: bytes | str) -> None:
    assert broker.delivery_of(raw) is None


def test_the_queue_lists_are_kombus_priority_lists() -> None:
    assert broker.queue_lists("runs") == ["runs", "runs\x06\x163", "runs\x06\x166", "runs\x06\x169"]
