"""The session store and its copier, on a real (temporary) filesystem; plus the pure parts
of session state: the manifest field, the mount target check, both backends' mount plans."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_packs import _manifest
from worker.errors import InvalidInput, SandboxError, SessionNotFound
from worker.packs.manifest import SessionFiles, parse_manifest
from worker.safetree import Bounds, OverBound, copy_tree
from worker.sandbox.base import (
    ResourceLimits,
    SandboxSpec,
    WritableMount,
    home_relative,
)
from worker.sandbox.docker.containers import ImagePlan, _binds, _state_tmpfs
from worker.sandbox.local import BindSources, HostLayout, build_bwrap_options
from worker.sessions import JobSessions, SessionStore, reap_sessions
from worker.sessions.files import Selection
from worker.sessions.store import check_session_id
from worker.settings import Settings

BIG = Bounds(max_bytes=1 << 20, max_entries=100)
SID = "0f0f0f0f-1111-4222-8333-444444444444"
OWNER = (os.getuid(), os.getgid())


def _tree(root: Path) -> dict[str, str]:
    """Every entry below ``root``: files with their text, directories as ``<dir>``."""
    out = {}
    for current, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(current, name), root)] = "<dir>"
        for name in files:
            path = Path(current, name)
            out[os.path.relpath(path, root)] = path.read_text()
    return out


def _session(root: Path, text: str = "turn 1") -> Path:
    root.mkdir(parents=True)
    (root / "meta.json").write_text('{"sessionId": "x"}')
    (root / "blobs").mkdir()
    (root / "blobs" / "history.json").write_text(text)
    return root


# -- copier -------------------------------------------------------------------------------


def test_copies_directories_and_regular_files(tmp_path: Path) -> None:
    src = _session(tmp_path / "src")
    (src / "exec.sh").write_text("#!/bin/sh\n")
    (src / "exec.sh").chmod(0o4755)
    report = copy_tree(src, tmp_path / "dst", BIG)
    assert _tree(tmp_path / "dst") == _tree(src)
    assert (report.files, report.dirs, report.skipped) == (3, 2, [])
    assert report.bytes == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert (tmp_path / "dst" / "exec.sh").stat().st_mode & 0o7777 == 0o755  # no set-id


def test_links_fifos_sockets_and_hard_links_are_skipped_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    src = _session(tmp_path / "src")
    (src / "to-file").symlink_to(outside / "secret")
    (src / "to-dir").symlink_to(outside)
    (src / "blobs" / "to-etc").symlink_to("/etc/passwd")
    os.mkfifo(src / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))
    (src / "a").write_text("linked")
    os.link(src / "a", src / "b")
    report = copy_tree(src, tmp_path / "dst", BIG)
    assert sorted((s.path, s.kind) for s in report.skipped) == [
        ("a", "hardlink"),
        ("b", "hardlink"),
        ("blobs/to-etc", "symlink"),
        ("fifo", "fifo"),
        ("sock", "socket"),
        ("to-dir", "symlink"),
        ("to-file", "symlink"),
    ]
    assert _tree(tmp_path / "dst") == {
        "meta.json": '{"sessionId": "x"}',
        "blobs": "<dir>",
        "blobs/history.json": "turn 1",
    }
    assert "host secret" not in str(_tree(tmp_path / "dst"))


def test_a_source_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = _session(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(NotADirectoryError):
        copy_tree(tmp_path / "link", tmp_path / "dst", BIG)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    ("bounds", "what"),
    [
        (Bounds(max_bytes=1000, max_entries=100), "bytes"),
        (Bounds(max_bytes=1 << 20, max_entries=5), "entries"),
        (Bounds(max_bytes=1 << 20, max_entries=100, max_depth=3), "levels of directories"),
    ],
)
def test_bounds_stop_the_copy(tmp_path: Path, bounds: Bounds, what: str) -> None:
    src = tmp_path / "src"
    deep = src / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    for i in range(4):
        (src / f"f{i}").write_text("x" * 300)
    with pytest.raises(OverBound) as caught:
        copy_tree(src, tmp_path / "dst", bounds)
    assert caught.value.what == what


# -- store --------------------------------------------------------------------------------


def _store(tmp_path: Path, bounds: Bounds = BIG) -> SessionStore:
    return SessionStore(tmp_path / "store", bounds)


def test_save_replaces_the_recording_atomically_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    first = _session(tmp_path / "one", "turn 1")
    (first / "only-in-first").write_text("old")
    store.save("cursor-emulator", SID, first)
    store.save("cursor-emulator", SID, _session(tmp_path / "two", "turn 1, turn 2"))
    kept = store.path("cursor-emulator", SID)
    assert kept == tmp_path / "store" / "cursor-emulator" / SID
    assert _tree(kept) == _tree(tmp_path / "two")
    assert os.listdir(kept.parent) == [SID]  # no temp or old copies


def test_a_save_sweeps_stale_leftovers_of_saves_that_died_but_not_fresh_ones(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    folder = tmp_path / "store" / "cursor-emulator"
    stale = _session(folder / f".{SID}.dead0001.tmp")
    stale_old = _session(folder / f".{SID}.dead0002.tmp.old")
    fresh = _session(folder / f".{SID}.live0003.tmp")  # another worker saving right now
    other = _session(folder / ".ffffffff-1111-4222-8333-444444444444.dead0004.tmp")
    two_hours_ago = time.time() - 7200
    for path in (stale, stale_old, other):
        os.utime(path, (two_hours_ago, two_hours_ago))
    store.save("cursor-emulator", SID, _session(tmp_path / "src"))
    assert sorted(os.listdir(folder)) == sorted([SID, fresh.name, other.name])


def test_a_save_over_the_bound_keeps_the_previous_recording(tmp_path: Path) -> None:
    store = _store(tmp_path, Bounds(max_bytes=100, max_entries=100))
    store.save("cursor-emulator", SID, _session(tmp_path / "one", "small"))
    with pytest.raises(OverBound):
        store.save("cursor-emulator", SID, _session(tmp_path / "two", "x" * 500))
    kept = store.path("cursor-emulator", SID)
    assert (kept / "blobs" / "history.json").read_text() == "small"
    assert os.listdir(kept.parent) == [SID]


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".hidden", "", "x\n", "a" * 201])
def test_session_ids_are_single_safe_names(bad: str) -> None:
    with pytest.raises(ValueError, match="not a session id"):
        check_session_id(bad)


def test_pack_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        _store(tmp_path).path("../other", SID)


# -- one job's sessions -------------------------------------------------------------------


CURSOR_FILES = SessionFiles(dir=".cursor/acp-sessions", keep=["{session}"])


def _job_sessions(
    tmp_path: Path,
    resume: str | None,
    files: SessionFiles = CURSOR_FILES,
    pack: str = "cursor-emulator",
    **settings: Any,
) -> JobSessions:
    conf = Settings(work_dir=tmp_path / "work", **settings)
    made = JobSessions.for_job(conf, pack=pack, files=files, resume=resume)
    assert made is not None
    return made


def test_no_declared_store_means_no_session_state(tmp_path: Path) -> None:
    conf = Settings(work_dir=tmp_path / "work")
    assert JobSessions.for_job(conf, pack="p", files=None, resume=None) is None
    assert conf.session_root == tmp_path / "sessions"  # next to the work dir by default


def test_a_resume_on_a_pack_that_keeps_no_sessions_is_refused(tmp_path: Path) -> None:
    conf = Settings(work_dir=tmp_path / "work")
    with pytest.raises(SessionNotFound) as caught:
        JobSessions.for_job(conf, pack="gemini-cli", files=None, resume=SID)
    assert "keeps no sessions" in caught.value.message
    assert caught.value.details == {
        "session_id": SID,
        "store": str(tmp_path / "sessions" / "gemini-cli"),
        "reason": "not_kept",
    }
    assert caught.value.to_dict()["code"] == "session_not_found"


def test_an_unknown_resume_is_refused_naming_the_session_and_the_store(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, SID)
    with pytest.raises(SessionNotFound) as caught:
        sessions.check()
    store = str(tmp_path / "sessions" / "cursor-emulator")
    assert SID in caught.value.message
    assert store in caught.value.message
    assert caught.value.details == {"session_id": SID, "store": store, "reason": "not_recorded"}
    assert caught.value.to_dict()["code"] == "session_not_found"


def test_a_resume_gets_exactly_its_session_and_saves_it_back(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", BIG)
    other = "1f1f1f1f-0000-4000-8000-000000000000"
    store.save("cursor-emulator", SID, _session(tmp_path / "one", "mine"))
    store.save("cursor-emulator", other, _session(tmp_path / "two", "someone else's"))
    sessions = _job_sessions(tmp_path, SID)
    sessions.check()
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    mount = sessions.prepare(job_dir, OWNER)
    assert mount == WritableMount(job_dir / "agent-state", "/home/agent/.cursor/acp-sessions")
    assert os.listdir(mount.source) == [SID]  # isolation: no other session
    assert (mount.source / SID / "blobs" / "history.json").read_text() == "mine"
    (mount.source / SID / "blobs" / "history.json").write_text("mine, turn 2")
    (mount.source / SID / "link").symlink_to("/etc/passwd")
    notices = sessions.save(SID)
    assert [n.code for n in notices] == ["session_entries_skipped"]
    assert notices[0].details == {
        "session_id": SID,
        "count": 1,
        "entries": [{"path": "link", "kind": "symlink"}],
    }
    kept = store.path("cursor-emulator", SID)
    assert (kept / "blobs" / "history.json").read_text() == "mine, turn 2"
    assert not os.path.lexists(kept / "link")
    sessions.remove()
    assert not mount.source.exists()


def test_save_reports_instead_of_raising(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, None, session_max_bytes=64)
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    mount = sessions.prepare(job_dir, OWNER)
    assert os.listdir(mount.source) == []
    assert sessions.save(None) == []  # no session started
    assert sessions.save(SID) == []  # the agent recorded nothing
    bad = sessions.save("../../etc")
    assert [(n.code, n.details) for n in bad] == [
        ("session_not_saved", {"session_id": "../../etc", "reason": "invalid_session_id"})
    ]
    (mount.source / SID).symlink_to(tmp_path)
    linked = sessions.save(SID)
    assert [(n.code, (n.details or {})["reason"]) for n in linked] == [
        ("session_not_saved", "unreadable")
    ]
    (mount.source / SID).unlink()
    _session(mount.source / SID, "x" * 100)
    large = sessions.save(SID)
    assert [(n.code, (n.details or {})["reason"]) for n in large] == [
        ("session_not_saved", "too_large")
    ]
    assert "more than 64 bytes" in large[0].message
    assert not (tmp_path / "sessions" / "cursor-emulator" / SID).exists()


# -- declaration and mount plans ---------------------------------------------------------


def test_manifest_session_store_is_a_path_below_home() -> None:
    launch = _manifest()["launch"]
    ok = parse_manifest(
        _manifest(launch={**launch, "session_store": ".cursor/acp-sessions"}), path="p"
    )
    assert ok.launch.session_store == ".cursor/acp-sessions"
    assert parse_manifest(_manifest(), path="p").launch.session_store is None
    for bad in ("/home/agent/.cursor", "../x", ".cursor/../../x", "a//b", ".", "a:b", ""):
        with pytest.raises(InvalidInput):
            parse_manifest(_manifest(launch={**launch, "session_store": bad}), path="p")


def test_writable_mount_targets_must_be_below_home() -> None:
    assert home_relative("/home/agent/.cursor/acp-sessions") == ".cursor/acp-sessions"
    for bad in ("/home/agent", "/home/agent/", "/etc/x", "/home/agent/../x", "/home/agentx"):
        with pytest.raises(SandboxError):
            home_relative(bad)
    with pytest.raises(SandboxError):
        home_relative("/home/agent/a:b")


SPEC = SandboxSpec(
    job_id="j1",
    attempt=1,
    workspace=Path("/srv/ws"),
    pack_closure=Path("/cache/pack"),
    limits=ResourceLimits(memory_bytes=1 << 30, cpus=1.0, pids=256),
    labels={},
    state_mounts=(WritableMount(Path("/w/j/agent-state"), "/home/agent/.cursor/acp-sessions"),),
)


def test_bwrap_binds_state_mounts_over_the_home_tmpfs() -> None:
    sources = BindSources(
        workspace=Path("/srv/ws"),
        pack=Path("/cache/pack"),
        etc=Path("/run/s/etc"),
        empty_dir=Path("/run/s/empty"),
        states=(Path("/stage/s0"),),
    )
    args = build_bwrap_options(
        layout=HostLayout((), ()), spec=SPEC, sources=sources, env={}, cwd="/", seccomp_fd=3
    )
    home = args.index("/home/agent")
    assert args[home - 1] == "--tmpfs"
    assert args[home + 1 : home + 4] == ["--bind", "/stage/s0", "/home/agent/.cursor/acp-sessions"]


def test_docker_binds_state_mounts_rw_with_user_owned_parents() -> None:
    plan = ImagePlan("sha256:x", None, None)
    assert "/w/j/agent-state:/home/agent/.cursor/acp-sessions:rw" in _binds(SPEC, plan)
    parents = _state_tmpfs(SPEC, podman=True)
    assert list(parents) == ["/home/agent/.cursor"]
    assert parents["/home/agent/.cursor"].endswith("mode=0700,U")
    docker = _state_tmpfs(SPEC, podman=False)["/home/agent/.cursor"]
    assert "uid=1000,gid=1000" in docker


# -- retention ------------------------------------------------------------------------------

DAY = 24 * 3600.0
OLD_SID = "00000000-1111-4222-8333-444444444444"


def _aged(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then), follow_symlinks=False)


def test_sessions_idle_past_their_keep_are_reaped_the_rest_stay(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    _session(root / "cursor" / SID)
    _aged(_session(root / "cursor" / OLD_SID), 31)
    _aged(_session(root / "claude" / OLD_SID), 31)
    leftover = root / "cursor" / f".{SID}.abcd.tmp"  # a save's temporary copy: not a session
    leftover.mkdir()
    _aged(leftover, 31)
    removed = reap_sessions(root, keep_s=30 * DAY)
    assert sorted(removed) == [f"claude/{OLD_SID}", f"cursor/{OLD_SID}"]
    assert sorted(p.name for p in (root / "cursor").iterdir()) == [leftover.name, SID]
    assert list((root / "claude").iterdir()) == []
    assert reap_sessions(root, keep_s=30 * DAY) == []


def test_zero_keeps_every_session_and_links_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    _aged(_session(root / "cursor" / OLD_SID), 400)
    assert reap_sessions(root, keep_s=0) == []
    elsewhere = _session(tmp_path / "elsewhere" / OLD_SID)
    _aged(elsewhere, 400)
    (root / "linked").symlink_to(tmp_path / "elsewhere")  # a pack dir that is a link
    (root / "cursor" / SID).symlink_to(elsewhere)  # a session that is a link
    _aged(root / "cursor" / SID, 400)
    assert reap_sessions(root, keep_s=DAY) == [f"cursor/{OLD_SID}"]
    assert _tree(elsewhere) == _tree(_session(tmp_path / "copy" / OLD_SID))
    assert reap_sessions(tmp_path / "missing", keep_s=DAY) == []


def test_a_resume_or_a_save_restarts_the_keep(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", BIG)
    store.save("cursor", SID, _session(tmp_path / "agent" / SID))
    recorded = store.path("cursor", SID)
    _aged(recorded, 31)
    (tmp_path / "job").mkdir()
    store.restore("cursor", SID, tmp_path / "job" / SID, None)  # resumed: in use again
    assert reap_sessions(store.root, keep_s=30 * DAY) == []
    source = _session(tmp_path / "agent2" / SID)
    _aged(source, 400)  # the agent's own times do not make a fresh save look old
    store.save("cursor", SID, source)
    assert reap_sessions(store.root, keep_s=30 * DAY) == []
    _aged(recorded, 31)
    assert reap_sessions(store.root, keep_s=30 * DAY) == [f"cursor/{SID}"]
    assert not store.recorded("cursor", SID)


def test_the_session_keep_setting_has_a_default() -> None:
    assert Settings().session_keep_s == 30 * DAY
    assert Settings(session_keep_s=0).session_keep_s == 0


# -- declared session files (launch.sessions) -----------------------------------------------

OTHER = "1f1f1f1f-0000-4000-8000-000000000000"
CLAUDE_FILES = SessionFiles(dir=".claude/projects", keep=["*/{session}.jsonl", "*/{session}"])
CODEX_FILES = SessionFiles(dir=".codex/sessions", keep=["*/*/*/rollout-*-{session}.jsonl"])


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_selection_takes_the_matches_the_way_to_them_and_what_they_hold() -> None:
    sel = Selection(CLAUDE_FILES.keep, SID)
    assert sel("-workspace", "dir")  # on the way to a match
    assert not sel("-workspace", "file")  # a file named like the way is not a match
    assert sel(f"-workspace/{SID}.jsonl", "file")
    assert sel(f"-workspace/{SID}", "dir")
    assert sel(f"-workspace/{SID}/tool-results/x.txt", "file")  # inside a matched dir
    assert not sel(f"-workspace/{OTHER}.jsonl", "file")
    assert not sel(f"{SID}.jsonl", "file")  # `*` is one name, never none or several
    assert not sel(f"a/b/{SID}.jsonl", "file")
    assert sel.matched == 2
    assert not sel(f"-workspace/{SID}.jsonl", "symlink") or sel.matched == 2  # no count


def test_written_since_sees_only_the_sessions_own_files_and_follows_no_link(
    tmp_path: Path,
) -> None:
    sessions = _job_sessions(tmp_path, None, CLAUDE_FILES, "claude-agent-acp")
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    root = sessions.prepare(job_dir, OWNER).source
    assert not sessions.written_since(SID, 0)  # nothing recorded yet
    outside = _write(tmp_path / "outside", {f"{SID}.jsonl": "not in the sandbox"})
    _write(root, {f"-workspace/{OTHER}.jsonl": "another session", "-workspace/notes": "x"})
    (root / "-linked").symlink_to(outside)  # a link on the way is not followed
    (root / "-workspace" / f"{SID}").symlink_to(outside)  # nor a link at the match
    assert not sessions.written_since(SID, 0)
    record = _write(root, {f"-workspace/{SID}.jsonl": "turn 1"}) / "-workspace" / f"{SID}.jsonl"
    assert sessions.written_since(SID, 0)
    written = record.stat().st_mtime
    assert not sessions.written_since(SID, written + 1)  # written before that time
    os.utime(record, (written + 5, written + 5))
    assert sessions.written_since(SID, written + 1)
    assert not sessions.written_since("../x", 0)  # not a session id: nothing to look at


def test_a_session_answered_but_not_recorded_is_said(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, None, CLAUDE_FILES, "claude-agent-acp")
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    _write(sessions.prepare(job_dir, OWNER).source, {f"-workspace/{OTHER}.jsonl": "other"})
    assert sessions.save(SID) == []  # no prompt answered: nothing to say
    [notice] = sessions.save(SID, answered=True)
    assert (notice.code, notice.details) == (
        "session_not_saved",
        {"session_id": SID, "reason": "not_recorded"},
    )
    assert "~/.claude/projects" in notice.message
    assert not (tmp_path / "sessions" / "claude-agent-acp" / SID).exists()


def test_a_selection_escapes_the_session_id() -> None:
    sel = Selection(["{session}.jsonl"], "a.b")
    assert sel("a.b.jsonl", "file")
    assert not sel("axb.jsonl", "file")


def test_claude_layout_keeps_only_the_sessions_files(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, None, CLAUDE_FILES, "claude-agent-acp")
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    mount = sessions.prepare(job_dir, OWNER)
    assert mount.target == "/home/agent/.claude/projects"
    _write(
        mount.source,
        {
            f"-workspace/{SID}.jsonl": "turn 1",
            f"-workspace/{SID}/tool-results/out.txt": "long output",
            f"-workspace/{OTHER}.jsonl": "another session",
            "-workspace/memory/notes.md": "not the session's",
        },
    )
    assert sessions.save(SID) == []
    kept = tmp_path / "sessions" / "claude-agent-acp" / SID
    assert _tree(kept) == {
        "-workspace": "<dir>",
        f"-workspace/{SID}.jsonl": "turn 1",
        f"-workspace/{SID}": "<dir>",
        f"-workspace/{SID}/tool-results": "<dir>",
        f"-workspace/{SID}/tool-results/out.txt": "long output",
    }
    sessions.remove()
    resumed = _job_sessions(tmp_path, SID, CLAUDE_FILES, "claude-agent-acp")
    resumed.check()
    job2 = tmp_path / "work" / "job2"
    job2.mkdir()
    mount2 = resumed.prepare(job2, OWNER)
    assert _tree(mount2.source) == _tree(kept)


def test_codex_layout_keeps_the_dated_rollout_only(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, None, CODEX_FILES, "codex-acp")
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    mount = sessions.prepare(job_dir, OWNER)
    mine = f"2026/12/01/rollout-2026-12-01T16-27-15-{SID}.jsonl"
    _write(
        mount.source,
        {mine: "rollout", f"2026/12/01/rollout-2026-12-01T16-27-16-{OTHER}.jsonl": "other"},
    )
    assert sessions.save(SID) == []
    kept = tmp_path / "sessions" / "codex-acp" / SID
    assert {k for k, v in _tree(kept).items() if v != "<dir>"} == {mine}


def test_what_is_not_selected_is_never_entered_nor_counted(tmp_path: Path) -> None:
    sessions = _job_sessions(tmp_path, None, CLAUDE_FILES, "claude-agent-acp", session_max_files=5)
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    mount = sessions.prepare(job_dir, OWNER)
    _write(mount.source, {f"-workspace/{SID}.jsonl": "turn 1"})
    _write(mount.source, {f"junk/{i}/f": "x" for i in range(20)})  # over the entry bound
    (mount.source / "-workspace" / "loop").symlink_to(mount.source)
    assert sessions.save(SID) == []  # neither the junk nor the unselected link is seen
    assert (tmp_path / "sessions" / "claude-agent-acp" / SID / "-workspace").is_dir()


def test_a_recording_holding_nothing_of_the_declaration_is_not_found(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions", BIG)
    # A recording in the Cursor layout, resumed with claude's declaration.
    store.save("claude-agent-acp", SID, _session(tmp_path / "one"))
    resumed = _job_sessions(tmp_path, SID, CLAUDE_FILES, "claude-agent-acp")
    resumed.check()  # the recording exists …
    job_dir = tmp_path / "work" / "job"
    job_dir.mkdir(parents=True)
    with pytest.raises(SessionNotFound) as caught:  # … but holds none of its files
        resumed.prepare(job_dir, OWNER)
    assert caught.value.details["reason"] == "not_recorded"


def test_manifest_sessions_declaration() -> None:
    launch = _manifest()["launch"]
    declared = {"dir": ".codex/sessions", "keep": ["*/*/*/rollout-*-{session}.jsonl"]}
    ok = parse_manifest(_manifest(launch={**launch, "sessions": declared}), path="p")
    assert ok.launch.session_files == SessionFiles(**declared)  # type: ignore[arg-type]
    old = parse_manifest(
        _manifest(launch={**launch, "session_store": ".cursor/acp-sessions"}), path="p"
    )
    assert old.launch.session_files == CURSOR_FILES
    assert parse_manifest(_manifest(), path="p").launch.session_files is None
    bad_declarations: list[dict[str, Any]] = [
        {"dir": "../x", "keep": ["{session}"]},
        {"dir": "/abs", "keep": ["{session}"]},
        {"dir": ".c", "keep": []},
        {"dir": ".c", "keep": ["no-session-named"]},
        {"dir": ".c", "keep": ["../{session}"]},
        {"dir": ".c", "keep": ["./{session}"]},
        {"dir": ".c", "keep": ["**/{session}"]},
        {"dir": ".c", "keep": ["a//{session}"]},
        {"dir": ".c", "keep": ["/{session}"]},
        {"dir": ".c", "keep": ["{session}?"]},
        {"dir": ".c", "keep": ["/".join(["*"] * 9) + "/{session}"]},
        {"dir": ".c", "keep": ["{session}"], "more": 1},
    ]
    for bad in bad_declarations:
        with pytest.raises(InvalidInput):
            parse_manifest(_manifest(launch={**launch, "sessions": bad}), path="p")
    both = {**launch, "sessions": declared, "session_store": ".cursor/acp-sessions"}
    with pytest.raises(InvalidInput, match="exclusive"):
        parse_manifest(_manifest(launch=both), path="p")


def test_the_npm_packs_declare_their_session_files() -> None:
    from worker.packs.manifest import load_pack

    packs = Path(__file__).resolve().parents[2] / "provider_packs"
    claude = load_pack(packs, "claude-agent-acp").manifest.launch.session_files
    # Its CLI flushes the turn before it answers (CLAUDE_CODE_EAGER_FLUSH, in the pack's
    # env): nothing is recorded after the answer, so the teardown has nothing to wait for.
    assert claude == CLAUDE_FILES
    assert not claude.recorded_after_answer
    launch = load_pack(packs, "claude-agent-acp").manifest.launch
    assert launch.env["CLAUDE_CODE_EAGER_FLUSH"] == "1"
    assert load_pack(packs, "codex-acp").manifest.launch.session_files == CODEX_FILES
    assert load_pack(packs, "cursor-emulator").manifest.launch.session_files == CURSOR_FILES
