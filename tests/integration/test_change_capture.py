"""Change capture against real trees: exact statuses, and a patch `git apply` accepts,
built within its bounds of size and time, and saying what it left out."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.integration.test_run_job import _check_stream, _env, _events, _job, run_cli
from worker.workspace.capture import compare, snapshot
from worker.workspace.changes import Captured, capture, event_data, incomplete_notice, write_patch
from worker.workspace.patch import Omission, PatchLimits, build_patch, git_refuses
from worker.workspace.stage import StagedWorkspace, stage_local

OWNER = (os.getuid(), os.getgid())


def _apply(
    tmp_path: Path, source: Path, patch: Path, staged: StagedWorkspace, omitted: Iterable[str] = ()
) -> None:
    """`git apply` the patch to a fresh copy of ``source``; with the omitted files copied
    over from the workspace, the copy equals the workspace."""
    check = tmp_path / "check"
    shutil.copytree(source, check, symlinks=True)
    shutil.rmtree(check / ".git", ignore_errors=True)
    subprocess.run(["git", "init", "-q", str(check)], check=True)
    apply = ["git", "-C", str(check), "apply", "--allow-empty", "--whitespace=nowarn", str(patch)]
    subprocess.run(apply, check=True)
    for path in omitted:
        shutil.copyfile(staged.path / path, check / path)
    want = snapshot(staged.path)
    got = {k: v for k, v in snapshot(check).items() if k in want or not k.startswith(".git")}
    assert got == want


def _staged(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, StagedWorkspace]:
    source = tmp_path / "source"
    source.mkdir()
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    return source, stage_local(source, tmp_path / "ws", owner=OWNER)


def _written(tmp_path: Path, captured: Captured, max_paths: int = 100) -> dict[str, Any]:
    ref = write_patch(captured.patch, tmp_path / "out" / "changes.patch")
    return event_data(captured, ref, max_paths=max_paths)


def _tree(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "keep.py").write_text("a = 1\n")
    (root / "src" / "edit.py").write_text("line 1\nline 2\nline 3\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / "noeol.txt").write_text("no newline")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")


def _agent_edits(ws: Path) -> None:
    (ws / "src" / "edit.py").write_text("line 1\nline two\nline 3\nline 4\n")
    (ws / "gone.txt").unlink()
    (ws / "tool.sh").chmod(0o755)
    (ws / "new dir").mkdir()
    (ws / "new dir" / "added.md").write_text("# new\n")
    (ws / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    (ws / "noeol.txt").write_text("no newline, still")
    os.symlink("/etc/passwd", ws / "passwd")
    (ws / "big.dat").write_bytes(os.urandom(2 * 1024 * 1024))
    (ws / ".git" / "HEAD").write_text("tampered\n")  # not part of the capture


def test_capture_reports_exactly_what_changed_and_the_patch_applies(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _tree(source)
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    _agent_edits(staged.path)
    captured = capture(staged, limits=PatchLimits(file_bytes=1024 * 1024))
    status = {c.path: c.status for c in captured.changes}
    assert status == {
        "src/edit.py": "modified",
        "gone.txt": "deleted",
        "tool.sh": "mode_changed",
        "new dir": "added",
        "new dir/added.md": "added",
        "blob.bin": "modified",
        "noeol.txt": "modified",
        "passwd": "added",
        "big.dat": "added",
    }
    assert captured.patch.omitted == (Omission("big.dat", "too_large"),)
    ref = write_patch(captured.patch, tmp_path / "out" / "changes.patch")
    data = event_data(captured, ref, max_paths=100)
    assert data["counts"] == {
        "added": 4,
        "modified": 3,
        "deleted": 1,
        "mode_changed": 1,
        "type_changed": 0,
    }
    link = next(p for p in data["paths"] if p["path"] == "passwd")
    assert link == {
        "path": "passwd",
        "status": "added",
        "kind": "link",
        "mode": "0777",
        "target": "/etc/passwd",
        "in_patch": True,
    }
    big = next(p for p in data["paths"] if p["path"] == "big.dat")
    assert big["size"] == 2 * 1024 * 1024
    assert big["sha256"] == hashlib.sha256((staged.path / "big.dat").read_bytes()).hexdigest()
    assert big["in_patch"] is False
    assert big["omitted_reason"] == "too_large"
    assert data["patch"]["complete"] is False
    assert data["patch"]["omitted"] == ["big.dat"]
    assert data["patch"]["omitted_reasons"] == {"too_large": 1}
    # A deleted path says what it was: size, digest, mode (the baseline knows them).
    gone = next(p for p in data["paths"] if p["path"] == "gone.txt")
    assert gone == {
        "path": "gone.txt",
        "status": "deleted",
        "kind": "file",
        "old_mode": "0644",
        "old_size": 4,
        "old_sha256": hashlib.sha256(b"bye\n").hexdigest(),
        "in_patch": True,
    }
    # Apply the patch to a fresh copy of the source with git; the result equals the workspace.
    _apply(tmp_path, source, Path(ref["path"]), staged, omitted=["big.dat"])


def test_no_changes_gives_an_empty_patch(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _tree(source)
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    captured = capture(staged, limits=PatchLimits(file_bytes=1024))
    assert captured.changes == ()
    assert captured.patch.text == b""


def test_path_list_is_bounded_with_counts(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    staged = stage_local(source, tmp_path / "ws", owner=OWNER)
    for i in range(30):
        (staged.path / f"f{i:02}.txt").write_text(str(i))
    data = event_data(capture(staged, limits=PatchLimits(file_bytes=1024)), None, max_paths=10)
    assert data["total"] == 30
    assert data["truncated"] is True
    assert len(data["paths"]) == 10
    assert data["counts"]["added"] == 30


def test_a_rewritten_megabyte_is_captured_in_moments(tmp_path: Path) -> None:
    """800 KB of short lines, every other one rewritten: difflib took ~114 s here."""
    lines = [f"{i:06d} original xxx\n" for i in range(40_000)]
    source, staged = _staged(tmp_path, {"big.txt": "".join(lines).encode()})
    rewritten = [line.replace("original", "REWRITES") if i % 2 == 0 else line
                 for i, line in enumerate(lines)]  # fmt: skip
    (staged.path / "big.txt").write_text("".join(rewritten))
    start = time.monotonic()
    captured = capture(staged, limits=PatchLimits())
    assert time.monotonic() - start < 10
    assert captured.patch.complete
    assert captured.patch.text.count(b"\n-0") == captured.patch.text.count(b"\n+0") == 20_000
    data = _written(tmp_path, captured)
    assert data["patch"]["complete"] is True
    assert incomplete_notice(captured) is None
    _apply(tmp_path, source, Path(data["patch"]["path"]), staged)


def test_every_line_separator_and_end_applies(tmp_path: Path) -> None:
    """A lone CR, U+2028 and a form feed are inside a line for git (difflib's splitlines
    split there, and `git apply` refused the patch)."""
    files = {
        "cr.txt": "one\rtwo\r\nthree\u2028four\x0cfive\n".encode(),
        "noeol.txt": b"a\nb",
        "gains-eol.txt": b"x",
        "empty-later.txt": b"some\n",
        "crlf.txt": b"a\r\nb\r\n",
    }
    source, staged = _staged(tmp_path, files)
    ws = staged.path
    (ws / "cr.txt").write_bytes("one\rTWO\r\nthree\u2028four\x0cfive\nsix".encode())
    (ws / "noeol.txt").write_bytes(b"a\nB")
    (ws / "gains-eol.txt").write_bytes(b"x\n")
    (ws / "empty-later.txt").write_bytes(b"")
    (ws / "crlf.txt").write_bytes(b"a\r\nB\r\n")
    (ws / "new-empty.txt").write_bytes(b"")
    captured = capture(staged, limits=PatchLimits())
    assert captured.patch.complete
    _apply(tmp_path, source, Path(_written(tmp_path, captured)["patch"]["path"]), staged)


def test_many_files_of_every_kind_across_batches(tmp_path: Path) -> None:
    """More files than one git run takes; text, binary, links, type changes, modes."""
    files = {f"t/{i:04}.txt": f"line {i}\n".encode() * 5 for i in range(700)}
    files |= {f"bin/{i:02}.bin": bytes([i]) * 300 + b"\0" for i in range(20)}
    files |= {"becomes-link": b"file\n", "becomes-dir": b"file\n", "exec.sh": b"#!/bin/sh\n"}
    source, staged = _staged(tmp_path, files)
    os.symlink("t/0001.txt", source / "link-becomes-file")
    staged = stage_local(source, tmp_path / "ws2", owner=OWNER)
    ws = staged.path
    for i in range(0, 700, 2):
        (ws / f"t/{i:04}.txt").write_text(f"line {i}\n" * 4 + "changed\n")
    for i in range(20):
        (ws / f"bin/{i:02}.bin").write_bytes(bytes([255 - i]) * 200 + b"\0")
    (ws / "becomes-link").unlink()
    os.symlink("exec.sh", ws / "becomes-link")
    (ws / "becomes-dir").unlink()
    (ws / "becomes-dir").mkdir()
    (ws / "becomes-dir" / "inside.txt").write_text("inside\n")
    (ws / "link-becomes-file").unlink()
    (ws / "link-becomes-file").write_text("now a file\n")
    (ws / "exec.sh").chmod(0o755)
    (ws / "t" / "0001.txt").unlink()
    captured = capture(staged, limits=PatchLimits())
    assert captured.patch.complete, captured.patch.omitted
    assert len(captured.changes) == 350 + 20 + 5 + 1  # + becomes-dir/inside.txt
    _apply(tmp_path, source, Path(_written(tmp_path, captured)["patch"]["path"]), staged)


def test_a_patch_over_its_bound_lists_what_it_left_out(tmp_path: Path) -> None:
    source, staged = _staged(tmp_path, {"keep.txt": b"k\n"})
    for i in range(10):
        (staged.path / f"f{i}.txt").write_text(f"{i} " * 5000 + "\n")  # ~10 KB each
    captured = capture(staged, limits=PatchLimits(patch_bytes=35_000))
    assert len(captured.patch.text) <= 35_000
    assert [o.path for o in captured.patch.omitted] == [f"f{i}.txt" for i in range(3, 10)]
    assert {o.reason for o in captured.patch.omitted} == {"patch_full"}
    data = _written(tmp_path, captured, max_paths=5)
    patch = data["patch"]
    assert patch["complete"] is False
    assert patch["omitted"] == ["f3.txt", "f4.txt", "f5.txt", "f6.txt", "f7.txt"]  # bounded
    assert (patch["omitted_total"], patch["omitted_reasons"]) == (7, {"patch_full": 7})
    f3 = next(p for p in data["paths"] if p["path"] == "f3.txt")
    assert f3["in_patch"] is False
    assert f3["omitted_reason"] == "patch_full"
    assert f3["size"] == (staged.path / "f3.txt").stat().st_size
    assert f3["sha256"] == hashlib.sha256((staged.path / "f3.txt").read_bytes()).hexdigest()
    notice = incomplete_notice(captured)
    assert notice is not None
    assert (notice.level, notice.code) == ("warning", "patch_incomplete")
    assert notice.details is not None
    assert notice.details["reasons"] == {"patch_full": 7}
    assert notice.details["omitted_total"] == 7
    assert notice.details["patch_bytes"] == 35_000
    omitted = [f"f{i}.txt" for i in range(3, 10)]
    _apply(tmp_path, source, Path(patch["path"]), staged, omitted=omitted)


def test_capture_stops_at_its_time_budget_and_says_so(tmp_path: Path) -> None:
    """Files git needs seconds for (1 MiB of random short lines each), a 0.5 s budget:
    capture returns about then, every file left out is listed, and a notice says why."""
    rng = random.Random(7)

    def noise() -> bytes:
        return "".join(f"{rng.randrange(1000)}\n" for _ in range(200_000)).encode()[:1_000_000]

    names = [f"noise{i}.txt" for i in range(4)]
    source, staged = _staged(tmp_path, {name: noise() for name in names})
    for name in names:
        (staged.path / name).write_bytes(noise())
    (staged.path / "z.bin").write_bytes(b"\0" * 100)
    start = time.monotonic()
    captured = capture(staged, limits=PatchLimits(time_s=0.5))
    assert time.monotonic() - start < 2.5
    reasons = {o.path: o.reason for o in captured.patch.omitted}
    assert set(reasons) == {*names, "z.bin"}
    assert set(reasons.values()) == {"time_budget"}
    notice = incomplete_notice(captured)
    assert notice is not None
    assert "ran out of its 0.5 s budget" in notice.message
    assert notice.details is not None
    assert notice.details["reasons"] == {"time_budget": 5}
    data = _written(tmp_path, captured)
    assert data["patch"]["complete"] is False
    assert data["patch"]["omitted_reasons"] == {"time_budget": 5}
    _apply(tmp_path, source, Path(data["patch"]["path"]), staged, omitted=[*names, "z.bin"])


def test_no_budget_left_after_the_walk_inlines_nothing(tmp_path: Path) -> None:
    _, staged = _staged(tmp_path, {"a.txt": b"a\n"})
    (staged.path / "a.txt").write_text("b\n")
    captured = capture(staged, limits=PatchLimits(time_s=1e-9))
    assert captured.patch.text == b""
    assert captured.patch.omitted == (Omission("a.txt", "time_budget"),)


def test_git_ignores_any_repository_around_its_scratch_directory(tmp_path: Path) -> None:
    """Scratch space inside a repository whose config would change git's output (no
    prefixes) or run a program (an external diff): neither applies, and nothing of the
    scratch space is left behind."""
    repo = tmp_path / "repo"
    (repo / "tmp").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    marker = tmp_path / "external-diff-ran"
    for key, value in (("diff.noprefix", "true"), ("diff.external", f"touch {marker}")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    source, staged = _staged(tmp_path, {"a.txt": b"one\n"})
    (staged.path / "a.txt").write_text("two\n")
    (staged.path / ".gitattributes").write_text("* diff=evil -text\n")
    changes = compare(staged.before, snapshot(staged.path, staged.before))
    patch = build_patch(
        changes, source=source, workspace=staged.path, limits=PatchLimits(), scratch=repo / "tmp"
    )
    assert patch.complete
    assert b"-one\n+two\n" in patch.text
    assert not marker.exists()
    assert list((repo / "tmp").iterdir()) == []
    (tmp_path / "changes.patch").write_bytes(patch.text)
    _apply(tmp_path, source, tmp_path / "changes.patch", staged)


def test_a_job_past_its_capture_budget_says_so(tmp_path: Path) -> None:
    """`acp-worker run` with ACPW_CAPTURE_TIMEOUT_S too short for anything: the change
    list stays exact, the patch is marked incomplete, and a notice says why."""
    job = _job(tmp_path, "#!scenario\nwrite a.txt changed\n")
    env = _env(tmp_path, ACPW_CAPTURE_TIMEOUT_S="0.000001")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert [(p["path"], p["status"]) for p in changed["paths"]] == [("a.txt", "added")]
    assert changed["patch"]["complete"] is False
    assert changed["patch"]["omitted_reasons"] == {"time_budget": 1}
    assert Path(changed["patch"]["path"]).read_bytes() == b""
    [notice] = [e["data"] for e in events if e["type"] == "notice"
                and e["data"]["code"] == "patch_incomplete"]  # fmt: skip
    assert notice["level"] == "warning"
    assert "ran out of its 1e-06 s budget" in notice["message"]


def test_names_git_quotes_and_names_not_utf8_apply(tmp_path: Path) -> None:
    names = ["tab\there.txt", "new\nline.txt", 'quote".txt', "back\\slash.txt", "ünï.txt",
             os.fsdecode(b"not-utf8-\xff.txt"), "sp ace.txt"]  # fmt: skip
    source, staged = _staged(tmp_path, dict.fromkeys(names, b"old\n"))
    (source / "mode\tonly.sh").write_text("#!/bin/sh\n")
    staged = stage_local(source, tmp_path / "ws2", owner=OWNER)
    for name in names:
        (staged.path / name).write_text("new\n")
    (staged.path / "mode\tonly.sh").chmod(0o755)
    (staged.path / "empty\t.txt").write_bytes(b"")
    captured = capture(staged, limits=PatchLimits())
    assert captured.patch.complete
    assert len(captured.changes) == len(names) + 2
    assert b'diff --git "a/tab\\there.txt" "b/tab\\there.txt"\n' in captured.patch.text
    _apply(tmp_path, source, Path(_written(tmp_path, captured)["patch"]["path"]), staged)


def test_a_job_that_writes_names_not_utf8_completes(tmp_path: Path) -> None:
    """A file name and a link target that are not UTF-8 (an event is UTF-8 JSON): shown
    with \\xNN escapes and said so; the patch carries the real bytes. This run used to end
    without job.completed."""
    script = (
        "#!scenario\n"
        'exec sh -c \'echo hi > "$(printf "x\\377")" && ln -s "$(printf "t\\376")" l\'\n'
    )
    result = run_cli(tmp_path, "run", str(_job(tmp_path, script)), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    by_path = {p["path"]: p for p in changed["paths"]}
    assert by_path["x\\xff"]["path_escaped"] is True
    assert (by_path["l"]["target"], by_path["l"]["target_escaped"]) == ("t\\xfe", True)
    assert "path_escaped" not in by_path["l"]
    patch = Path(changed["patch"]["path"]).read_bytes()
    assert b"+++ b/x\xff\n" in patch


def test_a_mode_change_is_in_the_patch_whatever_the_files_size(tmp_path: Path) -> None:
    big = os.urandom(3 * 1024 * 1024)  # over the inline bound below, twice over
    source, staged = _staged(tmp_path, {"big.bin": big, "run.sh": b"#!/bin/sh\n"})
    (staged.path / "big.bin").chmod(0o755)
    (staged.path / "run.sh").chmod(0o755)
    captured = capture(staged, limits=PatchLimits(file_bytes=1024 * 1024))
    assert {c.path: c.status for c in captured.changes} == {
        "big.bin": "mode_changed",
        "run.sh": "mode_changed",
    }
    assert captured.patch.omitted == ()
    assert b"diff --git a/big.bin b/big.bin\nold mode 100644\nnew mode 100755\n" in (
        captured.patch.text
    )
    data = _written(tmp_path, captured)
    assert data["patch"]["complete"] is True
    assert all(entry["in_patch"] for entry in data["paths"])
    _apply(tmp_path, source, tmp_path / "out" / "changes.patch", staged)


def _applied(tmp_path: Path, source: Path, patch: Path) -> Path:
    """A fresh copy of ``source`` with the patch `git apply`-ed (refused: an error)."""
    check = tmp_path / "applied"
    shutil.copytree(source, check, symlinks=True)
    subprocess.run(["git", "init", "-q", str(check)], check=True)
    apply = ["git", "-C", str(check), "apply", "--allow-empty", "--whitespace=nowarn", str(patch)]
    subprocess.run(apply, check=True)
    return check


def _reasons(data: dict[str, Any]) -> dict[str, tuple[bool, str | None]]:
    return {p["path"]: (p["in_patch"], p.get("omitted_reason")) for p in data["paths"]
            if "in_patch" in p}  # fmt: skip


def test_permissions_git_cannot_say_are_left_out_and_the_rest_applies(tmp_path: Path) -> None:
    """git has two file modes: 0644 to 0600 (or 0755 to 0700) alone is left out with its
    reason (a bare `diff --git` line made git refuse the whole patch); with a content
    change the content goes in, with the git mode unchanged."""
    files = {"README.md": b"read me\n", "tool.sh": b"#!/bin/sh\n", "edit.txt": b"old\n"}
    source, staged = _staged(tmp_path, files)
    (source / "tool.sh").chmod(0o755)
    staged = stage_local(source, tmp_path / "ws2", owner=OWNER)
    ws = staged.path
    (ws / "README.md").chmod(0o600)
    (ws / "tool.sh").chmod(0o700)
    (ws / "edit.txt").write_text("new\n")
    (ws / "edit.txt").chmod(0o600)
    (ws / "notes.txt").write_text("hello\n")
    captured = capture(staged, limits=PatchLimits())
    assert captured.patch.omitted == (
        Omission("README.md", "not_representable"),
        Omission("tool.sh", "not_representable"),
    )
    assert b"README.md" not in captured.patch.text
    assert b"tool.sh" not in captured.patch.text
    index = b"3367afdbbf91e638efe983616377c60477cc6612..3e757656cf36eca53338e520d134963a44f793f8"
    assert b"\nindex " + index + b" 100644\n" in captured.patch.text  # edit.txt, as 100644
    data = _written(tmp_path, captured)
    assert _reasons(data) == {
        "README.md": (False, "not_representable"),
        "tool.sh": (False, "not_representable"),
        "edit.txt": (True, None),
        "notes.txt": (True, None),
    }
    assert (data["patch"]["complete"], data["patch"]["omitted_reasons"]) == (
        False,
        {"not_representable": 2},
    )
    applied = _applied(tmp_path, source, Path(data["patch"]["path"]))
    assert (applied / "edit.txt").read_text() == "new\n"
    assert (applied / "notes.txt").read_text() == "hello\n"


def test_a_permission_change_alone_gives_an_empty_patch_that_says_so(tmp_path: Path) -> None:
    _, staged = _staged(tmp_path, {"README.md": b"read me\n"})
    (staged.path / "README.md").chmod(0o600)
    captured = capture(staged, limits=PatchLimits())
    assert captured.patch.text == b""
    assert captured.patch.omitted == (Omission("README.md", "not_representable"),)


def test_paths_git_refuses_are_left_out_and_the_rest_applies(tmp_path: Path) -> None:
    """The agent's own repository in a subdirectory, `.GIT`, `git~1`, a `.gitmodules`
    link: `git apply` refused the whole patch for any one of them."""
    source, staged = _staged(tmp_path, {"keep.txt": b"k\n", "vendor/lib/lib.c": b"int x;\n"})
    ws = staged.path
    git = ["git", "-c", "init.defaultBranch=main", "init", "-q", str(ws / "vendor/lib")]
    subprocess.run(git, check=True, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})
    (ws / ".GIT").mkdir()
    (ws / ".GIT" / "x").write_text("x\n")
    (ws / "sub" / "git~1").mkdir(parents=True)
    (ws / "sub" / "git~1" / "y").write_text("y\n")
    os.symlink("keep.txt", ws / ".gitmodules")
    os.symlink("keep.txt", ws / "link.txt")
    (ws / ".gitmodules-not").write_text("fine\n")
    (ws / "vendor/lib/lib.c").write_text("int y;\n")
    captured = capture(staged, limits=PatchLimits())
    refused = {c.path for c in captured.changes if c.after and c.after.kind != "dir"}
    refused -= {"link.txt", ".gitmodules-not", "vendor/lib/lib.c"}
    assert "vendor/lib/.git/HEAD" in refused
    assert captured.patch.omitted == tuple(Omission(p, "git_path") for p in sorted(refused))
    assert b".git/" not in captured.patch.text.lower()
    data = _written(tmp_path, captured)
    shown = _reasons(data)
    assert {p for p, (kept, _) in shown.items() if not kept} == refused
    assert {shown[p][1] for p in refused} == {"git_path"}
    assert data["patch"]["omitted_reasons"] == {"git_path": len(refused)}
    applied = _applied(tmp_path, source, Path(data["patch"]["path"]))
    assert (applied / "vendor/lib/lib.c").read_text() == "int y;\n"
    assert os.readlink(applied / "link.txt") == "keep.txt"
    assert (applied / ".gitmodules-not").read_text() == "fine\n"
    assert not (applied / ".GIT").exists()


def test_a_file_replaced_by_a_fifo_is_deleted_in_the_patch(tmp_path: Path) -> None:
    """The patch deletes the file (it used to leave it, saying complete); the FIFO, and
    one added beside, are left out as git cannot say them."""
    source, staged = _staged(tmp_path, {"pipe": b"was a file\n", "b.txt": b"b\n"})
    ws = staged.path
    (ws / "pipe").unlink()
    os.mkfifo(ws / "pipe")
    os.mkfifo(ws / "new-pipe")
    (ws / "b.txt").write_text("B\n")
    captured = capture(staged, limits=PatchLimits())
    statuses = {c.path: c.status for c in captured.changes}
    assert statuses == {"pipe": "type_changed", "new-pipe": "added", "b.txt": "modified"}
    assert captured.patch.omitted == (
        Omission("new-pipe", "not_representable"),
        Omission("pipe", "not_representable"),
    )
    assert b"diff --git a/pipe b/pipe\ndeleted file mode 100644\n" in captured.patch.text
    data = _written(tmp_path, captured)
    assert (data["patch"]["complete"], data["patch"]["omitted_reasons"]) == (
        False,
        {"not_representable": 2},
    )
    entries = {e["path"]: e for e in data["paths"]}
    for fifo in ("pipe", "new-pipe"):  # listed as left out, like any file
        assert (entries[fifo]["in_patch"], entries[fifo]["omitted_reason"]) == (
            False,
            "not_representable",
        )
    applied = _applied(tmp_path, source, Path(data["patch"]["path"]))
    assert not (applied / "pipe").exists()
    assert (applied / "b.txt").read_text() == "B\n"


def test_a_large_file_replaced_by_a_fifo_is_listed_once(tmp_path: Path) -> None:
    _, staged = _staged(tmp_path, {"pipe": b"x" * 5000})
    (staged.path / "pipe").unlink()
    os.mkfifo(staged.path / "pipe")
    captured = capture(staged, limits=PatchLimits(file_bytes=1000))
    assert captured.patch.omitted == (Omission("pipe", "not_representable"),)
    assert captured.patch.text == b""


GIT_NAMES = [
    ".git/x", ".GIT/x", ".Git", "a/.git/HEAD", "a/.git", "GIT~1/x", "git~1", "git~2/x",
    ".git./x", ".git /x", ".git. . /x", ".git:x", ".git::$INDEX_ALLOCATION/x", "a\\.git/x",
    "a\\.git", "a/.git\\x", ".gitx", ".git~1", "x.git/y", "a.git", ".git\u200c/x",
    ".g\u200cit/x", ".gi\ufefft", ".gitmodules", ".GITMODULES", "a/.gitmodules",
    "gitmod~1", "gitmod~5", "GITMOD~4 .", "gi7eba~1", "gi7eb~9", "gi7eb~91", "~1234567",
    ".gitmodules .", ".gitmodules:x", ".gitmodules\u200c", ".gitmodulesx", "a\\.gitmodules",
    "sub/.gitmodules/x", "sub/.gitmodules ./x", ".gitattributes", ".gitignore", "ok.txt",
]  # fmt: skip


def test_git_refuses_says_what_git_apply_refuses(tmp_path: Path) -> None:
    """Our verify_path against git's, with its NTFS and HFS+ protections on."""
    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True)
    git = ["git", "-c", "core.protectNTFS=true", "-c", "core.protectHFS=true"]
    for link in (False, True):
        for name in GIT_NAMES:
            mode = "120000" if link else "100644"
            patch = (f"diff --git a/{name} b/{name}\nnew file mode {mode}\n--- /dev/null\n"
                     f"+++ b/{name}\n@@ -0,0 +1 @@\n+x\n")  # fmt: skip
            check = [*git, "-C", str(tmp_path / "r"), "apply", "--check", "-"]
            done = subprocess.run(check, input=patch.encode(), capture_output=True, check=False)
            assert git_refuses(name, link=link) == (done.returncode != 0), (name, link)


def test_a_job_whose_changes_git_cannot_all_say_gives_a_patch_that_applies(
    tmp_path: Path,
) -> None:
    """The audit's job: `chmod 600` beside a new file made `git apply` refuse the whole
    patch ("bad git-diff"); so did the agent's own `git init` in a subdirectory."""
    script = (
        "#!scenario\n"
        "exec chmod 600 README.md && mkdir -p vendor/lib && git init -q vendor/lib "
        "&& mkfifo pipe\n"
        "write notes.txt hello\n"
    )
    result = run_cli(tmp_path, "run", str(_job(tmp_path, script)), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    reasons = _reasons(changed)
    assert reasons["README.md"] == (False, "not_representable")
    assert reasons["notes.txt"] == (True, None)
    in_git = [p for p in reasons if p.startswith("vendor/lib/.git/")]
    assert in_git
    assert {reasons[p] for p in in_git} == {(False, "git_path")}
    patch = changed["patch"]
    assert patch["complete"] is False
    assert patch["omitted_reasons"] == {"git_path": len(in_git), "not_representable": 2}
    source = tmp_path / "pristine"
    source.mkdir()
    (source / "README.md").write_text("# hello\n")
    applied = _applied(tmp_path, source, Path(patch["path"]))
    assert (applied / "notes.txt").read_text().startswith("hello")
