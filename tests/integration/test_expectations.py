"""``expect``: a turn that ends ``end_turn`` without what the job names fails
``expectation_unmet``, whatever the agent said (real emulator agent, real bubblewrap)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.cursor_jobs import run_job
from tests.integration.test_run_job import _job, run_cli

REFUSAL = "#!scenario\nsay I have finished the task and written notes.md for you.\n"
WRITER = (
    "#!scenario\n"
    'tool {"title": "Write notes.md", "kind": "edit", "rawInput": {"path": "notes.md"}}\n'
    "write notes.md the notes\n"
    "say Done.\n"
)


def _completed(events: list[dict[str, Any]]) -> dict[str, Any]:
    return events[-1]["data"]


def test_a_text_only_success_claim_fails_every_expectation(tmp_path: Path) -> None:
    expect = {"tool_calls": 1, "changes": True, "files": ["notes.md"]}
    events = run_job(tmp_path, REFUSAL, expect=expect)
    done = _completed(events)
    assert done["status"] == "failed"
    assert done["stop_reason"] == "end_turn"
    error = done["error"]
    assert error["code"] == "expectation_unmet"
    assert error["details"]["unmet"] == ["tool_calls", "changes", "files"]
    assert error["details"]["missing_files"] == ["notes.md"]
    assert error["details"]["tool_calls"] == 0
    said = "".join(e["data"]["text"] for e in events if e["type"] == "message.delta")
    assert "written notes.md" in said  # the agent claimed success: the facts decide


def test_a_turn_that_did_the_work_succeeds(tmp_path: Path) -> None:
    expect = {"tool_calls": 1, "changes": True, "files": ["notes.md"]}
    events = run_job(tmp_path, WRITER, expect=expect)
    done = _completed(events)
    assert done["status"] == "succeeded", done.get("error")
    changed = next(e for e in events if e["type"] == "workspace.changed")["data"]
    assert any(entry["path"] == "notes.md" for entry in changed["paths"])


def test_a_file_other_than_the_named_one_does_not_count(tmp_path: Path) -> None:
    events = run_job(tmp_path, WRITER, expect={"files": ["report.md", "notes.md"]})
    error = _completed(events)["error"]
    assert error["code"] == "expectation_unmet"
    assert (error["details"]["unmet"], error["details"]["missing_files"]) == (
        ["files"],
        ["report.md"],
    )


def test_the_cli_exits_failed_and_a_bad_expectation_is_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, REFUSAL, expect={"tool_calls": 1})
    assert run_cli(tmp_path, "run", str(job), "--quiet").returncode == 1
    bad = _job(tmp_path, REFUSAL, expect={"files": ["../outside"]})
    refused = run_cli(tmp_path, "run", str(bad), "--quiet")
    assert refused.returncode == 2
    assert "expect.files" in refused.stderr
