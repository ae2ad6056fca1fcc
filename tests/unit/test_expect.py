"""``expect`` (``worker.job.expect``): facts decide, and a missing capture is unmet."""

from __future__ import annotations

import pytest

from worker.errors import InvalidJobSpec
from worker.events.normalizer import Normalizer
from worker.job.expect import unmet
from worker.jobs.spec import Expect, parse_job
from worker.workspace.capture import Change


def _change(path: str, status: str) -> Change:
    return Change(path=path, status=status, before=None, after=None)  # type: ignore[arg-type]


def test_no_expectation_checks_nothing() -> None:
    assert unmet(None, tool_calls=0, changes=None) is None
    assert unmet(Expect(), tool_calls=0, changes=None) is None


def test_what_is_met_is_not_reported() -> None:
    expect = Expect(tool_calls=2, changes=True, files=["a.txt", "dir/b.txt"])
    changes = [_change("a.txt", "added"), _change("dir/b.txt", "modified")]
    assert unmet(expect, tool_calls=2, changes=changes) is None


def test_deleted_or_mode_only_changes_do_not_write_a_file() -> None:
    expect = Expect(changes=True, files=["a.txt", "b.sh"])
    changes = [_change("a.txt", "deleted"), _change("b.sh", "mode_changed")]
    error = unmet(expect, tool_calls=0, changes=changes)
    assert error is not None
    assert error.details == {"unmet": ["files"], "missing_files": ["a.txt", "b.sh"]}


def test_without_a_capture_changes_are_unmet_never_assumed() -> None:
    error = unmet(Expect(files=["a.txt"]), tool_calls=0, changes=None)
    assert error is not None
    assert error.code == "expectation_unmet"
    assert error.details == {"unmet": ["files"], "captured": False}
    assert unmet(Expect(tool_calls=1), tool_calls=1, changes=None) is None


def test_replayed_history_is_not_a_tool_call_of_this_turn() -> None:
    normalizer = Normalizer(workspace_root="/workspace")
    update = {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read"}
    normalizer.replay = True
    normalizer.session_update({"sessionId": "s", "update": update})
    normalizer.replay = False
    assert normalizer.tool_calls == 0
    normalizer.session_update({"sessionId": "s", "update": {**update, "toolCallId": "t2"}})
    assert normalizer.tool_calls == 1


@pytest.mark.parametrize(
    "expect",
    [
        {"files": ["/etc/passwd"]},
        {"files": ["a/../b"]},
        {"files": ["a//b"]},
        {"files": [""]},
        {"tool_calls": -1},
        {"tool_calls": "1"},
        {"changes": 1},
        {"files": ["x"] * 65},
        {"other": True},
    ],
)
def test_bad_expectations_are_refused(expect: dict[str, object]) -> None:
    job = {
        "v": 1,
        "job_id": "j",
        "pack": {"name": "p"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": "x",
        "expect": expect,
    }
    with pytest.raises(InvalidJobSpec, match=r"^expect\."):
        parse_job(job)
