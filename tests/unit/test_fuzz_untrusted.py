"""Untrusted input, fuzzed (pure parts): job specs, session updates, control-plane answers.

Each input either parses to its model or fails with its typed error — never another
exception, never unbounded output, in bounded time (hypothesis ``deadline``).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.errors import InvalidJobSpec
from worker.events.models import EVENT_TYPES, EventData
from worker.events.normalizer import KNOWN_FIELDS, Normalizer
from worker.interactions.answers import AnswerInvalid, validate_answer
from worker.interactions.requests import (
    RequestInvalid,
    permission_request,
    plan_request,
    question_request,
)
from worker.jobs.spec import JobSpec, parse_job

FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
# One event's payload limit (docs/contracts.md: 196 KiB); the normalizer's text bound keeps
# far below it.
EVENT_LIMIT = 196 * 1024

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)

VALID_JOB: dict[str, Any] = {
    "v": 1,
    "job_id": "fuzz-1",
    "pack": {"name": "cursor-emulator"},
    "workspace": {"kind": "local", "path": "/tmp/ws"},
    "prompt": "hi",
    "network": {"mode": "allowlist", "allow": ["api.example.com:443"]},
}
JOB_KEYS = [*VALID_JOB, "model", "mode", "credentials", "session", "permissions", "interactions",
            "limits", "labels", "results", "bogus"]  # fmt: skip


def _parse(raw: str | bytes | dict[str, Any]) -> JobSpec | InvalidJobSpec:
    try:
        return parse_job(raw)
    except InvalidJobSpec as exc:
        return exc


def _check_job(raw: str | bytes | dict[str, Any]) -> None:
    result = _parse(raw)
    if isinstance(result, InvalidJobSpec):
        assert result.code == "invalid_job_spec"
        assert len(result.message) < 4096
    else:
        assert isinstance(result, JobSpec)


@FUZZ
@given(st.binary(max_size=512) | st.text(max_size=512))
def test_job_spec_from_random_text(raw: bytes | str) -> None:
    _check_job(raw)


@FUZZ
@given(json_values)
def test_job_spec_from_random_json(value: Any) -> None:
    _check_job(json.dumps(value))


@FUZZ
@given(st.dictionaries(st.sampled_from(JOB_KEYS), json_values, max_size=4))
def test_job_spec_with_fields_replaced(changes: dict[str, Any]) -> None:
    # Near-valid jobs reach the deep validators (network allowlist, credentials, labels).
    _check_job(json.dumps({**VALID_JOB, **changes}))


@FUZZ
@given(st.lists(st.text(max_size=300) | st.integers(), max_size=70))
def test_job_spec_network_allowlists(allow: list[Any]) -> None:
    _check_job({**VALID_JOB, "network": {"mode": "allowlist", "allow": allow}})


# --- session/update into the normalizer -------------------------------------------------

KINDS = st.sampled_from([*KNOWN_FIELDS, "unknown_kind", ""]) | st.text(max_size=10)
FIELD_NAMES = sorted({f for fields in KNOWN_FIELDS.values() for f in fields} - {"sessionUpdate"})
big_text = st.text(max_size=64) | st.builds(lambda n: "x" * n, st.integers(0, 100_000))
field_values = (
    json_values
    | big_text
    | st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), max_size=3)
)
updates = st.builds(
    lambda kind, fields: {"sessionUpdate": kind, **fields},
    KINDS,
    st.dictionaries(st.sampled_from([*FIELD_NAMES, "extra"]), field_values, max_size=5),
)
params = st.fixed_dictionaries(
    {"update": updates | json_values},
    optional={"sessionId": st.sampled_from(["root", "child", "other"]) | json_values},
)
EXTENSIONS = st.sampled_from(
    ["cursor/update_todos", "cursor/task", "cursor/generate_image", "cursor/create_plan", "x/y"]
)


def _check_events(out: list[EventData]) -> None:
    for event in out:
        assert EVENT_TYPES.get(event.TYPE) is type(event), event
        data = event.wire()
        assert isinstance(data, dict)
        assert len(json.dumps(data, default=str).encode()) <= EVENT_LIMIT


@FUZZ
@given(
    st.lists(params | json_values, max_size=8),
    st.lists(st.tuples(EXTENSIONS, json_values), max_size=3),
)
def test_normalizer_maps_random_updates_to_known_events(
    sequence: list[Any], extensions: list[tuple[str, Any]]
) -> None:
    normalizer = Normalizer(workspace_root="/workspace", text_limit=4096)
    normalizer.bind("root")
    for item in sequence:
        _check_events(normalizer.session_update(item))
    for method, payload in extensions:
        _check_events(normalizer.extension(method, payload))


# --- control-plane answers ----------------------------------------------------------------

QUESTION = question_request(
    {"questions": [{"id": "q1", "prompt": "?", "options": [{"id": "a", "label": "A"}]}]}
)
PLAN = plan_request({"plan": "do it", "todos": []}, 3)
PERMISSION = permission_request(
    {
        "toolCall": {"toolCallId": "t", "title": "x"},
        "options": [{"optionId": "allow-once", "name": "Allow", "kind": "allow_once"}],
    }
)
REQUESTS = {"question": QUESTION, "plan": PLAN, "permission": PERMISSION}
answers = st.fixed_dictionaries(
    {},
    optional={
        "outcome": st.sampled_from(
            ["answered", "skipped", "cancelled", "accepted", "rejected", "selected"]
        )
        | st.text(max_size=8),
        "answers": st.lists(
            st.fixed_dictionaries(
                {"question_id": st.sampled_from(["q1", "q2"]) | st.text(max_size=4)},
                optional={"option_ids": st.lists(st.sampled_from(["a", "b"]), max_size=3)},
            ),
            max_size=3,
        ),
        "option_id": st.sampled_from(["allow-once", "allow-always"]) | st.text(max_size=4),
        "revision": st.integers() | json_values,
        "turn": st.integers(0, 3) | json_values,
        "feedback": json_values,
        "extra": json_values,
    },
)


@FUZZ
@given(st.sampled_from(sorted(REQUESTS)), answers | json_values)
def test_answers_validate_or_are_refused_with_a_code(kind: str, raw: Any) -> None:
    result = _answer(kind, raw)
    if isinstance(result, AnswerInvalid):
        assert result.check in {"invalid_answer", "stale_revision", "wrong_turn", "wrong_job"}
        assert len(result.reason) < 4096
        return
    outcomes = {"answered", "skipped", "cancelled", "accepted", "rejected", "selected"}
    assert result["outcome"] in outcomes
    assert result.get("option_id") != "allow-always"  # never a global rule


def _answer(kind: str, raw: Any) -> dict[str, Any] | AnswerInvalid:
    try:
        return validate_answer(kind, REQUESTS[kind], raw, turn=1)
    except AnswerInvalid as exc:
        return exc


@FUZZ
@given(json_values, st.sampled_from(["question", "plan", "permission"]))
def test_native_requests_map_or_are_refused(raw: Any, kind: str) -> None:
    build = {
        "question": question_request,
        "plan": lambda p: plan_request(p, 1),
        "permission": permission_request,
    }[kind]
    try:
        request = build(raw if isinstance(raw, dict) else {"x": raw})
    except RequestInvalid:
        return
    assert isinstance(request, dict)
    assert len(json.dumps(request, default=str)) <= EVENT_LIMIT
