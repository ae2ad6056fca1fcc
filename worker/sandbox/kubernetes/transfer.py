"""Trees into and out of a sandbox pod: tar over exec (the pod binds no host path).

``put_tree`` streams a host directory as a tar archive to ``tar -x`` in the pod;
``get_tree`` reads ``tar -c`` of a pod directory, bounded in bytes, and replaces a host
directory's contents with it. The archive is spooled next to that directory (on the
worker's state volume, never in its ``/tmp``), and every chunk is counted as it arrives
against the worker's ``DiskBudget`` (all its copy-outs together): one that would pass it
is refused (``WorkerDiskExceeded``) before the worker's own volume fills, which would
get the worker pod evicted with every job on it. What comes out of the pod is untrusted: members are
extracted with the ``data`` filter (no absolute path, nothing outside the directory, no
device, no set-id bit, no owner taken from the archive), except that a symbolic link
pointing anywhere is kept as the link it is (the agent may make one, as it may in a bind
mount); a later member reached *through* such a link is still refused. FIFOs and devices
are skipped.

With config masks (``worker.admission.mask_plan``) mounted over the pod's workspace,
nothing is copied in over a mask (those members are left out of the archive, and tar
keeps an existing directory's metadata, so an anchor's mount point is only written
into), nothing is copied out of one (``tar --exclude``), and the host entries at masked
paths are kept as they were.

Nothing waits for stdin's EOF, which a server that negotiated ``v4.channel.k8s.io``
cannot send: the archive goes to the pod in length-prefixed frames (``UNFRAME`` reads
them up to an empty frame and gives tar the EOF itself). Every exec has a deadline
(``drain``), and pings while it runs.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from websocket import WebSocketException

from worker.admission import MaskEntry, MaskKind
from worker.errors import SandboxError, WorkerDiskExceeded
from worker.sandbox.kubernetes.stream import ERROR, STDERR, STDIN, STDOUT, exit_code

if TYPE_CHECKING:
    from worker.sandbox.kubernetes.api import PodApi

CHUNK = 256 * 1024
_STDERR_KEPT = 4096
#: Runs in the pod: reads stdin as frames (8-byte big-endian length, then the bytes) and
#: feeds them to ``argv[1:]``'s stdin until an empty frame, then closes it: the program's
#: EOF without stdin's. Input that ends before the empty frame kills the program (exit 3).
UNFRAME = (
    "import subprocess,sys\n"
    "i=sys.stdin.buffer\n"
    "p=subprocess.Popen(sys.argv[1:],stdin=subprocess.PIPE)\n"
    "ok=False\n"
    "try:\n"
    " while 1:\n"
    "  h=i.read(8)\n"
    "  if len(h)!=8: break\n"
    "  n=int.from_bytes(h,'big')\n"
    "  if not n:\n"
    "   ok=True; break\n"
    "  d=i.read(n)\n"
    "  if len(d)!=n: break\n"
    "  p.stdin.write(d)\n"
    "except BrokenPipeError: pass\n"
    "if not ok: p.kill()\n"
    "try: p.stdin.close()\n"
    "except BrokenPipeError: pass\n"
    "r=p.wait()\n"
    "sys.exit(r if ok else 3)\n"
)


class DiskBudget:
    """The bytes the copy-outs of one worker may hold on its disk at once (all jobs'
    together): each takes what arrives, and gives it back once its spool is gone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Count ``size`` more bytes.

        Raises:
            WorkerDiskExceeded: they would pass ``limit`` (nothing is counted then).
        """
        with self._lock:
            if self.used + size > self.limit:
                raise WorkerDiskExceeded(
                    "what the sandbox pod sends back would pass the worker's disk bound",
                    bound=self.limit,
                    in_use=self.used,
                    setting="ACPW_K8S_COPY_OUT_MAX_BYTES",
                )
            self.used += size

    def give(self, size: int) -> None:
        with self._lock:
            self.used = max(0, self.used - size)


class _Counted:
    """A spool file whose writes are first taken from a ``DiskBudget``."""

    def __init__(self, spool: Any, budget: DiskBudget) -> None:
        self._spool, self._budget = spool, budget
        self.taken = 0

    def write(self, data: bytes) -> int:
        self._budget.take(len(data))
        self.taken += len(data)
        return int(self._spool.write(data))


class _ChannelWriter:
    """A write-only file whose bytes go to the exec's stdin in length-prefixed frames
    (``UNFRAME``'s); ``end`` sends the empty frame."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    def write(self, data: bytes) -> int:
        for start in range(0, len(data), CHUNK):
            chunk = bytes(data[start : start + CHUNK])
            self._ws.write_channel(STDIN, len(chunk).to_bytes(8, "big") + chunk)
        return len(data)

    def end(self) -> None:
        self._ws.write_channel(STDIN, bytes(8))


def masked(masks: Sequence[MaskEntry], rel: str) -> bool:
    """True if ``rel`` (workspace-relative) is at or below a file or directory mask."""
    path = PurePosixPath(rel)
    return any(
        e.kind is not MaskKind.ANCHOR and (e.path == path or e.path in path.parents) for e in masks
    )


def put_tree(
    api: PodApi,
    pod: str,
    container: str,
    source: Path,
    target: str,
    *,
    masks: Sequence[MaskEntry] = (),
) -> None:
    """Copy the contents of the host directory ``source`` into ``target`` in the pod
    (made if missing), leaving out what ``masks`` cover.

    Raises:
        SandboxError: the stream failed or tar in the pod did not succeed.
    """
    script = (
        'mkdir -p "$1" && exec /usr/bin/python3 -I -S -c "$2" '
        'tar -x --no-overwrite-dir -f - -C "$1"'
    )
    command = ["/bin/sh", "-c", script, "sh", target, UNFRAME]

    def unmasked(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if masked(masks, member.name) else member

    ws = api.exec(pod, container, command, stdin=True, timeout_s=api.exec_timeout_s)
    try:
        writer = _ChannelWriter(ws)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for entry in sorted(os.listdir(source)):
                tar.add(source / entry, arcname=entry, filter=unmasked)
        writer.end()
        _, err, code = drain(ws, timeout_s=api.copy_timeout_s, ping_s=api.ping_s)
    except (OSError, WebSocketException) as exc:
        raise SandboxError("copying into the sandbox pod failed", pod=pod, error=str(exc)) from exc
    finally:
        close(ws)
    if code != 0:
        raise SandboxError(
            "copying into the sandbox pod failed", pod=pod, exit_code=code, stderr=err
        )


def get_tree(
    api: PodApi,
    pod: str,
    container: str,
    source: str,
    target: Path,
    *,
    max_bytes: int,
    owner: tuple[int, int] | None,
    masks: Sequence[MaskEntry] = (),
    budget: DiskBudget | None = None,
) -> None:
    """Replace the contents of the host directory ``target`` with those of ``source`` in
    the pod (``owner``: the host uid/gid given to what is written; None: the worker's),
    but for what ``masks`` cover: left out of the archive, kept on the host. The archive
    is spooled in ``target``'s parent directory, each chunk taken from ``budget`` as it
    arrives (given back when the spool is gone).

    Raises:
        WorkerDiskExceeded: the archive would pass ``budget``.
        SandboxError: the stream failed, tar in the pod did not succeed, the archive is
            over ``max_bytes`` or holds a member the filter refuses.
    """
    kept = [e.path for e in masks if e.kind is not MaskKind.ANCHOR]
    excludes = [f"--exclude=./{path}" for path in kept]
    command = ["tar", "-c", "-f", "-", "--anchored", *excludes, "-C", source, "."]
    budget = budget or DiskBudget(max_bytes)
    ws = api.exec(pod, container, command, stdin=False, timeout_s=api.exec_timeout_s)
    with tempfile.TemporaryFile(dir=target.parent, prefix=".acpw-copy-out-") as spool:
        counted = _Counted(spool, budget)
        try:
            try:
                _, err, code = drain(
                    ws,
                    sink=counted,
                    limit=max_bytes,
                    timeout_s=api.copy_timeout_s,
                    ping_s=api.ping_s,
                )
            finally:
                close(ws)
            if code != 0:
                raise SandboxError(
                    "copying out of the sandbox pod failed", pod=pod, exit_code=code, stderr=err
                )
            spool.seek(0)
            _replace(target, spool, owner, kept)
        finally:
            budget.give(counted.taken)


def drain(
    ws: Any, *, sink: Any = None, limit: int = 0, timeout_s: float, ping_s: float
) -> tuple[int, str, int | None]:
    """Read the exec to its end, within ``timeout_s``, pinging every ``ping_s``: stdout
    into ``sink`` (at most ``limit`` bytes), the tail of stderr, the exit code (None: the
    stream ended without one).

    Raises:
        SandboxError: over ``limit``, past ``timeout_s``, or the stream broke.
    """
    size, err, status = 0, b"", b""
    deadline = time.monotonic() + timeout_s
    pinged = time.monotonic()
    try:
        while ws.is_open():
            now = time.monotonic()
            if now > deadline:
                raise SandboxError(
                    "a command in the sandbox pod did not end in time",
                    reason="ExecTimeout", timeout_s=timeout_s,
                )  # fmt: skip
            if now - pinged >= ping_s:
                ws.sock.ping()
                pinged = now
            ws.update(timeout=min(1.0, ping_s, max(0.0, deadline - now)))
            out = ws.read_channel(STDOUT)
            if out and sink is not None:
                size += len(out)
                if size > limit:
                    raise SandboxError("what the sandbox pod sent is over its bound", bound=limit)
                sink.write(out)
            err = (err + ws.read_channel(STDERR))[-_STDERR_KEPT:]
            status += ws.read_channel(ERROR)
    except (OSError, WebSocketException) as exc:
        raise SandboxError(
            "the stream of a command in the sandbox pod broke", error=str(exc)
        ) from exc
    return size, err.decode(errors="replace"), exit_code(status)


def close(ws: Any) -> None:
    try:
        ws.close()
    finally:
        ws.sock.shutdown()


def read_output(api: PodApi, pod: str, container: str, command: list[str], limit: int) -> bytes:
    """What ``command`` in the pod writes on stdout (at most ``limit`` bytes).

    Raises:
        SandboxError: it could not run, did not exit 0 or wrote more.
    """
    ws = api.exec(pod, container, command, stdin=False, timeout_s=api.exec_timeout_s)
    sink = io.BytesIO()
    try:
        _, err, code = drain(
            ws, sink=sink, limit=limit, timeout_s=api.exec_timeout_s, ping_s=api.ping_s
        )
    finally:
        close(ws)
    if code != 0:
        raise SandboxError(
            "a command in the sandbox pod failed", pod=pod, exit_code=code, stderr=err
        )
    return sink.getvalue()


def extract(archive: Any, target: Path) -> None:
    """Extract an archive from the pod into ``target`` (the module docstring's filter).

    Raises:
        SandboxError: a member the filter refuses, or the archive is broken.
    """
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            tar.extractall(target, filter=_untrusted)  # noqa: S202 - every member through _untrusted
    except (tarfile.TarError, OSError) as exc:
        raise SandboxError(
            "what the sandbox pod sent was refused", path=str(target), error=str(exc)
        ) from exc


def _clear(directory: Path, kept: Sequence[PurePosixPath], rel: PurePosixPath) -> None:
    """Remove what is in ``directory`` but the ``kept`` paths (and their parents)."""
    for entry in os.scandir(directory):
        path = rel / entry.name
        if path in kept:
            continue
        is_dir = entry.is_dir(follow_symlinks=False)
        if is_dir and any(path in k.parents for k in kept):
            _clear(Path(entry.path), kept, path)
        elif is_dir:
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _replace(
    target: Path,
    archive: Any,
    owner: tuple[int, int] | None,
    kept: Sequence[PurePosixPath] = (),
) -> None:
    _clear(target, kept, PurePosixPath())
    extract(archive, target)
    if owner is not None and os.geteuid() == 0:
        _chown_tree(target, owner)


def _untrusted(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if member.isfifo() or member.isdev():
        return None
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        if not member.issym():
            raise
        # The link itself, kept verbatim; nothing is ever written through it.
        return member.replace(uid=None, gid=None, uname=None, gname=None, deep=False)  # type: ignore[arg-type]


def _chown_tree(root: Path, owner: tuple[int, int]) -> None:
    os.lchown(root, *owner)
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(parent, name), *owner)
