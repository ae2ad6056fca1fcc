"""Durable interactions through real Redis: answers, forged and duplicate answers, stale
plan revisions, wrong turn/job, timeouts, cancel mid-question, the CLI and the client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.cursor_jobs import check_golden, run_live
from tests.integration.test_run_job import REPO, _env
from worker.client import Client
from worker.errors import InteractionClosed, InteractionNotFound, InvalidAnswer
from worker.interactions import answer_fields
from worker.interactions.send import send_answer
from worker.store import keys

Event = dict[str, Any]
ANSWERED = {
    "outcome": "answered",
    "answers": [
        {"question_id": "colour", "option_ids": ["blue"]},
        {"question_id": "extras", "option_ids": ["tests", "docs"]},
    ],
}


def _of(events: list[Event], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _raw_answer(url: str, job: str, interaction_id: str, answer: Any, **fields: str) -> None:
    """Write straight to the control stream, past the client's own checks (a forger)."""
    entry: Any = {**answer_fields(job, 1, interaction_id, answer), **fields}
    redis.Redis.from_url(url).xadd(keys.control(job), entry)


def test_answers_resolve_question_plan_and_permission(tmp_path: Path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    answers = {
        "question": ANSWERED,
        "plan": {"outcome": "rejected", "feedback": "Split step two.", "revision": 1},
        "permission": {"outcome": "selected", "option_id": "allow-once"},
    }
    persisted = []

    def on_event(event: Event, _: subprocess.Popen[str]) -> None:
        if event["type"] == "interaction.requested":
            data = event["data"]
            record = client.hget(keys.interactions(event["job_id"]), data["interaction_id"])
            persisted.append(json.loads(record or b"{}").get("status"))
            send_answer(client, event["job_id"], data["interaction_id"], answers[data["kind"]])

    events = run_live(
        tmp_path,
        "scenario: questions",
        redis_url,
        on_event,
        job_id="golden-questions",
        permissions={"policy": "ask"},
    )
    assert persisted == ["open", "open", "open"]  # stored before the event went out
    resolved = _of(events, "interaction.resolved")
    assert [(r["kind"], r["outcome"], r["delivered"]) for r in resolved] == [
        ("question", "answered", True),
        ("plan", "rejected", True),
        ("permission", "selected", True),
    ]
    text = "".join(d["text"] for d in _of(events, "message.delta") if d["role"] == "assistant")
    assert '"selectedOptionIds":["tests","docs"]' in text
    assert "Plan: rejected." in text
    assert "Permission: allow-once." in text
    [decided] = _of(events, "permission.decided")
    assert (decided["policy"], decided["decision"]) == ("ask", "allowed")
    stored = [json.loads(v) for v in client.hvals(keys.interactions("golden-questions"))]
    assert {r["status"] for r in stored} == {"resolved"}
    check_golden("questions", events, tmp_path)


def test_forged_duplicate_and_misdirected_answers_are_refused(
    tmp_path: Path, redis_url: str
) -> None:
    def on_event(event: Event, _: subprocess.Popen[str]) -> None:
        if event["type"] != "interaction.requested":
            return
        job, iid = event["job_id"], event["data"]["interaction_id"]
        if event["data"]["kind"] == "plan":  # answered at once, not left to its timeout
            _raw_answer(redis_url, job, iid, {"outcome": "rejected", "revision": 1})
            return
        one = {"question_id": "colour", "option_ids": ["blue"]}
        for bad in (
            {"outcome": "answered", "answers": [one]},  # a required question missing
            {
                "outcome": "answered",
                "answers": [one, {"question_id": "extras", "option_ids": ["rm-rf"]}],
            },
            {"outcome": "answered", "answers": [one, one]},
            {
                "outcome": "answered",
                "answers": [
                    {"question_id": "colour", "option_ids": ["blue", "red"]},
                    {"question_id": "extras", "option_ids": ["docs"]},
                ],
            },
            {**ANSWERED, "turn": 7},
            {"outcome": "maybe"},
        ):
            _raw_answer(redis_url, job, iid, bad)
        _raw_answer(redis_url, job, iid, ANSWERED, job_id="another-job")
        _raw_answer(redis_url, job, "question-1-9-deadbeef", ANSWERED)
        _raw_answer(redis_url, job, iid, ANSWERED)
        _raw_answer(redis_url, job, iid, {"outcome": "skipped"})  # a second answer

    events = run_live(tmp_path, "scenario: questions", redis_url, on_event)
    rejected = [
        (r["code"], r["interaction_id"][:8]) for r in _of(events, "interaction.answer_rejected")
    ]
    assert sorted(rejected) == sorted(
        [("invalid_answer", "question")] * 5
        + [
            ("wrong_turn", "question"),
            ("wrong_job", "question"),
            ("unknown_interaction", "question"),
            ("closed", "question"),
        ]
    )
    [first, *_] = _of(events, "interaction.resolved")
    assert (first["kind"], first["outcome"], first["answer"]) == ("question", "answered", ANSWERED)


def test_stale_plan_revision_is_refused(tmp_path: Path, redis_url: str) -> None:
    script = '#!scenario\ncreate-plan {"name": "First"}\ncreate-plan {"name": "Second"}\n'
    seen: list[str] = []

    def on_event(event: Event, _: subprocess.Popen[str]) -> None:
        if event["type"] != "interaction.requested":
            return
        data, job = event["data"], event["job_id"]
        seen.append(data["interaction_id"])
        if data["plan"]["revision"] == 1:
            _raw_answer(redis_url, job, data["interaction_id"], {"outcome": "rejected"})
        else:
            _raw_answer(
                redis_url, job, data["interaction_id"], {"outcome": "accepted", "revision": 1}
            )
            _raw_answer(redis_url, job, seen[0], {"outcome": "accepted", "revision": 1})
            _raw_answer(
                redis_url, job, data["interaction_id"], {"outcome": "accepted", "revision": 2}
            )

    events = run_live(tmp_path, script, redis_url, on_event)
    codes = [r["code"] for r in _of(events, "interaction.answer_rejected")]
    assert codes == ["stale_revision", "closed"]
    outcomes = [(r["outcome"], r["resolved_by"]) for r in _of(events, "interaction.resolved")]
    assert outcomes == [("rejected", "answer"), ("accepted", "answer")]


def test_unanswered_interactions_are_declined_at_the_timeout(
    tmp_path: Path, redis_url: str
) -> None:
    events = run_live(
        tmp_path,
        "scenario: questions",
        redis_url,
        lambda e, p: None,
        interactions={"answer_timeout_s": 0.5},
        permissions={"policy": "ask"},
    )
    resolved = [
        (r["kind"], r["outcome"], r["resolved_by"]) for r in _of(events, "interaction.resolved")
    ]
    assert resolved == [
        ("question", "skipped", "timeout"),
        ("plan", "cancelled", "timeout"),
        ("permission", "selected", "timeout"),
    ]
    [decided] = _of(events, "permission.decided")
    assert (decided["decision"], decided["option_id"]) == ("denied", "reject-once")
    text = "".join(d["text"] for d in _of(events, "message.delta") if d["role"] == "assistant")
    assert '"outcome":"skipped"' in text
    assert "no answer within 0.5 s" in text
    assert events[-1]["data"]["status"] == "succeeded"


def test_cancel_mid_question_cancels_the_interaction(tmp_path: Path, redis_url: str) -> None:
    def on_event(event: Event, proc: subprocess.Popen[str]) -> None:
        if event["type"] == "interaction.requested":
            proc.send_signal(signal.SIGINT)

    events = run_live(tmp_path, "scenario: questions", redis_url, on_event)
    [resolved] = _of(events, "interaction.resolved")
    assert (resolved["outcome"], resolved["resolved_by"]) == ("cancelled", "cancelled")
    assert events[-1]["data"]["status"] == "cancelled"
    record = json.loads(
        redis.Redis.from_url(redis_url).hget(
            keys.interactions(events[0]["job_id"]), resolved["interaction_id"]
        )
        or b"{}"
    )
    assert (record["status"], record["resolved_by"]) == ("resolved", "cancelled")


def test_cli_and_client_answer(tmp_path: Path, redis_url: str) -> None:
    outputs: list[subprocess.CompletedProcess[str]] = []

    def on_event(event: Event, _: subprocess.Popen[str]) -> None:
        if event["type"] != "interaction.requested":
            return
        job, iid = event["job_id"], event["data"]["interaction_id"]
        with Client(redis_url) as client:
            with pytest.raises(InvalidAnswer):
                client.answer(job, iid, {"outcome": "answered", "answers": []})
            with pytest.raises(InteractionNotFound):
                client.answer(job, "question-1-1-00000000", ANSWERED)
            assert [r["status"] for r in client.interactions(job)] == ["open"]
        answer = tmp_path / "answer.json"
        answer.write_text(json.dumps(ANSWERED))
        cli = [sys.executable, "-m", "worker.cli", "answer", job, iid, str(answer)]
        outputs.append(
            subprocess.run(
                [*cli, "--redis", redis_url, "--json"],
                capture_output=True,
                text=True,
                env=_env(tmp_path),
                cwd=REPO,
                timeout=30,
            )
        )

    script = "#!scenario\nask-question " + json.dumps(
        {
            "questions": [
                {"id": "colour", "prompt": "Colour?", "options": [{"id": "blue", "label": "Blue"}]},
                {
                    "id": "extras",
                    "prompt": "Extras?",
                    "allowMultiple": True,
                    "options": [{"id": "tests", "label": "Tests"}, {"id": "docs", "label": "Docs"}],
                },
            ]
        }
    )
    events = run_live(tmp_path, script, redis_url, on_event)
    [done] = outputs
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entry"]
    [resolved] = _of(events, "interaction.resolved")
    assert resolved["answer"] == ANSWERED
    with Client(redis_url) as client, pytest.raises(InteractionClosed):
        client.answer(events[0]["job_id"], resolved["interaction_id"], ANSWERED)


def test_oversize_plan_is_rejected_not_truncated(tmp_path: Path, redis_url: str) -> None:
    plan = "x" * (197 * 1024)
    script = (
        "#!scenario\ncreate-plan " + json.dumps({"name": "Huge", "plan": plan}) + "\nsay {{plan}}\n"
    )
    events = run_live(tmp_path, script, redis_url, lambda e, p: None)
    assert _of(events, "interaction.requested") == []
    [notice] = [n for n in _of(events, "notice") if n["code"] == "interaction_refused"]
    assert notice["details"]["reason"] == "too_large"
    text = "".join(d["text"] for d in _of(events, "message.delta") if d["role"] == "assistant")
    assert text == "rejected"


def test_cursor_tour_example_answered_from_a_second_terminal(
    tmp_path: Path, redis_url: str
) -> None:
    examples = REPO / "examples"
    answers = {
        "question": examples / "answers" / "colour.json",
        "plan": examples / "answers" / "accept-plan.json",
        "permission": examples / "answers" / "allow-once.json",
    }
    env = _env(tmp_path)
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "run",
            str(examples / "cursor-tour.json"),
            "--json",
            "--quiet",
            "--redis",
            redis_url,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    ) as proc:
        assert proc.stdout is not None
        events = [_answering(json.loads(line), answers, redis_url, env) for line in proc.stdout]
    assert proc.returncode == 0
    types = [e["type"] for e in events]
    for expected in (
        "todos.updated",
        "delegation.completed",
        "artifact.referenced",
        "model.selected",
        "permission.decided",
    ):
        assert expected in types
    assert [r["outcome"] for r in _of(events, "interaction.resolved")] == [
        "answered",
        "accepted",
        "selected",
    ]
    check_golden("cursor-tour", events, tmp_path)


def _answering(event: Event, answers: dict[str, Path], redis_url: str, env: Any) -> Event:
    """Answer each interaction with ``acp-worker answer`` (a second terminal)."""
    if event["type"] == "interaction.requested":
        data = event["data"]
        answer = [sys.executable, "-m", "worker.cli", "answer", event["job_id"]]
        done = subprocess.run(
            [*answer, data["interaction_id"], str(answers[data["kind"]]), "--redis", redis_url],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
    return event
