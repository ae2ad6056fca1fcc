"""Validation of a control plane's answer against the interaction it answers.

Answers are untrusted input: the shape is checked by pydantic (``extra="forbid"``), then
the content against the request — every question answered exactly once, only offered
option ids, one selection for single-choice questions, no duplicates, the plan revision
still current, never an ``allow_always`` option. A refused answer leaves the
interaction open; :class:`AnswerInvalid` carries the stable ``code`` and a reason.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from worker.errors import WorkerError


class AnswerInvalid(WorkerError):
    """``check``: ``invalid_answer``, ``stale_revision``, ``wrong_turn`` or ``wrong_job``."""

    code = "answer_invalid"

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason, check=check)
        self.check = check
        self.reason = reason


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    turn: int | None = Field(default=None, description="When given, must be the open turn.")


class Selection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    question_id: str
    option_ids: list[str] = Field(min_length=1, max_length=256)


class Answered(_Answer):
    outcome: Literal["answered"]
    answers: list[Selection] = Field(max_length=256)


class Skipped(_Answer):
    outcome: Literal["skipped"]
    reason: str | None = Field(default=None, max_length=4096)


class Cancelled(_Answer):
    outcome: Literal["cancelled"]


class Accepted(_Answer):
    outcome: Literal["accepted"]
    revision: int | None = None


class Rejected(_Answer):
    outcome: Literal["rejected"]
    feedback: str | None = Field(default=None, max_length=64 * 1024)
    revision: int | None = None


class Selected(_Answer):
    outcome: Literal["selected"]
    option_id: str


_ANSWERS: dict[str, Any] = {
    "question": Annotated[Answered | Skipped | Cancelled, Field(discriminator="outcome")],
    "plan": Annotated[Accepted | Rejected | Cancelled, Field(discriminator="outcome")],
    "permission": Annotated[Selected | Cancelled, Field(discriminator="outcome")],
}


@functools.cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    """Built on the first answer of its kind: most jobs get none (a run without Redis
    never does), and building the three took about a tenth of a CLI start."""
    return TypeAdapter(_ANSWERS[kind])


def validate_answer(
    kind: str, request: Mapping[str, object], raw: object, *, turn: int
) -> dict[str, object]:
    """The canonical answer (``turn`` dropped) when ``raw`` answers ``request``.

    Raises:
        AnswerInvalid: the shape or the content does not fit the request.
    """
    try:
        answer: _Answer = _adapter(kind).validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "answer"
        raise AnswerInvalid("invalid_answer", f"{where}: {first['msg']}") from None
    if answer.turn is not None and answer.turn != turn:
        raise AnswerInvalid("wrong_turn", f"the interaction belongs to turn {turn}")
    if isinstance(answer, Answered):
        _check_selections(request, answer.answers)
    elif isinstance(answer, Accepted | Rejected):
        _check_revision(request, answer.revision)
    elif isinstance(answer, Selected):
        _check_option(request, answer.option_id)
    dumped: dict[str, object] = answer.model_dump(exclude={"turn"}, exclude_none=True)
    return dumped


def _check_selections(request: Mapping[str, Any], answers: list[Selection]) -> None:
    questions = {q["id"]: q for q in request["questions"]}
    seen = [a.question_id for a in answers]
    if len(set(seen)) != len(seen):
        raise AnswerInvalid("invalid_answer", "a question is answered twice")
    unknown = set(seen) - questions.keys()
    if unknown:
        raise AnswerInvalid("invalid_answer", f"no such question: {min(unknown)!r}")
    missing = questions.keys() - set(seen)
    if missing:
        raise AnswerInvalid("invalid_answer", f"every question is required: {sorted(missing)}")
    for selection in answers:
        _check_question(questions[selection.question_id], selection.option_ids)


def _check_question(question: Mapping[str, Any], option_ids: list[str]) -> None:
    offered = {o["id"] for o in question["options"]}
    if len(set(option_ids)) != len(option_ids):
        raise AnswerInvalid("invalid_answer", f"{question['id']}: an option is selected twice")
    foreign = [o for o in option_ids if o not in offered]
    if foreign:
        raise AnswerInvalid("invalid_answer", f"{question['id']}: no such option {foreign[0]!r}")
    if not question["allow_multiple"] and len(option_ids) != 1:
        raise AnswerInvalid("invalid_answer", f"{question['id']}: select exactly one option")


def _check_revision(request: Mapping[str, object], revision: int | None) -> None:
    if revision is not None and revision != request["revision"]:
        raise AnswerInvalid(
            "stale_revision", f"the plan is at revision {request['revision']}, not {revision}"
        )


def _check_option(request: Mapping[str, Any], option_id: str) -> None:
    if option_id not in {o["option_id"] for o in request["options"]}:
        raise AnswerInvalid("invalid_answer", f"no such option {option_id!r} (never allow-always)")
