"""The local backend's pure parts: bwrap options, privilege drop, ids, labels, records."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError
from worker.sandbox.base import ReadOnlyMount, ResourceLimits, SandboxSpec
from worker.sandbox.cgroups import CgroupSet
from worker.sandbox.local.bwrap import BindSources, HostLayout, build_bwrap_options, bwrap_command
from worker.sandbox.local.privilege import drop_privileges_argv, needs_thorough_drop
from worker.sandbox.local.records import SandboxRecord, check_local_id, sandbox_labels
from worker.sandbox.shared import make_sandbox_id

LAYOUT = HostLayout(
    root_links=(("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")),
    root_dirs=("sbin",),
)
SPEC = SandboxSpec(
    job_id="j1",
    attempt=1,
    workspace=Path("/srv/ws"),
    pack_closure=Path("/cache/pack"),
    limits=ResourceLimits(memory_bytes=1 << 30, cpus=1.0, pids=256),
    labels={"acpw.job": "spoofed", "team": "a"},
    extra_mounts=(ReadOnlyMount(source=Path("/srv/extra"), target="/opt/extra"),),
)


SOURCES = BindSources(
    workspace=Path("/srv/ws"),
    pack=Path("/cache/pack"),
    etc=Path("/run/s/x.etc"),
    empty_dir=Path("/run/s/empty"),
    extras=(Path("/srv/extra"),),
)
MASKS = (
    MaskEntry(PurePosixPath(".cursor"), MaskKind.ANCHOR),
    MaskEntry(PurePosixPath(".cursor/hooks.json"), MaskKind.FILE),
    MaskEntry(PurePosixPath(".cursor/plugins"), MaskKind.DIR),
)


def _options(env: dict[str, str] | None = None, masks: tuple[MaskEntry, ...] = ()) -> list[str]:
    return build_bwrap_options(
        layout=LAYOUT,
        spec=SPEC,
        sources=SOURCES,
        masks=masks,
        env=env or {"PATH": "/usr/bin", "TOKEN": "a b"},
        cwd="/workspace",
        seccomp_fd=7,
    )


def _pairs(args: list[str], flag: str, arity: int) -> list[tuple[str, ...]]:
    return [tuple(args[i + 1 : i + 1 + arity]) for i, a in enumerate(args) if a == flag]


def test_isolation_flags_come_first() -> None:
    args = _options()
    assert args[:14] == [
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--uid", "1000", "--gid", "1000", "--hostname", "acpw",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
    ]  # fmt: skip
    assert "--share-net" not in args


def test_env_is_set_one_by_one_after_clearenv() -> None:
    args = _options()
    assert _pairs(args, "--setenv", 2) == [("PATH", "/usr/bin"), ("TOKEN", "a b")]
    assert args.index("--clearenv") < args.index("--setenv")


def test_mounts() -> None:
    args = _options()
    assert _pairs(args, "--ro-bind", 2) == [
        ("/usr", "/usr"),
        ("/sbin", "/sbin"),
        ("/run/s/x.etc", "/etc"),
        ("/cache/pack", "/opt/acp-pack"),
        ("/srv/extra", "/opt/extra"),
    ]
    assert _pairs(args, "--symlink", 2) == [
        ("usr/bin", "/bin"),
        ("usr/lib", "/lib"),
        ("usr/lib64", "/lib64"),
    ]
    assert _pairs(args, "--bind", 2) == [("/srv/ws", "/workspace")]
    assert _pairs(args, "--tmpfs", 1) == [("/tmp",), ("/home/agent",)]
    # Each tmpfs is bounded (--size applies to the --tmpfs right after it).
    size = str(256 << 20)
    assert _pairs(args, "--size", 3) == [
        (size, "--tmpfs", "/tmp"),
        (size, "--tmpfs", "/home/agent"),
    ]
    assert _pairs(args, "--proc", 1) == [("/proc",)]
    assert _pairs(args, "--dev", 1) == [("/dev",)]
    assert not any(a.startswith("/etc/") for a in args)  # nothing of the host's /etc


def test_masks_follow_the_workspace_in_plan_order() -> None:
    args = _options(masks=MASKS)
    ws = args.index("/workspace") - 2
    assert args[ws : ws + 3] == ["--bind", "/srv/ws", "/workspace"]
    assert args[ws + 3 : ws + 12] == [
        "--bind", "/srv/ws/.cursor", "/workspace/.cursor",
        "--ro-bind", "/dev/null", "/workspace/.cursor/hooks.json",
        "--ro-bind", "/run/s/empty", "/workspace/.cursor/plugins",
    ]  # fmt: skip


def test_privilege_drop_enters_the_stage_then_drops_to_the_owner() -> None:
    argv = drop_privileges_argv(
        nsenter="/usr/bin/nsenter",
        setpriv="/usr/bin/setpriv",
        mount_ns=Path("/run/st/acpw-x.mnt"),
        owner=(61000, 61001),
        thorough=False,
    )
    assert argv == [
        "/usr/bin/nsenter", "--mount=/run/st/acpw-x.mnt", "--setuid=61000", "--setgid=61001",
        "--",
    ]  # fmt: skip


def test_thorough_privilege_drop_also_empties_inheritable_and_bounding_sets() -> None:
    argv = drop_privileges_argv(
        nsenter="/usr/bin/nsenter",
        setpriv="/usr/bin/setpriv",
        mount_ns=Path("/run/st/acpw-x.mnt"),
        owner=(61000, 61001),
        thorough=True,
    )
    assert argv == [
        "/usr/bin/nsenter", "--mount=/run/st/acpw-x.mnt", "--",
        "/usr/bin/setpriv", "--reuid=61000", "--regid=61001", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--",
    ]  # fmt: skip


def _status(tmp_path: Path, inheritable: str) -> Path:
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nCapInh:\t{inheritable}\nCapBnd:\t000001ffffffffff\n")
    return status


def test_thorough_drop_only_when_an_exec_could_gain_capabilities(tmp_path: Path) -> None:
    bwrap = tmp_path / "bwrap"
    bwrap.write_bytes(b"")
    bwrap.chmod(0o755)
    assert not needs_thorough_drop(str(bwrap), _status(tmp_path, "0000000000000000"))
    assert needs_thorough_drop(str(bwrap), _status(tmp_path, "0000000000000400"))
    unknown = tmp_path / "status-without-capinh"
    unknown.write_text("Name:\tx\n")
    assert needs_thorough_drop(str(bwrap), unknown)
    bwrap.chmod(0o4755)
    assert needs_thorough_drop(str(bwrap), _status(tmp_path, "0000000000000000"))


def test_root_frozen_then_chdir_and_seccomp_last() -> None:
    args = _options()
    assert args[-6:] == ["--remount-ro", "/", "--chdir", "/workspace", "--seccomp", "7"]
    assert args.index("--remount-ro") > max(i for i, a in enumerate(args) if a == "--ro-bind")


def test_command_keeps_options_off_the_command_line() -> None:
    assert bwrap_command("/usr/bin/bwrap", 9, ["node", "agent.js"], info_fd=5, block_fd=6) == [
        "/usr/bin/bwrap", "--info-fd", "5", "--block-fd", "6", "--args", "9",
        "--", "node", "agent.js",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ("abc", "acpw-abc-3-"),
        ("a/b c", "acpw-a-b-c-3-"),
        ("../..", "acpw-job-3-"),
        ("é", "acpw-job-3-"),
    ],
)
def test_sandbox_ids_are_safe(job: str, expected: str) -> None:
    sandbox_id = make_sandbox_id(job, 3)
    assert sandbox_id.startswith(expected)
    assert len(sandbox_id) == len(expected) + 8
    check_local_id(sandbox_id)  # accepted as a local id


def test_ids_are_unique_and_bounded() -> None:
    assert make_sandbox_id("j", 1) != make_sandbox_id("j", 1)
    assert len(make_sandbox_id("x" * 500, 1)) < 100


@pytest.mark.parametrize("bad", ["", "acpw-", "../acpw-x", "acpw-a/b", "other-1"])
def test_foreign_ids_are_refused(bad: str) -> None:
    with pytest.raises(SandboxError):
        check_local_id(bad)


def test_labels_job_and_attempt_are_truthful() -> None:
    assert sandbox_labels(SPEC, "w9") == {
        "acpw.job": "j1",
        "acpw.attempt": "1",
        "acpw.worker": "w9",
        "team": "a",
    }


def test_record_round_trips_through_json() -> None:
    cgs = CgroupSet(1, (Path("/cg/memory/x"), Path("/cg/pids/x")), Path("/cg/memory/x/oom"))
    record = SandboxRecord(
        sandbox_id="acpw-j-1-00",
        labels={"a": "b"},
        cgroups=cgs,
        etc_dir=Path("/run/x.etc"),
        workspace=Path("/ws"),
        pack_closure=Path("/pack"),
        pids=(10, 11),
        created_at=5.0,
        mask_points=(".cursor", ".cursor/hooks.json"),
        stage=Path("/run/stage/acpw-j-1-00"),
        staged=("workspace", "pack"),
    )
    assert SandboxRecord.from_json(record.to_json()) == record
    assert record.to_json()["backend"] == "local"
    old = {k: v for k, v in record.to_json().items() if k not in ("mask_points", "stage", "staged")}
    assert SandboxRecord.from_json(old).stage is None  # records written before these fields
