"""The kind of a path from the Daytona toolbox's file info (Go ``os.FileMode`` strings),
which the daytona backend's file access and admission view trust for no more than this."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.admission.probe import Kind
from worker.sandbox.daytona.remote import kind_of, size_of


@pytest.mark.parametrize(
    ("mode", "is_dir", "kind"),
    [
        ("-rw-r--r--", False, Kind.FILE),
        ("urwxr-xr-x", False, Kind.FILE),  # setuid: still a regular file
        ("drwxr-xr-x", True, Kind.DIR),
        ("dtrwxrwxrwx", True, Kind.DIR),  # sticky directory
        ("Lrwxrwxrwx", False, Kind.SYMLINK),
        ("Lrwxrwxrwx", True, Kind.SYMLINK),  # a link is a link whatever is_dir says
        ("prw-r--r--", False, Kind.FIFO),
        ("Srwxr-xr-x", False, Kind.SOCKET),
        ("Dcrw-rw-rw-", False, Kind.CHAR_DEVICE),
        ("Drw-rw----", False, Kind.BLOCK_DEVICE),
        ("-rw-r--r--", True, Kind.OTHER),  # contradicts itself: not trusted as a file
        ("drwxr-xr-x", False, Kind.OTHER),
        ("", False, Kind.OTHER),
        ("garbage", False, Kind.OTHER),
    ],
)
def test_kind_of_a_toolbox_mode(mode: str, is_dir: bool, kind: Kind) -> None:
    assert kind_of(SimpleNamespace(mode=mode, is_dir=is_dir)) is kind


def test_a_malformed_answer_is_no_regular_file_and_no_size() -> None:
    assert kind_of(SimpleNamespace()) is Kind.OTHER
    assert kind_of(SimpleNamespace(mode=None, is_dir="yes")) is Kind.OTHER
    assert size_of(SimpleNamespace(size=-5)) == 0
    assert size_of(SimpleNamespace(size="12")) == 0
    assert size_of(SimpleNamespace(size=12)) == 12
