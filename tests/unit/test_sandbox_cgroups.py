"""What the cgroup drivers write for given limits, and where."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from worker.sandbox import cgroups
from worker.sandbox.base import ResourceLimits
from worker.sandbox.cgroups import (
    CgroupSet,
    CgroupV1,
    CgroupV2,
    out_of_memory,
    v1_writes,
    v2_writes,
)

LIMITS = ResourceLimits(memory_bytes=512 << 20, cpus=1.5, pids=128)


def test_v1_memory_then_memsw_and_no_swap() -> None:
    writes = v1_writes(LIMITS)
    assert writes["memory"] == [
        ("memory.limit_in_bytes", str(512 << 20)),
        ("memory.memsw.limit_in_bytes?", str(512 << 20)),
        ("memory.swappiness", "0"),
    ]
    assert writes["pids"] == [("pids.max", "128")]
    assert writes["cpu"] == [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "150000")]


def test_v1_no_cpu_limit_and_tiny_quota() -> None:
    assert v1_writes(ResourceLimits(1, 0, 1))["cpu"][1] == ("cpu.cfs_quota_us", "-1")
    assert v1_writes(ResourceLimits(1, 0.001, 1))["cpu"][1] == ("cpu.cfs_quota_us", "1000")


def test_v2_writes() -> None:
    assert v2_writes(LIMITS) == [
        ("memory.max", str(512 << 20)),
        ("memory.swap.max?", "0"),
        ("pids.max", "128"),
        ("cpu.max", "150000 100000"),
    ]
    assert v2_writes(ResourceLimits(1, 0, 1))[-1] == ("cpu.max", "max 100000")


def test_plans() -> None:
    v1 = CgroupV1(Path("/cg"), "acpw").plan("s1")
    assert v1.paths == (
        Path("/cg/memory/acpw/s1"),
        Path("/cg/pids/acpw/s1"),
        Path("/cg/cpu/acpw/s1"),
    )
    assert v1.oom_file == Path("/cg/memory/acpw/s1/memory.oom_control")
    v2 = CgroupV2(Path("/cg"), "acpw").plan("s1")
    assert v2.paths == (Path("/cg/acpw/s1"),)
    assert v2.oom_file == Path("/cg/acpw/s1/memory.events")
    assert v2.procs_files == (Path("/cg/acpw/s1/cgroup.procs"),)


def test_set_round_trips_through_json() -> None:
    cgs = CgroupV1(Path("/cg"), "acpw").plan("s1")
    assert CgroupSet.from_json(cgs.to_json()) == cgs


def test_out_of_memory_reads_the_oom_kill_counter_of_either_version(tmp_path: Path) -> None:
    v1 = CgroupV1(tmp_path / "cg1", "acpw").plan("s1")
    v2 = CgroupV2(tmp_path / "cg2", "acpw").plan("s1")
    assert not out_of_memory(v1)  # removed: no evidence
    v1.oom_file.parent.mkdir(parents=True)
    v1.oom_file.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (v1.oom_file.parent / "memory.failcnt").write_text("12\n")  # the counter wins
    assert not out_of_memory(v1)
    v1.oom_file.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert out_of_memory(v1)
    v2.oom_file.parent.mkdir(parents=True)
    v2.oom_file.write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 0\noom_group_kill 0\n")
    assert not out_of_memory(v2)
    v2.oom_file.write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\noom_group_kill 0\n")
    assert out_of_memory(v2)


def test_an_old_v1_kernel_without_the_counter_falls_back_to_limit_hits(tmp_path: Path) -> None:
    v1 = CgroupV1(tmp_path, "acpw").plan("s1")
    v1.oom_file.parent.mkdir(parents=True)
    v1.oom_file.write_text("oom_kill_disable 0\nunder_oom 0\n")  # before Linux 4.13
    assert not out_of_memory(v1)  # no failcnt either
    (v1.oom_file.parent / "memory.failcnt").write_text("0\n")
    assert not out_of_memory(v1)
    (v1.oom_file.parent / "memory.failcnt").write_text("3\n")
    assert out_of_memory(v1)


def test_a_process_own_cgroups_are_never_offered_for_killing() -> None:
    """``of_process`` leaves out root cgroups and any cgroup this process is in: a
    watchdog over them would kill the worker (or the host) with the container."""
    assert cgroups.of_process(os.getpid()) == ()


def test_cgroup_lines_parse_v1_and_v2_entries() -> None:
    text = "12:pids:/libpod_parent/libpod-1\n4:cpu,cpuacct:/a\n0::/u/x\n1:name=systemd:/\n"
    assert cgroups._cgroup_lines(text) == {
        "pids": "/libpod_parent/libpod-1",
        "cpu,cpuacct": "/a",
        "": "/u/x",
        "name=systemd": "/",
    }


def test_exiting_tells_a_running_process_from_a_dead_or_gone_one() -> None:
    """A running process is not exiting; one killed but not yet reaped (a zombie) is,
    and so is a pid that no longer exists."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not cgroups.exiting(child.pid)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
        assert Path(f"/proc/{child.pid}").exists()
        assert cgroups.exiting(child.pid)
    finally:
        child.kill()
        child.wait()
    assert cgroups.exiting(child.pid)
