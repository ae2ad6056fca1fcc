"""The verified record of a closure (worker/packs/verified.py): an unchanged closure is not
re-hashed before a launch, and any change to it, or any doubt about the record, is.

Whether hashing ran is counted (the bytes ``hash_file`` read), never timed. The closures
here are built moments before they are verified, so ``RACY_NS`` is lowered to 10 ms and
each closure is left alone for 30 ms before its first verification: a change after the
record still moves ctime past what it records (kernel timestamps tick in at most 10 ms).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from worker.errors import DigestMismatch
from worker.packs import verified, verify
from worker.packs import watch as watched
from worker.packs.closure import ClosureLock, FileEntry
from worker.packs.verified import Recheck
from worker.packs.verify import VerifyStats, verify_closure

FILES = {"a.js": b"alpha\n", "bin/x": b"#!/bin/sh\necho x\n", "lib/deep/y.js": b"why\n"}
SANDBOX_UID = 61000


@pytest.fixture(autouse=True)
def _short_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified, "RACY_NS", 10_000_000)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the files hashed, in order."""
    sizes: list[int] = []
    real = verify.hash_file

    def counting(path: Path) -> str:
        sizes.append(path.lstat().st_size)
        return real(path)

    monkeypatch.setattr(verify, "hash_file", counting)
    return sizes


def _closure(root: Path) -> tuple[Path, ClosureLock]:
    closure = root / "closures" / "c"
    entries = []
    for rel, data in FILES.items():
        path = closure / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        mode = "0755" if rel.startswith("bin/") else "0644"
        entries.append(FileEntry(rel, mode, len(data), hashlib.sha256(data).hexdigest()))
    _seal(closure)
    lock = ClosureLock.build(pack="p", platform="any", archive_sha256="a" * 64, files=entries)
    time.sleep(0.03)  # older than the racy window
    return closure, lock


def _seal(closure: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(closure, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o555 if "bin" in dirpath else 0o444)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)


def _recheck(tmp_path: Path, **overrides: object) -> Recheck:
    fields: dict[str, object] = {
        "records": tmp_path / "verified",
        "max_age_s": 3600.0,
        "sandbox_uids": (SANDBOX_UID,),
    }
    fields.update(overrides)
    return Recheck(**fields)  # type: ignore[arg-type]


def _verified(tmp_path: Path) -> tuple[Path, ClosureLock, Recheck]:
    """A closure verified in full once, with its record written."""
    closure, lock = _closure(tmp_path)
    recheck = _recheck(tmp_path)
    stats = verify_closure(closure, lock, recheck=recheck)
    assert stats.hashed_bytes == lock.total_bytes
    assert _record(recheck, lock).is_file()
    return closure, lock, recheck


def _record(recheck: Recheck, lock: ClosureLock) -> Path:
    return recheck.records / f"{lock.closure_digest.removeprefix('sha256:')}.json"


def _again(closure: Path, lock: ClosureLock, recheck: Recheck) -> VerifyStats:
    time.sleep(0.015)  # a change just made is outside the racy window of the next record
    return verify_closure(closure, lock, recheck=recheck)


def _rewrite(path: Path, data: bytes) -> None:
    """New content, same size, with mtime and mode put back as they were."""
    before = path.lstat()
    os.chmod(path, 0o644)
    with path.open("r+b") as out:
        out.write(data)
    os.chmod(path, before.st_mode & 0o7777)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.lstat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_an_unchanged_closure_is_not_hashed_again(tmp_path: Path, hashed: list[int]) -> None:
    closure, lock, recheck = _verified(tmp_path)
    assert sum(hashed) == lock.total_bytes
    hashed.clear()
    for _ in range(3):
        stats = verify_closure(closure, lock, recheck=recheck)
        assert stats.hashed_bytes == 0
    assert hashed == []


def test_changed_content_with_mtime_put_back_is_found(tmp_path: Path, hashed: list[int]) -> None:
    closure, lock, recheck = _verified(tmp_path)
    _rewrite(closure / "a.js", b"ALPHA\n")
    hashed.clear()
    with pytest.raises(DigestMismatch, match="sha256 differs"):
        _again(closure, lock, recheck)
    assert hashed  # the change was found by hashing: the record did not stand for it
    assert not _record(recheck, lock).exists()  # and it is gone with the closure's trust


def test_content_changed_and_changed_back_is_hashed_again(
    tmp_path: Path, hashed: list[int]
) -> None:
    """ctime tells a change even when content, size and mtime are back as they were."""
    closure, lock, recheck = _verified(tmp_path)
    _rewrite(closure / "a.js", b"ALPHA\n")
    _rewrite(closure / "a.js", b"alpha\n")
    hashed.clear()
    assert _again(closure, lock, recheck).hashed_bytes == lock.total_bytes
    assert sum(hashed) == lock.total_bytes
    hashed.clear()
    assert _again(closure, lock, recheck).hashed_bytes == 0  # recorded again
    assert hashed == []


def test_an_added_file_is_refused(tmp_path: Path) -> None:
    closure, lock, recheck = _verified(tmp_path)
    os.chmod(closure / "lib", 0o755)
    (closure / "lib" / "extra.js").write_bytes(b"x")
    os.chmod(closure / "lib" / "extra.js", 0o444)
    os.chmod(closure / "lib", 0o555)
    with pytest.raises(DigestMismatch, match="unexpected file"):
        _again(closure, lock, recheck)


def test_a_file_added_and_removed_again_is_hashed_again(tmp_path: Path) -> None:
    closure, lock, recheck = _verified(tmp_path)
    os.chmod(closure / "lib", 0o755)
    (closure / "lib" / "extra.js").write_bytes(b"x")
    (closure / "lib" / "extra.js").unlink()
    os.chmod(closure / "lib", 0o555)
    assert _again(closure, lock, recheck).hashed_bytes == lock.total_bytes


def test_a_removed_file_is_refused(tmp_path: Path) -> None:
    closure, lock, recheck = _verified(tmp_path)
    os.chmod(closure / "lib" / "deep", 0o755)
    (closure / "lib" / "deep" / "y.js").unlink()
    os.chmod(closure / "lib" / "deep", 0o555)
    with pytest.raises(DigestMismatch, match="missing file"):
        _again(closure, lock, recheck)


def test_a_changed_mode_is_hashed_again(tmp_path: Path) -> None:
    """0444 → 0400 is still a read-only 0644 to the lock; the record sees it."""
    closure, lock, recheck = _verified(tmp_path)
    os.chmod(closure / "a.js", 0o400)
    assert _again(closure, lock, recheck).hashed_bytes == lock.total_bytes


def test_a_file_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    closure, lock, recheck = _verified(tmp_path)
    elsewhere = tmp_path / "y.js"
    elsewhere.write_bytes(FILES["lib/deep/y.js"])
    os.chmod(closure / "lib" / "deep", 0o755)
    (closure / "lib" / "deep" / "y.js").unlink()
    (closure / "lib" / "deep" / "y.js").symlink_to(elsewhere)
    os.chmod(closure / "lib" / "deep", 0o555)
    with pytest.raises(DigestMismatch, match="unexpected symbolic link"):
        _again(closure, lock, recheck)


def test_a_directory_swapped_for_a_copy_is_hashed_again(tmp_path: Path) -> None:
    """Same names, sizes, modes and mtimes (copy2), other inodes: not the verified files."""
    closure, lock, recheck = _verified(tmp_path)
    os.chmod(closure, 0o755)
    shutil.copytree(closure / "lib", tmp_path / "lib-copy", copy_function=shutil.copy2)
    os.chmod(closure / "lib", 0o755)
    os.chmod(closure / "lib" / "deep", 0o755)
    shutil.rmtree(closure / "lib")
    os.rename(tmp_path / "lib-copy", closure / "lib")
    os.chmod(closure, 0o555)
    assert _again(closure, lock, recheck).hashed_bytes == lock.total_bytes


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"{not json",
        b"[]",
        b'{"v": 1}',
        b'{"v": 2, "closure": "x", "root": "x", "verified_at": 1.0, "entries": 1, "identity": "x"}',
    ],
)
def test_a_corrupt_record_means_a_full_rehash(tmp_path: Path, damage: bytes) -> None:
    closure, lock, recheck = _verified(tmp_path)
    _record(recheck, lock).write_bytes(damage)
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == 0  # rewritten


def _edit(record: Path, **changes: object) -> None:
    data = json.loads(record.read_text())
    data.update(changes)
    record.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "changes",
    [
        {"identity": "0" * 64},
        {"entries": 1},
        {"closure": "sha256:" + "0" * 64},
        {"root": "/elsewhere"},
        {"verified_at": time.time() + 3600},  # from the future
        {"verified_at": time.time() - 7200},  # older than max_age_s
    ],
)
def test_a_record_that_does_not_fit_means_a_full_rehash(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    closure, lock, recheck = _verified(tmp_path)
    _edit(_record(recheck, lock), **changes)
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes


def _untrusted_record(tmp_path: Path, how: str) -> tuple[Path, ClosureLock, Recheck]:
    closure, lock, recheck = _verified(tmp_path)
    record = _record(recheck, lock)
    if how == "other_owner":
        os.chown(record, SANDBOX_UID, SANDBOX_UID)
    elif how == "group_writable":
        os.chmod(record, 0o620)
    elif how == "world_writable_dir":
        os.chmod(recheck.records, 0o777)
    elif how == "dir_of_other_owner":
        os.chown(recheck.records, SANDBOX_UID, SANDBOX_UID)
    elif how == "symlink":
        target = tmp_path / "record.json"
        record.rename(target)
        record.symlink_to(target)
    elif how == "hard_link":
        os.link(record, tmp_path / "another-name.json")
    return closure, lock, recheck


@pytest.mark.parametrize(
    "how",
    [
        "other_owner",
        "group_writable",
        "world_writable_dir",
        "dir_of_other_owner",
        "symlink",
        "hard_link",
    ],
)
def test_a_record_the_worker_may_not_have_written_is_not_trusted(tmp_path: Path, how: str) -> None:
    if os.geteuid() != 0 and how in {"other_owner", "dir_of_other_owner"}:
        pytest.skip("chown needs root")
    closure, lock, recheck = _untrusted_record(tmp_path, how)
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes


def test_no_record_when_sandboxes_run_as_the_worker(tmp_path: Path) -> None:
    closure, lock = _closure(tmp_path)
    recheck = _recheck(tmp_path, sandbox_uids=(os.geteuid(),))
    for _ in range(2):
        assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes
    assert not recheck.records.exists()


def test_a_zero_rehash_interval_rehashes_every_time(tmp_path: Path) -> None:
    closure, lock = _closure(tmp_path)
    recheck = _recheck(tmp_path, max_age_s=0.0)
    for _ in range(2):
        assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes


def test_no_record_for_a_scan_racing_recent_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file changed within the racy window of the scan could change again unseen."""
    closure, lock = _closure(tmp_path)
    monkeypatch.setattr(verified, "RACY_NS", 3_600 * 10**9)
    recheck = _recheck(tmp_path)
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes
    assert not _record(recheck, lock).exists()
    assert verify_closure(closure, lock, recheck=recheck).hashed_bytes == lock.total_bytes


def test_without_recheck_every_file_is_hashed(tmp_path: Path) -> None:
    closure, lock, _ = _verified(tmp_path)
    assert verify_closure(closure, lock).hashed_bytes == lock.total_bytes


def test_the_cache_touching_the_closure_keeps_its_record(tmp_path: Path) -> None:
    """``materialize`` touches the closure directory on every use (gc's LRU order)."""
    closure, lock, recheck = _verified(tmp_path)
    os.utime(closure)
    assert _again(closure, lock, recheck).hashed_bytes == 0


def test_unchanged_answers_from_the_record_alone(tmp_path: Path, hashed: list[int]) -> None:
    """``unchanged`` (a launch's check before it reads the lock): stats from the record
    when nothing changed; None (verify in full) for any change, another digest, no
    closure, or records that cannot be used."""
    closure, lock, recheck = _verified(tmp_path)
    hashed.clear()
    digest, files, size = lock.closure_digest, len(lock.files), lock.total_bytes
    stats = verify.unchanged(closure, digest, files, size, recheck)
    assert stats is not None
    assert (stats.files, stats.bytes, stats.hashed_bytes, hashed) == (files, size, 0, [])
    assert verify.unchanged(closure, "sha256:" + "0" * 64, files, size, recheck) is None
    assert verify.unchanged(tmp_path / "absent", digest, files, size, recheck) is None
    unusable = _recheck(tmp_path, sandbox_uids=(os.geteuid(),))
    assert verify.unchanged(closure, digest, files, size, unusable) is None
    time.sleep(0.015)
    _rewrite(closure / "a.js", b"ALPHA\n")
    assert verify.unchanged(closure, digest, files, size, recheck) is None
    with pytest.raises(DigestMismatch):
        verify_closure(closure, lock, recheck=recheck)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The closures scanned, in order."""
    calls: list[Path] = []
    real = verify._scan

    def counting(root: Path, watch: watched.Watch | None = None) -> verified.Identities:
        calls.append(root)
        return real(root, watch)

    monkeypatch.setattr(verify, "_scan", counting)
    return calls


def _unchanged(closure: Path, lock: ClosureLock, recheck: Recheck) -> VerifyStats | None:
    digest, files, size = lock.closure_digest, len(lock.files), lock.total_bytes
    return verify.unchanged(closure, digest, files, size, recheck)


def test_a_watched_closure_is_not_scanned_again(tmp_path: Path, scans: list[Path]) -> None:
    """The first check scans, watching each directory; later ones in this process read
    the watch instead, the cache's touch of the closure directory included."""
    closure, lock, recheck = _verified(tmp_path)
    scans.clear()
    assert _unchanged(closure, lock, recheck) is not None
    assert scans == [closure]
    for _ in range(3):
        os.utime(closure)  # materialize's least-recent-use touch
        assert _unchanged(closure, lock, recheck) is not None
    assert scans == [closure]


def _add_and_remove(closure: Path) -> None:
    folder = closure / "lib" / "deep"
    os.chmod(folder, 0o755)
    (folder / "extra.js").write_bytes(b"")
    (folder / "extra.js").unlink()
    os.chmod(folder, 0o555)


def _rename_and_back(closure: Path) -> None:
    os.chmod(closure / "lib", 0o755)
    os.rename(closure / "lib" / "deep", closure / "lib" / "deeper")
    os.rename(closure / "lib" / "deeper", closure / "lib" / "deep")
    os.chmod(closure / "lib", 0o555)


CHANGES = {
    "content, mtime put back": lambda c: _rewrite(c / "lib" / "deep" / "y.js", b"WHY\n"),
    "content changed and changed back": lambda c: (
        _rewrite(c / "a.js", b"ALPHA\n"),
        _rewrite(c / "a.js", b"alpha\n"),
    ),
    "mode": lambda c: os.chmod(c / "bin" / "x", 0o444),
    "a file added and removed": _add_and_remove,
    "a directory renamed and back": _rename_and_back,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_to_a_watched_closure_is_scanned_for(
    tmp_path: Path, scans: list[Path], change: str
) -> None:
    closure, lock, recheck = _verified(tmp_path)
    assert _unchanged(closure, lock, recheck) is not None
    time.sleep(0.015)
    CHANGES[change](closure)
    scans.clear()
    assert _unchanged(closure, lock, recheck) is None  # verify in full
    assert scans == [closure]


def test_a_watched_closure_still_needs_its_record(tmp_path: Path, scans: list[Path]) -> None:
    """A record another process dropped (it found the closure changed), or one grown
    older than ``pack_rehash_s``, is not stood in for by the watch."""
    closure, lock, recheck = _verified(tmp_path)
    assert _unchanged(closure, lock, recheck) is not None
    verified.forget(recheck, lock.closure_digest)
    assert _unchanged(closure, lock, recheck) is None
    closure, lock, recheck = _verified(tmp_path / "again")
    assert _unchanged(closure, lock, recheck) is not None
    assert _unchanged(closure, lock, _recheck(tmp_path / "again", max_age_s=1e-9)) is None


def test_a_fork_does_not_read_its_parents_watch(tmp_path: Path, scans: list[Path]) -> None:
    """A forked pool process shares the parent's inotify instance: reading it would take
    the parent's events, so the child scans (and watches) for itself."""
    closure, lock, recheck = _verified(tmp_path)
    assert _unchanged(closure, lock, recheck) is not None
    scans.clear()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's verdict is its exit status
        ok = _unchanged(closure, lock, recheck) is not None and scans == [closure]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _unchanged(closure, lock, recheck) is not None  # the parent's watch still stands
    assert scans == []


def test_without_inotify_every_check_scans(
    tmp_path: Path, scans: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watched, "_LIBC", None)
    closure, lock, recheck = _verified(tmp_path)
    scans.clear()
    for _ in range(2):
        assert _unchanged(closure, lock, recheck) is not None
    assert scans == [closure, closure]


def test_a_closure_that_cannot_be_watched_whole_is_scanned_and_not_tried_again(
    tmp_path: Path, scans: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the per-user watch limit a directory's watch is refused: the check still
    answers from its scan, and later checks scan without adding watches again."""
    closure, lock, recheck = _verified(tmp_path)
    monkeypatch.setattr(watched, "WATCHES", watched.Watches())
    monkeypatch.setattr(verify, "WATCHES", watched.WATCHES)
    added: list[str] = []
    real_add = watched.Watch.add

    def limited(self: watched.Watch, directory: str) -> int:
        added.append(directory)
        if len(added) > 2:  # the root and one directory, then the limit
            self.broken = True
            return -1
        return real_add(self, directory)

    monkeypatch.setattr(watched.Watch, "add", limited)
    scans.clear()
    assert _unchanged(closure, lock, recheck) is not None
    tried = len(added)
    for _ in range(2):
        assert _unchanged(closure, lock, recheck) is not None
    assert scans == [closure] * 3
    assert len(added) == tried  # given up after the first
