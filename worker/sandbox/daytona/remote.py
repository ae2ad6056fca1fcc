"""One path of a Daytona sandbox, through the SDK's file API: its kind and a bounded read.

The toolbox reports a path's kind as Go's ``os.FileMode`` string (``-rw-r--r--``,
``drwxr-xr-x``, ``Lrwxrwxrwx``): the letters before the nine permission characters are
its type. A symbolic link is recognised only if the daemon describes the entry itself
(``lstat``), which is what the double does; against the real daemon this is checked by
``make test-daytona`` (``tests/integration/test_daytona_live.py``), not here.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from worker.admission.probe import Kind
from worker.errors import SandboxError
from worker.sandbox.daytona.api import Api


class Box(Protocol):
    """What the file helpers use of a ``DaytonaSandbox`` (its API access and the SDK's
    sandbox), without importing the backend."""

    api: Api
    remote: Any


#: Type letters (Go's ``dalTLDpSugct?``, or ``-`` for none), then the nine permission bits.
_MODE = re.compile(r"[-dalTLDpSugct?]{1,13}[-r][-w][-xsStT][-r][-w][-xsStT][-r][-w][-xtT]")
#: Type letters of a regular file's mode (setuid, setgid, sticky: still a regular file).
_REGULAR = frozenset("-ugt")


#: Type letters of other kinds, in Go's order of precedence.
_OTHERS = (("p", Kind.FIFO), ("S", Kind.SOCKET), ("c", Kind.CHAR_DEVICE), ("D", Kind.BLOCK_DEVICE))


def kind_of(info: object) -> Kind:
    """The kind of a ``FileInfo`` from the toolbox (never trusted to be well formed)."""
    mode = str(getattr(info, "mode", "") or "")
    if not _MODE.fullmatch(mode):
        return Kind.OTHER
    prefix = mode[:-9]
    is_dir = getattr(info, "is_dir", None)
    if "L" in prefix:
        return Kind.SYMLINK
    if "d" in prefix and is_dir is True:
        return Kind.DIR
    if prefix and set(prefix) <= _REGULAR and is_dir is False:
        return Kind.FILE
    return next((kind for letter, kind in _OTHERS if letter in prefix), Kind.OTHER)


def size_of(info: object) -> int:
    size = getattr(info, "size", 0)
    return size if isinstance(size, int) and size >= 0 else 0


async def stat(sandbox: Box, remote: str) -> Any | None:
    """The toolbox's ``FileInfo`` of ``remote``, ``None`` when it does not exist.

    Raises:
        SandboxError: Daytona failed otherwise.
    """
    fs = sandbox.remote.fs
    try:
        return await sandbox.api.call("file info", lambda: fs.get_file_info(remote))
    except SandboxError as exc:
        if exc.details.get("status") == 404:
            return None
        raise


async def read_bounded(sandbox: Box, remote: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``remote`` (one more than ``limit`` tells the caller
    it is larger); the stream is abandoned there, never read to its end.

    Raises:
        SandboxError: Daytona failed (a missing file included).
    """
    fs = sandbox.remote.fs

    async def read() -> bytes:
        data = bytearray()
        stream = await fs.download_file_stream(remote)
        try:
            async for chunk in stream:
                data += chunk
                if len(data) > limit:
                    break
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        return bytes(data[: limit + 1])

    return await sandbox.api.call("read file", read)
