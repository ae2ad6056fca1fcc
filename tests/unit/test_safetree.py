"""worker.safetree on a real (temporary) filesystem: each refusal and bound, one test each.

Every test names the check it holds: removing that check from the package makes it fail.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import os
import socket
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import worker.safetree
from worker.errors import ArchiveRefused
from worker.safetree import (
    EVERY_KIND,
    PLAIN,
    Bounds,
    Done,
    Found,
    OverBound,
    Skipped,
    Step,
    Tally,
    Walk,
    copy_file,
    extract_tar,
    kind_of,
    path_problem,
    remove_tree,
)


def _steps(root: Path, **options: object) -> list[Step]:
    with Walk(root, **options) as walk:  # type: ignore[arg-type]
        return list(walk)


def _each_found(root: Path, act: Callable[[Found, Walk], None], **options: object) -> None:
    """Walk ``root``, calling ``act`` on every entry kept (before the walk goes on)."""
    with Walk(root, **options) as walk:  # type: ignore[arg-type]
        for step in walk:
            if isinstance(step, Found):
                act(step, walk)


def _found(steps: list[Step]) -> list[str]:
    return [step.rel for step in steps if isinstance(step, Found)]


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    return outside


# -- kinds and the policy -------------------------------------------------------------------


def test_kinds_come_from_lstat(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    os.link(tmp_path / "f", tmp_path / "f2")
    (tmp_path / "plain").write_text("y")
    os.symlink("/etc", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
    kinds = {name: kind_of(os.lstat(tmp_path / name)) for name in os.listdir(tmp_path)}
    assert kinds == {
        "f": "hardlink",
        "f2": "hardlink",
        "plain": "file",
        "link": "symlink",
        "fifo": "fifo",
        "sock": "socket",
    }
    assert kind_of(os.lstat("/dev/null")) == "device"
    assert kind_of(os.lstat(tmp_path)) == "dir"


def test_the_policy_skips_what_it_does_not_keep_and_never_enters_it(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "keep.txt").write_text("k")
    (root / "to-dir").symlink_to(outside)
    os.mkfifo(root / "fifo")
    (root / "a").write_text("linked")
    os.link(root / "a", root / "b")
    steps = _steps(root, policy=PLAIN)
    assert _found(steps) == ["d", "d/keep.txt"]
    skipped = [(s.path, s.kind) for s in steps if isinstance(s, Skipped)]
    assert skipped == [
        ("a", "hardlink"),
        ("b", "hardlink"),
        ("fifo", "fifo"),
        ("to-dir", "symlink"),
    ]


def test_a_link_is_handed_over_as_a_link_never_followed(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    (root / "to-dir").symlink_to(outside)
    steps = _steps(root, policy=EVERY_KIND)
    assert _found(steps) == ["to-dir"]  # "to-dir/secret" is never listed
    found = next(s for s in steps if isinstance(s, Found))
    assert found.kind == "symlink"


def test_the_root_is_not_followed_unless_asked(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    (tmp_path / "link").symlink_to(outside)
    with pytest.raises(NotADirectoryError), Walk(tmp_path / "link", policy=PLAIN):
        pass
    assert _found(_steps(tmp_path / "link", policy=PLAIN, follow_root=True)) == ["secret"]


# -- the walk -------------------------------------------------------------------------------


def test_order_is_depth_first_sorted_with_each_directory_done_after_its_entries(
    tmp_path: Path,
) -> None:
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "a").write_text("1")
    (tmp_path / "b" / "z").write_text("2")
    steps = _steps(tmp_path, policy=PLAIN)
    shown = [(type(s).__name__, s.rel) for s in steps if isinstance(s, Found | Done)]
    assert shown == [
        ("Found", "a"),
        ("Found", "b"),
        ("Found", "b/c"),
        ("Done", "b/c"),
        ("Found", "b/z"),
        ("Done", "b"),
        ("Done", ""),
    ]
    depths = {s.rel: s.depth for s in steps if isinstance(s, Found)}
    assert depths == {"a": 1, "b": 1, "b/c": 2, "b/z": 2}


def test_a_walk_goes_past_path_max_holding_one_descriptor(tmp_path: Path) -> None:
    name = "n" * 250
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(20):  # 20 * 251 bytes: longer than PATH_MAX, no single call's path is
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as leaf:
        leaf.write("deep")
    os.close(fd)
    before = len(os.listdir("/proc/self/fd"))
    most = 0
    with Walk(tmp_path, policy=PLAIN) as walk:
        for step in walk:
            most = max(most, len(os.listdir("/proc/self/fd")) - before)
            last = step
    assert isinstance(last, Done)
    assert last.rel == ""
    assert most <= 1  # the current directory's descriptor, whatever the depth
    assert len(os.listdir("/proc/self/fd")) == before


def test_depth_is_bounded_before_the_deeper_directory_is_handed_over(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    met: list[str] = []
    with pytest.raises(OverBound) as caught:
        _each_found(tmp_path, lambda found, _: met.append(found.rel), policy=PLAIN,
                    bounds=Bounds(max_depth=2))  # fmt: skip
    assert (caught.value.what, caught.value.limit) == ("levels of directories", 2)
    assert met == ["a", "a/b"]
    assert _found(_steps(tmp_path, policy=PLAIN, bounds=Bounds(max_depth=3))) == [
        "a",
        "a/b",
        "a/b/c",
    ]


def test_entries_are_bounded_counting_the_root(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name)
    os.mkfifo(tmp_path / "fifo")  # skipped entries do not count
    assert len(_found(_steps(tmp_path, policy=PLAIN, bounds=Bounds(max_entries=4)))) == 3
    with pytest.raises(OverBound, match="more than 3 entries"):
        _steps(tmp_path, policy=PLAIN, bounds=Bounds(max_entries=3))
    with pytest.raises(OverBound):
        Walk(tmp_path, policy=PLAIN, bounds=Bounds(max_entries=0)).__enter__()


def test_a_file_past_the_byte_bound_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x" * 60)
    (tmp_path / "b").write_text("x" * 60)

    def copy(found: Found, walk: Walk) -> None:
        copy_file(found, tmp_path / f"{found.name}.copy", tally=walk.tally)

    with pytest.raises(OverBound, match="more than 100 bytes"):
        _each_found(tmp_path, copy, policy=PLAIN, bounds=Bounds(max_bytes=100))
    assert (tmp_path / "a.copy").exists()
    assert not (tmp_path / "b.copy").exists()  # refused before it was made


def test_bytes_are_counted_as_read_too(tmp_path: Path) -> None:
    (tmp_path / "big").write_text("x" * 5000)
    with Walk(tmp_path, policy=PLAIN) as walk:
        found = next(s for s in walk if isinstance(s, Found))
        # a file that grew since the listing: only the count as read can stop it
        with pytest.raises(OverBound, match="bytes"):
            copy_file(found, tmp_path / "copy", tally=Tally(Bounds(max_bytes=4096)))


def test_a_directory_swapped_after_the_listing_stops_the_walk(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")

    def swap(found: Found, _walk: Walk) -> None:
        if found.rel == "a":
            (tmp_path / "a").rename(tmp_path / "elsewhere")
            (tmp_path / "a").mkdir()  # same name, another directory

    with pytest.raises(OSError, match="swapped"):
        _each_found(tmp_path, swap, policy=PLAIN, changed="swapped")


def test_a_directory_swapped_for_a_link_is_not_entered(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)

    def swap(found: Found, _walk: Walk) -> None:
        if found.rel == "a":
            (root / "a").rmdir()
            (root / "a").symlink_to(outside)

    with pytest.raises(NotADirectoryError):  # O_NOFOLLOW, before any identity check
        _each_found(root, swap, policy=PLAIN)


def test_a_directory_moved_while_inside_it_stops_the_climb(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "other").mkdir()

    def move(found: Found, _walk: Walk) -> None:
        if found.rel == "a/f":
            (tmp_path / "a").rename(tmp_path / "other" / "a")  # ".." is now "other"

    with pytest.raises(OSError, match="moved"):
        _each_found(tmp_path, move, policy=PLAIN, changed="moved")


# -- copies ---------------------------------------------------------------------------------


def _one(root: Path) -> Iterator[tuple[Found, Walk]]:
    with Walk(root, policy=EVERY_KIND) as walk:
        for step in walk:
            if isinstance(step, Found):
                yield step, walk


def test_a_copy_drops_set_id_bits_and_hashes_what_it_wrote(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o4755)
    for found, walk in _one(src):
        digest = copy_file(found, tmp_path / "copy", tally=walk.tally, digest=True)
    assert (tmp_path / "copy").stat().st_mode & 0o7777 == 0o755
    assert digest == hashlib.sha256(b"#!/bin/sh\n").hexdigest()


def test_a_copy_never_writes_through_a_planted_link_or_over_a_file(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("agent bytes")
    (tmp_path / "planted").symlink_to(outside / "secret")
    (tmp_path / "existing").write_text("mine")
    for found, walk in _one(src):
        with pytest.raises(FileExistsError):
            copy_file(found, tmp_path / "planted", tally=walk.tally)
        with pytest.raises(FileExistsError):
            copy_file(found, tmp_path / "existing", tally=walk.tally)
    assert (outside / "secret").read_text() == "host secret"
    assert (tmp_path / "existing").read_text() == "mine"


def test_a_file_swapped_for_another_after_the_listing_is_not_copied(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("listed")
    for found, walk in _one(src):
        (src / "g").write_text("swapped in")  # made while "f" lives: another inode
        (src / "g").replace(src / "f")
        with pytest.raises(OSError, match="changed while it was copied"):
            copy_file(found, tmp_path / "copy", tally=walk.tally)


# -- extraction -----------------------------------------------------------------------------


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    out.seek(0)
    return out


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _extract(dest: Path, archive: io.BytesIO, **bounds: int) -> list[tuple[str, int]]:
    dest.mkdir(exist_ok=True)
    written = extract_tar(
        archive, dest, compressed=False, bounds=Bounds(**bounds), file_mode=lambda m: m & 0o755
    )
    return [(w.path, w.mode) for w in written]


def test_extraction_writes_files_and_their_parents(tmp_path: Path) -> None:
    archive = _tar((_member("./a//b/c.txt", mode=0o775), b"hi"), (_member("d.txt"), b""))
    assert _extract(tmp_path, archive) == [("a/b/c.txt", 0o755), ("d.txt", 0o644)]
    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "hi"
    assert (tmp_path / "a" / "b" / "c.txt").stat().st_mode & 0o7777 == 0o755


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (_member("/etc/passwd"), "absolute path"),
        (_member("a/../../escape"), "'..' component"),
        (_member("../escape"), "'..' component"),
        (_member("link", tarfile.SYMTYPE, linkname="/etc"), "symbolic link"),
        (_member("hard", tarfile.LNKTYPE, linkname="a"), "hard link"),
        (_member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3), "device file"),
        (_member("blk", tarfile.BLKTYPE), "device file"),
        (_member("fifo", tarfile.FIFOTYPE), "FIFO"),
        (_member("bad\nname"), "control character in name"),
        (_member("suid", mode=0o4755), "setuid bit set"),
        (_member("sgid", mode=0o2755), "setgid bit set"),
        (_member("sticky-dir", tarfile.DIRTYPE, mode=0o1777), "sticky bit set"),
        (_member("both", mode=0o6755), "setuid and setgid bit set"),
    ],
)
def test_extraction_refuses_unsafe_members(
    tmp_path: Path, member: tarfile.TarInfo, reason: str
) -> None:
    with pytest.raises(ArchiveRefused) as caught:
        _extract(tmp_path, _tar((member, b"x")))
    assert caught.value.details["reason"] == reason
    assert os.listdir(tmp_path) == []


def test_extraction_never_follows_a_link_already_in_the_destination(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "d").symlink_to(outside)
    (dest / "f").symlink_to(outside / "secret")
    with pytest.raises(ArchiveRefused, match="would overwrite existing path 'd'"):
        _extract(dest, _tar((_member("d/new"), b"x")))
    with pytest.raises(ArchiveRefused, match="would overwrite an existing path"):
        _extract(dest, _tar((_member("f"), b"x")))
    (dest / "plain").write_text("mine")
    with pytest.raises(ArchiveRefused, match="would overwrite an existing path"):
        _extract(dest, _tar((_member("plain"), b"theirs")))
    assert (dest / "plain").read_text() == "mine"
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_text() == "host secret"


def _extract_links(dest: Path, archive: io.BytesIO) -> list[str]:
    dest.mkdir(exist_ok=True)
    written = extract_tar(
        archive, dest, compressed=False, bounds=Bounds(), file_mode=lambda m: m, symlinks=True
    )
    return [w.path for w in written]


def test_links_asked_for_are_made_as_links_and_nothing_goes_through_them(
    tmp_path: Path,
) -> None:
    outside = _outside(tmp_path)
    dest = tmp_path / "dest"
    archive = _tar(
        (_member("d", tarfile.DIRTYPE, mode=0o755), b""),
        (_member("d/to-etc", tarfile.SYMTYPE, linkname=str(outside)), b""),
        (_member("rel", tarfile.SYMTYPE, linkname="d/f"), b""),
        (_member("d/f"), b"data"),
    )
    assert _extract_links(dest, archive) == ["d/f"]  # links are not files written
    assert os.readlink(dest / "d" / "to-etc") == str(outside)  # kept as text
    assert os.readlink(dest / "rel") == "d/f"
    below = _tar(
        (_member("l", tarfile.SYMTYPE, linkname=str(outside)), b""), (_member("l/x"), b"x")
    )
    with pytest.raises(ArchiveRefused, match="parent 'l' is a file"):
        _extract_links(tmp_path / "below", below)
    twice = _tar(
        (_member("l", tarfile.SYMTYPE, linkname="a"), b""),
        (_member("l", tarfile.SYMTYPE, linkname="b"), b""),
    )
    with pytest.raises(ArchiveRefused, match="duplicate entry"):
        _extract_links(tmp_path / "twice", twice)
    (tmp_path / "over").mkdir()
    (tmp_path / "over" / "l").write_text("mine")
    with pytest.raises(ArchiveRefused, match="would overwrite existing path 'l'"):
        _extract_links(tmp_path / "over", _tar((_member("l", tarfile.SYMTYPE, linkname="x"), b"")))
    assert (tmp_path / "over" / "l").read_text() == "mine"
    with pytest.raises(ArchiveRefused, match="invalid target"):
        _extract_links(tmp_path / "empty", _tar((_member("l", tarfile.SYMTYPE, linkname=""), b"")))
    hard = _tar((_member("h", tarfile.LNKTYPE, linkname="d/f"), b""))
    with pytest.raises(ArchiveRefused, match="hard link"):  # still refused
        _extract_links(tmp_path / "hard", hard)
    assert sorted(os.listdir(outside)) == ["secret"]


def test_extraction_refuses_duplicates_and_a_file_as_a_parent(tmp_path: Path) -> None:
    with pytest.raises(ArchiveRefused, match="duplicate entry"):
        _extract(tmp_path / "1", _tar((_member("a"), b"1"), (_member("a"), b"2")))
    with pytest.raises(ArchiveRefused, match="parent 'a' is a file"):
        _extract(tmp_path / "2", _tar((_member("a"), b"1"), (_member("a/b"), b"2")))


def test_extraction_bounds_entries_and_bytes(tmp_path: Path) -> None:
    three = [(_member(name), b"x" * 40) for name in ("a", "b", "c")]
    with pytest.raises(ArchiveRefused, match="more than 2 entries"):
        _extract(tmp_path / "1", _tar(*three), max_entries=2)
    with pytest.raises(ArchiveRefused, match="expands beyond 100 bytes"):
        _extract(tmp_path / "2", _tar(*three), max_bytes=100)
    assert not (tmp_path / "2" / "c").exists()  # refused from its header, before its data


def test_a_corrupt_archive_is_refused(tmp_path: Path) -> None:
    data = _tar((_member("a"), b"x" * 2000)).getvalue()
    with pytest.raises(ArchiveRefused, match="corrupt archive"):
        _extract(tmp_path / "1", io.BytesIO(data[:700]))


def test_member_names_share_the_lock_files_path_check() -> None:
    assert path_problem("a/b") is None
    assert path_problem("a/./b") == "empty or '.' component"
    assert path_problem("x" * 256) == "component longer than 255 bytes"


# -- removal --------------------------------------------------------------------------------


def _as_nobody(box: Path, action: Callable[[], None]) -> None:
    """Run ``action`` in ``box`` as an unprivileged user: root passes every permission
    check, so a locked directory only locks for someone else."""
    if os.geteuid() != 0:
        os.chdir(box)
        action()
        return
    for path in (box, *box.rglob("*")):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            os.chdir(box)
            os.setgid(65534)
            os.setuid(65534)
            action()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


def test_removal_follows_no_link_and_enters_locked_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = _outside(tmp_path)
    monkeypatch.chdir(tmp_path)
    box = tmp_path / "box"
    root = box / "tree"
    (root / "d" / "locked").mkdir(parents=True)
    (root / "d" / "locked" / "f").write_text("x")
    (root / "d" / "to-dir").symlink_to(outside)
    (root / "to-file").symlink_to(outside / "secret")
    os.mkfifo(root / "fifo")
    (root / "d" / "locked").chmod(0)
    (root / "d").chmod(0o500)
    _as_nobody(box, lambda: remove_tree(Path("tree")))
    assert not root.exists()
    assert (outside / "secret").read_text() == "host secret"
    remove_tree(root)  # missing is fine
    (tmp_path / "file").write_text("x")
    remove_tree(tmp_path / "file")
    assert not (tmp_path / "file").exists()


def _after_first(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    then: Callable[[], None],
    when: Callable[..., bool] = lambda *args, **kwargs: True,
) -> None:
    """Run ``then`` (another remover: a reaper racing a job's teardown) once, right after
    the first call of ``os.<name>`` that ``when`` picks has done its work."""
    real = getattr(os, name)

    def racing(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)
        if when(*args, **kwargs):
            monkeypatch.setattr(os, name, real)
            then()
        return result

    monkeypatch.setattr(os, name, racing)


def _tree(root: Path) -> Path:
    for rel in ("a/f", "b/c/g", "b/h", "z"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    return root


def test_removal_succeeds_when_someone_else_removes_the_root_before_its_last_rmdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "tree")
    (root / "z").unlink()
    # Our walk empties "b" last; the other remover then takes the (empty) root.
    _after_first(
        monkeypatch,
        "rmdir",
        lambda: remove_tree(root),
        lambda path, **kw: path == "b" and kw.get("dir_fd") is not None,
    )
    remove_tree(root)
    assert not root.exists()


def test_removal_succeeds_when_entries_vanish_during_its_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other remover takes everything after our first unlink: the walk then meets
    listed files, a listed directory (to open and enter) and emptied directories (to
    rmdir) that are gone, and the root itself."""
    root = _tree(tmp_path / "tree")
    _after_first(monkeypatch, "unlink", lambda: remove_tree(root))
    remove_tree(root)
    assert not root.exists()


def test_removal_passes_over_an_entry_that_vanishes_before_it_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "tree")
    real = os.scandir

    def listing(fd: int) -> Iterator[os.DirEntry[str]]:  # lists "b/h", which goes next
        with real(fd) as entries:
            for entry in entries:
                if entry.name == "h":
                    os.unlink("h", dir_fd=fd)
                yield entry

    @contextlib.contextmanager
    def scandir(fd: int) -> Iterator[Iterator[os.DirEntry[str]]]:
        yield listing(fd)

    monkeypatch.setattr(os, "scandir", scandir)
    remove_tree(root)
    assert not root.exists()
    # Any other walk still stops there: only a removal takes a vanished entry as done.
    _tree(root)
    with pytest.raises(FileNotFoundError):
        _steps(root, policy=EVERY_KIND)


def test_a_racing_removal_still_follows_no_link_and_refuses_a_swapped_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = _outside(tmp_path)
    root = _tree(tmp_path / "tree")
    (root / "b" / "to-dir").symlink_to(outside)

    def swap() -> None:  # "b" removed and made again while the walk is in "a"
        os.rename(root / "b", tmp_path / "b-moved")
        (root / "b").mkdir()
        (root / "b" / "keep").write_text("x")

    _after_first(monkeypatch, "unlink", swap)
    with pytest.raises(OSError, match="changed while it was being removed"):
        remove_tree(root)
    assert (root / "b" / "keep").exists()
    assert (outside / "secret").read_text() == "host secret"
    assert (tmp_path / "b-moved" / "to-dir").is_symlink()


# -- layering -------------------------------------------------------------------------------


def test_safetree_is_a_bottom_layer() -> None:
    """Only the standard library, worker.errors and itself: every layer may use it."""
    package = Path(worker.safetree.__file__).parent
    imported: set[str] = set()
    for module in package.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    ours = {name for name in imported if name.split(".")[0] == "worker"}
    assert {name for name in ours if not name.startswith("worker.safetree.")} <= {"worker.errors"}
    others = {name.split(".")[0] for name in imported - ours} - {"__future__"}
    assert others <= sys.stdlib_module_names
