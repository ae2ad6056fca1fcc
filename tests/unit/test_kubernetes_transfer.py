"""What comes out of a sandbox pod is untrusted: the tar the backend extracts into the
host workspace, and the exec's final Status. Hostile archives are refused with
``SandboxError`` (or their special members skipped); links are kept as links."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from worker.errors import SandboxError
from worker.sandbox.kubernetes.stream import exit_code
from worker.sandbox.kubernetes.transfer import _replace


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, content in members:
            if content is not None:
                info.size = len(content)
            tar.addfile(info, None if content is None else io.BytesIO(content))
    data.seek(0)
    return data


def _file(name: str, content: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, content


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_the_pods_tree_replaces_the_hosts(tmp_path: Path) -> None:
    (tmp_path / "gone.txt").write_text("deleted in the pod")
    (tmp_path / "old").mkdir()
    archive = _tar(_file("./a/b.txt", b"new"), _link("./up", "/etc"), _file("./x", mode=0o4755))
    _replace(tmp_path, archive, None)
    assert sorted(os.listdir(tmp_path)) == ["a", "up", "x"]
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"new"
    assert os.readlink(tmp_path / "up") == "/etc"  # kept as the link it is
    assert (tmp_path / "x").stat().st_mode & 0o7000 == 0  # no set-id bit


def test_masked_host_entries_are_kept_and_the_rest_replaced(tmp_path: Path) -> None:
    """What a config mask covered never came out of the pod: the host's admitted file
    stays as it was, beside the rest of the pod's tree."""
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text("admitted")
    (tmp_path / ".claude" / "notes.md").write_text("deleted in the pod")
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text("kept whole")
    (tmp_path / "gone.txt").write_text("deleted in the pod")
    kept = [PurePosixPath(".claude/settings.json"), PurePosixPath(".codex")]
    _replace(tmp_path, _tar(_file("./.claude/new.md", b"new"), _file("./a.txt")), None, kept)
    assert sorted(os.listdir(tmp_path)) == [".claude", ".codex", "a.txt"]
    assert sorted(os.listdir(tmp_path / ".claude")) == ["new.md", "settings.json"]
    assert (tmp_path / ".claude" / "settings.json").read_text() == "admitted"
    assert (tmp_path / ".codex" / "config.toml").read_text() == "kept whole"


@pytest.mark.parametrize(
    "member",
    [
        _file("../escape.txt"),
        _link("./hard", "/etc/passwd", tarfile.LNKTYPE),
    ],
)
def test_a_member_outside_the_workspace_is_refused(
    tmp_path: Path, member: tuple[tarfile.TarInfo, bytes | None]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(SandboxError, match="refused"):
        _replace(ws, _tar(member), None)
    assert not (tmp_path / "escape.txt").exists()


def test_an_absolute_name_lands_inside_the_workspace(tmp_path: Path) -> None:
    ws, name = tmp_path / "ws", tmp_path / "outside.txt"
    ws.mkdir()
    _replace(ws, _tar(_file(str(name))), None)
    assert not name.exists()
    assert (ws / str(name).lstrip("/")).read_bytes() == b"x"


def test_nothing_is_written_through_a_link_out(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    with pytest.raises(SandboxError, match="refused"):
        _replace(ws, _tar(_link("./d", str(outside)), _file("./d/planted")), None)
    assert list(outside.iterdir()) == []


def test_devices_and_fifos_are_skipped(tmp_path: Path) -> None:
    fifo = tarfile.TarInfo("./pipe")
    fifo.type = tarfile.FIFOTYPE
    dev = tarfile.TarInfo("./null")
    dev.type, dev.devmajor, dev.devminor = tarfile.CHRTYPE, 1, 3
    _replace(tmp_path, _tar((fifo, None), (dev, None), _file("./kept")), None)
    assert os.listdir(tmp_path) == ["kept"]


def test_a_corrupt_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="refused"):
        _replace(tmp_path, io.BytesIO(b"\x01" * 1024), None)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b'{"status": "Success"}', 0),
        (
            json.dumps(
                {
                    "status": "Failure",
                    "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
                }
            ).encode(),
            3,
        ),
        # No Status: the stream was lost (never 137, never an OOM kill: the pod decides).
        (b"", None),
        (b"not json", None),
        (b"[1]", None),
        (
            json.dumps(
                {
                    "status": "Failure",
                    "details": {"causes": [{"reason": "ExitCode", "message": "x"}]},
                }
            ).encode(),
            None,
        ),
        (json.dumps({"status": "Failure", "details": {"causes": ["junk"]}}).encode(), None),
    ],
)
def test_an_exec_status_is_read_defensively(status: bytes, code: int | None) -> None:
    assert exit_code(status) == code
