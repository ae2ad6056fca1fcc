"""Interaction requests (native → canonical) and answers (validated → native)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.interactions.answers import AnswerInvalid, validate_answer
from worker.interactions.requests import (
    RequestInvalid,
    fallback_answer,
    native_reply,
    permission_request,
    plan_request,
    question_request,
)

QUESTION = question_request(
    {
        "questions": [
            {
                "id": "q1",
                "prompt": "One?",
                "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}],
            },
            {
                "id": "q2",
                "prompt": "Many?",
                "allowMultiple": True,
                "options": [{"id": "x", "label": "X"}, {"id": "y", "label": "Y"}],
            },
        ]
    }
)
PERMISSION = permission_request(
    {
        "toolCall": {
            "toolCallId": "t",
            "title": "`rm`",
            "kind": "execute",
            "content": [{"type": "content", "content": {"type": "text", "text": "why"}}],
        },
        "options": [
            {"optionId": "allow-once", "name": "Allow", "kind": "allow_once"},
            {"optionId": "allow-always", "name": "Always", "kind": "allow_always"},
            {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
        ],
    }
)


def _answered(*selections: tuple[str, list[str]]) -> dict[str, Any]:
    return {
        "outcome": "answered",
        "answers": [{"question_id": q, "option_ids": ids} for q, ids in selections],
    }


def test_a_complete_answer_becomes_the_native_reply() -> None:
    answer = validate_answer(
        "question", QUESTION, _answered(("q1", ["b"]), ("q2", ["x", "y"])), turn=1
    )
    assert native_reply("question", answer) == {
        "outcome": {
            "outcome": "answered",
            "answers": [
                {"questionId": "q1", "selectedOptionIds": ["b"]},
                {"questionId": "q2", "selectedOptionIds": ["x", "y"]},
            ],
        }
    }


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (_answered(("q1", ["a"])), "invalid_answer"),  # q2 missing
        (_answered(("q1", ["a"]), ("q2", ["x"]), ("q3", ["x"])), "invalid_answer"),  # forged
        (_answered(("q1", ["a", "b"]), ("q2", ["x"])), "invalid_answer"),  # single choice
        (_answered(("q1", ["z"]), ("q2", ["x"])), "invalid_answer"),  # out of range
        (_answered(("q1", ["a"]), ("q2", ["x", "x"])), "invalid_answer"),  # duplicate option
        (_answered(("q1", ["a"]), ("q1", ["a"])), "invalid_answer"),  # twice
        ({**_answered(("q1", ["a"]), ("q2", ["x"])), "turn": 2}, "wrong_turn"),
        ({"outcome": "answered", "answers": [], "extra": 1}, "invalid_answer"),
        ({"outcome": "accepted"}, "invalid_answer"),  # a plan answer to a question
    ],
)
def test_bad_question_answers_are_refused(answer: dict[str, Any], code: str) -> None:
    with pytest.raises(AnswerInvalid) as caught:
        validate_answer("question", QUESTION, answer, turn=1)
    assert caught.value.check == code


def test_plan_revision_and_feedback() -> None:
    plan = plan_request({"plan": "# P", "todos": [{"id": "t", "content": "T"}], "phases": []}, 3)
    with pytest.raises(AnswerInvalid) as caught:
        validate_answer("plan", plan, {"outcome": "accepted", "revision": 2}, turn=1)
    assert caught.value.check == "stale_revision"
    answer = validate_answer("plan", plan, {"outcome": "rejected", "feedback": "no"}, turn=1)
    assert native_reply("plan", answer) == {"outcome": {"outcome": "rejected", "reason": "no"}}
    accepted = validate_answer("plan", plan, {"outcome": "accepted", "revision": 3}, turn=1)
    assert native_reply("plan", accepted) == {"outcome": {"outcome": "accepted"}}


def test_oversize_plans_are_refused_never_cut() -> None:
    with pytest.raises(RequestInvalid) as caught:
        plan_request({"plan": "é" * (100 * 1024)}, 1)  # 200 KiB of UTF-8
    assert caught.value.check == "too_large"


def test_permission_never_offers_or_accepts_allow_always() -> None:
    assert [o["option_id"] for o in PERMISSION["options"]] == ["allow-once", "reject-once"]
    assert PERMISSION["reason"] == "why"
    with pytest.raises(AnswerInvalid):
        validate_answer(
            "permission", PERMISSION, {"outcome": "selected", "option_id": "allow-always"}, turn=1
        )
    assert fallback_answer("permission", PERMISSION, "timeout") == {
        "outcome": "selected",
        "option_id": "reject-once",
    }


def test_fallbacks_decline_questions_and_cancel_plans() -> None:
    assert native_reply("question", fallback_answer("question", QUESTION, "late")) == {
        "outcome": {"outcome": "skipped", "reason": "late"}
    }
    assert fallback_answer("plan", {}, "late") == {"outcome": "cancelled"}


@pytest.mark.parametrize(
    "params",
    [
        {"questions": []},
        {"questions": [{"id": "q", "prompt": "p", "options": []}]},
        {"questions": [{"id": "q", "prompt": "p", "options": [{"id": "a", "label": "A"}]}] * 2},
    ],
)
def test_malformed_questions_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(RequestInvalid):
        question_request(params)
