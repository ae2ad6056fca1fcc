"""favordynmods (worker/sandbox/local/dynmods.py): a task joins its cgroups without first
waiting out an RCU grace period only when a cgroup2 hierarchy is mounted with it; the
worker says so once, and remounts only when told to (ACPW_CGROUP_FAVORDYNMODS) and root.

The remount itself changes the host, so here ``mount`` is replaced by a recorder; the
figures (6-19 ms against 0.2 ms a join) were measured with the real remount
(docs/operating.md)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

from worker.sandbox import cgroups
from worker.sandbox.local import dynmods

HYBRID = """\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
31 24 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw{extra}
42 31 0:39 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
"""
V1_ONLY = "42 31 0:39 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n"


def test_the_mount_options_say_whether_migrations_are_fast() -> None:
    assert cgroups.dynmods_favored(HYBRID.format(extra="")) is False
    assert cgroups.dynmods_favored(HYBRID.format(extra=",favordynmods")) is True
    assert cgroups.dynmods_favored(V1_ONLY) is None
    assert cgroups.cgroup2_mounts(HYBRID.format(extra="")) == ["/sys/fs/cgroup/unified"]
    assert cgroups.cgroup2_mounts(V1_ONLY) == []


@pytest.fixture
def mounts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The mount(8) commands run (each succeeds); the once-per-process check reset."""
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(dynmods.subprocess, "run", run)
    monkeypatch.setattr(dynmods, "_checked", dynmods.threading.Event())
    return calls


def _info(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(HYBRID.format(extra=extra))
    return path


def test_by_default_nothing_changes_and_it_is_said_once(
    tmp_path: Path, mounts: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    info = _info(tmp_path, "")
    with caplog.at_level(logging.INFO, logger=dynmods.__name__):
        assert dynmods.check(False, privileged=True, mountinfo=info) is False
        assert dynmods.check(False, privileged=True, mountinfo=info) is None  # once
    assert mounts == []
    [said] = [r.getMessage() for r in caplog.records]
    assert "ACPW_CGROUP_FAVORDYNMODS=true" in said


def test_asked_a_root_worker_remounts_cgroup2(tmp_path: Path, mounts: list[list[str]]) -> None:
    assert dynmods.check(True, privileged=True, mountinfo=_info(tmp_path, "")) is True
    assert mounts == [["mount", "-o", "remount,favordynmods", "/sys/fs/cgroup/unified"]]


@pytest.mark.parametrize(("extra", "privileged"), [(",favordynmods", True), ("", False)])
def test_no_remount_when_favored_already_or_not_root(
    tmp_path: Path, mounts: list[list[str]], extra: str, privileged: bool
) -> None:
    favored = dynmods.check(True, privileged=privileged, mountinfo=_info(tmp_path, extra))
    assert favored is bool(extra)
    assert mounts == []


def test_a_remount_refused_is_said_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dynmods, "_checked", dynmods.threading.Event())

    def refused(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 32, "", "mount: permission denied")

    monkeypatch.setattr(dynmods.subprocess, "run", refused)
    with caplog.at_level(logging.WARNING, logger=dynmods.__name__):
        assert dynmods.check(True, privileged=True, mountinfo=_info(tmp_path, "")) is False
    assert "permission denied" in caplog.text
