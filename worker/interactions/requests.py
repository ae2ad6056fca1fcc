"""Native agent requests → canonical interaction requests, and canonical answers → native
replies. Pure functions; the shapes are in ``worker.events.models`` (``QuestionRequest``,
``PlanRequest``, ``PermissionRequest``) and ``worker.interactions.answers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.errors import WorkerError

PLAN_MAX_BYTES = 196 * 1024
TEXT_MAX = 64 * 1024


class RequestInvalid(WorkerError):
    """A native request the worker cannot present faithfully; ``reason`` says why."""

    code = "request_invalid"

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason, check=check)
        self.check = check
        self.reason = reason


def _text(value: object, field: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestInvalid("malformed_request", f"{field} must be a string")
    if len(value.encode("utf-8")) > TEXT_MAX:
        raise RequestInvalid("too_large", f"{field} is over {TEXT_MAX} bytes")
    return value


def _unique(ids: list[str], what: str) -> None:
    if len(set(ids)) != len(ids):
        raise RequestInvalid("malformed_request", f"duplicate {what} ids")


def question_request(params: Mapping[str, object]) -> dict[str, object]:
    """``cursor/ask_question`` → ``QuestionRequest`` data (every question required).

    Raises:
        RequestInvalid: no questions, a question without options, duplicate ids.
    """
    questions = params.get("questions")
    if not isinstance(questions, list) or not questions:
        raise RequestInvalid("malformed_request", "questions must be a non-empty list")
    parsed = [_question(q) for q in questions]
    _unique([q["id"] for q in parsed], "question")
    return {"title": _text(params.get("title"), "title", required=False), "questions": parsed}


def _question(raw: object) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise RequestInvalid("malformed_request", "a question is not an object")
    options = raw.get("options")
    if not isinstance(options, list) or not options:
        raise RequestInvalid("malformed_request", "a question has no options")
    parsed = [
        {"id": str(_text(o.get("id"), "option id")), "label": str(_text(o.get("label"), "label"))}
        for o in options
        if isinstance(o, Mapping)
    ]
    if len(parsed) != len(options):
        raise RequestInvalid("malformed_request", "an option is not an object")
    _unique([o["id"] for o in parsed], "option")
    return {
        "id": str(_text(raw.get("id"), "question id")),
        "prompt": str(_text(raw.get("prompt"), "prompt")),
        "options": parsed,
        "allow_multiple": raw.get("allowMultiple") is True,
    }


def plan_request(params: Mapping[str, object], revision: int) -> dict[str, object]:
    """``cursor/create_plan`` → ``PlanRequest`` data. The document is never cut.

    Raises:
        RequestInvalid: ``too_large`` over 196 KiB of UTF-8, or a malformed field.
    """
    markdown = params.get("plan")
    if not isinstance(markdown, str):
        raise RequestInvalid("malformed_request", "plan must be a Markdown string")
    size = len(markdown.encode("utf-8"))
    if size > PLAN_MAX_BYTES:
        raise RequestInvalid("too_large", f"the plan document is {size} bytes (cap 196 KiB)")
    phases = params.get("phases")
    return {
        "revision": revision,
        "name": _text(params.get("name"), "name", required=False),
        "overview": _text(params.get("overview"), "overview", required=False),
        "markdown": markdown,
        "todos": _plan_todos(params.get("todos")),
        "phases": [
            {"name": str(_text(p.get("name"), "phase name")), "todos": _plan_todos(p.get("todos"))}
            for p in (phases if isinstance(phases, list) else [])
            if isinstance(p, Mapping)
        ],
        "is_project": params.get("isProject") is True,
    }


def _plan_todos(todos: object) -> list[dict[str, str]]:
    return [
        {
            "id": str(t.get("id", "")),
            "content": str(_text(t.get("content", ""), "todo content")),
            "status": str(t.get("status", "pending")),
        }
        for t in (todos if isinstance(todos, list) else [])
        if isinstance(t, Mapping)
    ]


def permission_request(params: Mapping[str, Any]) -> dict[str, Any]:
    """``session/request_permission`` → ``PermissionRequest`` data, minus ``allow_always``."""
    tool = params.get("toolCall")
    tool = tool if isinstance(tool, Mapping) else {}
    options = params.get("options")
    return {
        "title": _opt(tool.get("title")),
        "kind": _opt(tool.get("kind")),
        "reason": permission_reason(tool),
        "options": [
            {
                "option_id": str(o.get("optionId")),
                "name": str(o.get("name", "")),
                "kind": str(o.get("kind", "")),
            }
            for o in (options if isinstance(options, list) else [])
            if isinstance(o, Mapping) and o.get("kind") != "allow_always"
        ],
    }


def permission_reason(tool: Mapping[str, Any]) -> str | None:
    texts = [
        str(block["content"].get("text"))
        for block in tool.get("content") or []
        if isinstance(block, Mapping)
        and isinstance(block.get("content"), Mapping)
        and block["content"].get("type") == "text"
    ]
    return "\n".join(texts)[:4096] if texts else None


def _opt(value: object) -> str | None:
    return None if value is None else str(value)[:1024]


# -- canonical answer → native reply ------------------------------------------------------


def native_reply(kind: str, answer: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-RPC result the agent gets for a canonical answer."""
    outcome = answer["outcome"]
    if outcome == "cancelled":
        return {"outcome": {"outcome": "cancelled"}}
    if kind == "question":
        return {"outcome": _question_outcome(answer)}
    if kind == "plan":
        return {"outcome": _plan_outcome(answer)}
    return {"outcome": {"outcome": "selected", "optionId": answer["option_id"]}}


def _question_outcome(answer: Mapping[str, Any]) -> dict[str, Any]:
    if answer["outcome"] == "skipped":
        reason = answer.get("reason")
        return {"outcome": "skipped", **({"reason": reason} if reason else {})}
    answers = [
        {"questionId": a["question_id"], "selectedOptionIds": list(a["option_ids"])}
        for a in answer["answers"]
    ]
    return {"outcome": "answered", "answers": answers}


def _plan_outcome(answer: Mapping[str, Any]) -> dict[str, Any]:
    if answer["outcome"] == "accepted":
        return {"outcome": "accepted"}  # no planUri: the worker registers no plan file
    feedback = answer.get("feedback")
    return {"outcome": "rejected", **({"reason": feedback} if feedback else {})}


def fallback_answer(kind: str, request: Mapping[str, Any], why: str) -> dict[str, Any]:
    """What an unanswered interaction gets: a decline (question skipped, permission
    rejected once) or, for plans, a cancel."""
    if kind == "question":
        return {"outcome": "skipped", "reason": why}
    if kind == "permission":
        reject = next((o for o in request["options"] if o["kind"] == "reject_once"), None)
        if reject is not None:
            return {"outcome": "selected", "option_id": reject["option_id"]}
    return {"outcome": "cancelled"}
