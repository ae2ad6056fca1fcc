"""The reaper's results sweep: captured patches go after ``results_keep_s``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from worker.service.reaper import reap_results

DAY = 24 * 3600.0


def _patch(root: Path, job: str, attempt: str, age_s: float) -> Path:
    attempt_dir = root / job / attempt
    attempt_dir.mkdir(parents=True)
    patch = attempt_dir / "changes.patch"
    patch.write_text("diff --git a/x b/x\n")
    then = time.time() - age_s
    for path in (patch, attempt_dir):
        os.utime(path, (then, then))
    return attempt_dir


def test_old_attempts_go_recent_ones_stay(tmp_path: Path) -> None:
    old = _patch(tmp_path, "job-a", "1", 8 * DAY)
    recent = _patch(tmp_path, "job-a", "2", 1 * DAY)
    lone = _patch(tmp_path, "job-b", "1", 30 * DAY)
    removed = reap_results(tmp_path, keep_s=7 * DAY)
    assert removed == ["job-a/1", "job-b/1"]
    assert not old.exists()
    assert not lone.exists()
    assert recent.exists()
    assert not (tmp_path / "job-b").exists()  # empty job directories go too
    assert reap_results(tmp_path, keep_s=7 * DAY) == []


def test_a_recent_file_keeps_its_attempt(tmp_path: Path) -> None:
    attempt = _patch(tmp_path, "job-a", "1", 8 * DAY)
    (attempt / "late.txt").write_text("written now")
    os.utime(attempt, (time.time() - 8 * DAY,) * 2)
    assert reap_results(tmp_path, keep_s=7 * DAY) == []
    assert attempt.exists()


def test_zero_keeps_everything_and_links_are_not_followed(tmp_path: Path) -> None:
    _patch(tmp_path, "job-a", "1", 30 * DAY)
    outside = tmp_path / "outside"
    _patch(outside, "victim", "1", 30 * DAY)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "link").symlink_to(outside / "victim")
    assert reap_results(tmp_path, keep_s=0) == []
    assert (tmp_path / "job-a" / "1").exists()
    assert reap_results(tmp_path / "results", keep_s=DAY) == []
    assert (outside / "victim" / "1").exists()
    assert reap_results(tmp_path / "missing", keep_s=DAY) == []
