"""favordynmods (worker/sandbox/local/dynmods.py): a task joins its cgroups without first
waiting out an RCU grace period only when a cgroup2 hierarchy is mounted with it; the
worker says so once, and remounts only when told to (ACPW_CGROUP_FAVORDYNMODS) and root.
Without it, the primer (ACPW_CGROUP_PRIME) rewrites the process's own membership while
held: here into a plain file standing in for ``cgroup.procs`` (the real kernel's side is
tests/integration/test_cgroup_priming.py).

The remount itself changes the host, so here ``mount`` is replaced by a recorder; the
figures (6-19 ms against 0.2 ms a join) were measured with the real remount
(docs/operating.md)."""

from __future__ import annotations

import logging
import os
import subprocess
import time
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
    monkeypatch.setattr(dynmods, "_favored", [])
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
    monkeypatch.setattr(dynmods, "_favored", [])

    def refused(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 32, "", "mount: permission denied")

    monkeypatch.setattr(dynmods.subprocess, "run", refused)
    with caplog.at_level(logging.WARNING, logger=dynmods.__name__):
        assert dynmods.check(True, privileged=True, mountinfo=_info(tmp_path, "")) is False
    assert "permission denied" in caplog.text


def _proc_files(tmp_path: Path, cgroup: str, mountinfo: str) -> dict[str, Path]:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text(mountinfo)
    return {"cgroup": tmp_path / "cgroup", "mountinfo": tmp_path / "mountinfo"}


@pytest.mark.parametrize(
    ("cgroup", "mount_root", "expected"),
    [
        ("0::/system.slice/w.service\n", "/", "/sys/fs/cgroup/unified/system.slice/w.service"),
        ("0::/\n", "/", "/sys/fs/cgroup/unified"),
        ("0::/kubepods/pod1/c1\n", "/kubepods/pod1", "/sys/fs/cgroup/unified/c1"),
        ("0::/elsewhere\n", "/kubepods/pod1", None),  # outside the mount it sees
        ("4:memory:/x\n", "/", None),  # no cgroup2 membership
    ],
)
def test_the_own_cgroup_is_found_below_the_cgroup2_mount(
    tmp_path: Path, cgroup: str, mount_root: str, expected: str | None
) -> None:
    info = HYBRID.format(extra="").replace(
        "0:38 / /sys/fs/cgroup/unified", f"0:38 {mount_root} /sys/fs/cgroup/unified"
    )
    found = dynmods.own_procs_file(**_proc_files(tmp_path, cgroup, info))
    assert found == (None if expected is None else Path(expected, "cgroup.procs"))


def test_no_cgroup2_mount_means_no_own_cgroup(tmp_path: Path) -> None:
    assert dynmods.own_procs_file(**_proc_files(tmp_path, "0::/\n", V1_ONLY)) is None


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within 5 s"
        time.sleep(0.005)


def test_a_held_primer_rewrites_the_membership_until_released(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    writes: list[str] = []
    primer = dynmods.Primer(lambda: procs)
    real = primer._prime

    def counted() -> None:
        real()
        writes.append(procs.read_text())

    primer._prime = counted  # type: ignore[method-assign]
    first = primer.hold()
    second = primer.hold()
    _wait(lambda: len(writes) >= 3)
    assert set(writes) == {str(os.getpid())}  # its own pid, nothing else
    first()
    first()  # idempotent
    seen = len(writes)
    _wait(lambda: len(writes) > seen + 1)  # the other hold keeps it going
    second()
    _wait(lambda: primer._thread is None)
    stopped = len(writes)
    time.sleep(5 * dynmods.PRIME_EVERY_S)
    assert len(writes) == stopped
    assert not primer.broken


def test_a_hold_lapses_by_itself(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    primer = dynmods.Primer(lambda: procs)
    primer.hold(for_at_most_s=0.02)  # never released
    _wait(lambda: primer._thread is None)
    assert procs.read_text() == str(os.getpid())


def test_a_refused_rewrite_stops_priming_in_the_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    primer = dynmods.Primer(lambda: tmp_path / "missing" / "cgroup.procs")
    with caplog.at_level(logging.INFO, logger=dynmods.__name__):
        primer.hold()
        _wait(lambda: primer._thread is None)
    assert primer.broken
    assert "not primed" in caplog.text
    release = primer.hold()  # nothing starts again
    assert primer._thread is None
    release()


def test_priming_only_where_migrations_are_slow(
    tmp_path: Path, mounts: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    holds: list[float] = []
    monkeypatch.setattr(dynmods.PRIMER, "hold", lambda **kw: holds.append(1.0) or (lambda: None))
    dynmods.prime(enabled=True)  # not checked yet: nothing known, nothing primed
    assert dynmods.check(False, privileged=True, mountinfo=_info(tmp_path, "")) is False
    dynmods.prime(enabled=False)
    assert holds == []
    dynmods.prime(enabled=True)
    assert holds == [1.0]
    monkeypatch.setattr(dynmods, "_favored", [])
    monkeypatch.setattr(dynmods, "_checked", dynmods.threading.Event())
    assert dynmods.check(False, privileged=True, mountinfo=_info(tmp_path, ",favordynmods"))
    dynmods.prime(enabled=True)
    assert holds == [1.0]


def test_a_forked_pool_process_starts_without_its_parents_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    monkeypatch.setattr(dynmods.PRIMER, "_procs", lambda: procs)
    release = dynmods.PRIMER.hold()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the at-fork hook left it no hold and no thread
            fresh = dynmods.PRIMER._holds == {} and dynmods.PRIMER._thread is None
            os._exit(0 if fresh else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert dynmods.PRIMER._holds != {}  # the parent's hold is its own
    finally:
        release()
    _wait(lambda: dynmods.PRIMER._thread is None)
