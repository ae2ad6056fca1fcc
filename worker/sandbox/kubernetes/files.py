"""``WorkspaceFiles`` of a sandbox pod: ``/workspace`` through exec into the pod.

The containment rules are those of ``worker.sandbox.files``: :func:`relative` first (no
``..``, inside ``/workspace``, not ``masked`` — the masks are mounted over the pod's
workspace), then one exec of :data:`HELPER` (``python3 -I -S``, as the sandbox user)
does the rest *in the pod, in one process*: it walks down from ``/workspace`` opening
every directory with ``O_NOFOLLOW`` relative to the one above (a link anywhere refuses
``symlink``), and uses the file through the descriptor it checked (``O_NOFOLLOW``,
``O_NONBLOCK`` so a FIFO cannot hang it): a regular file only (``not_regular_file``),
within the read limit (``too_large``: on its size, and again on the bytes read, which
stop one past the limit). An agent that swaps a component for a link between the check
and the use is stopped, unlike separate calls. Writing makes missing directories (755)
and the file (644) as the sandbox user, who may change them afterwards; an existing
file is truncated only once it proved regular. What the pod sends back is bounded and
parsed as untrusted; a failed exec is the path's refusal (``unreadable``/
``not_writable``), not the job's.

``artifact`` answers from lookups (``worker.sandbox.lookups``: the job awaits
``look_up`` for the paths each notification names and for a prompt's links); here one
exec looks up all of a batch.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from websocket import WebSocketException

from worker.admission import MaskEntry
from worker.errors import SandboxError
from worker.events.artifacts import Verdict
from worker.sandbox.base import WORKSPACE
from worker.sandbox.files import REASONS, PathRefused
from worker.sandbox.kubernetes import transfer
from worker.sandbox.kubernetes.stream import STDIN
from worker.sandbox.lookups import LookedUp

if TYPE_CHECKING:
    from worker.sandbox.kubernetes.api import PodApi

log = logging.getLogger(__name__)

#: Runs in the pod: ``argv = [op, limit, rel...]``; answers one line per path, ``ok
#: <size>`` (after it, for ``read``, the file's bytes) or ``no <reason>``. ``write``
#: reads exactly ``limit`` bytes, the content, from stdin before it touches anything:
#: it never waits for stdin's EOF, which a v4 server cannot send.
HELPER = (
    "import os,sys,stat,errno\n"
    "F=os.O_NOFOLLOW|os.O_CLOEXEC|os.O_NONBLOCK\n"
    "D=os.O_RDONLY|os.O_DIRECTORY|F\n"
    "o=sys.stdout.buffer\n"
    "class R(Exception): pass\n"
    "def kind(fd,p,e,d):\n"
    " try: m=os.stat(p,dir_fd=fd,follow_symlinks=False).st_mode\n"
    " except OSError: return 'missing' if e.errno==errno.ENOENT else d\n"
    " if stat.S_ISLNK(m): return 'symlink'\n"
    " if e.errno in (errno.ENOTDIR,errno.EISDIR,errno.ENXIO): return 'not_regular_file'\n"
    " return d\n"
    "def sub(fd,p,make,d):\n"
    " try: return os.open(p,D,dir_fd=fd)\n"
    " except OSError as e:\n"
    "  if e.errno!=errno.ENOENT or not make: raise R(kind(fd,p,e,d))\n"
    " try: os.mkdir(p,0o755,dir_fd=fd)\n"
    " except FileExistsError: pass\n"
    " except OSError: raise R('not_writable')\n"
    " try: return os.open(p,D,dir_fd=fd)\n"
    " except OSError as e: raise R(kind(fd,p,e,d))\n"
    "def walk(rel,make,d):\n"
    " fd=os.open('" + WORKSPACE + "',D)\n"
    " *up,name=rel.split('/')\n"
    " for p in up:\n"
    "  n=sub(fd,p,make,d); os.close(fd); fd=n\n"
    " return fd,name\n"
    "def opened(fd,name,flags,d):\n"
    " try: f=os.open(name,flags|F,0o644,dir_fd=fd)\n"
    " except OSError as e: raise R(kind(fd,name,e,d))\n"
    " if not stat.S_ISREG(os.fstat(f).st_mode): raise R('not_regular_file')\n"
    " return f\n"
    "def look(rel,lim):\n"
    " fd,name=walk(rel,False,'unreadable')\n"
    " try: m=os.stat(name,dir_fd=fd,follow_symlinks=False)\n"
    " except OSError as e: raise R(kind(fd,name,e,'unreadable'))\n"
    " if stat.S_ISLNK(m.st_mode): raise R('symlink')\n"
    " if not stat.S_ISREG(m.st_mode): raise R('not_regular_file')\n"
    " o.write(b'ok %d\\n'%m.st_size)\n"
    "def read(rel,lim):\n"
    " fd,name=walk(rel,False,'unreadable')\n"
    " f=opened(fd,name,os.O_RDONLY,'unreadable')\n"
    " if os.fstat(f).st_size>lim: raise R('too_large')\n"
    " b=b''\n"
    " while len(b)<=lim:\n"
    "  c=os.read(f,lim+1-len(b))\n"
    "  if not c: break\n"
    "  b+=c\n"
    " if len(b)>lim: raise R('too_large')\n"
    " o.write(b'ok %d\\n'%len(b)+b)\n"
    "def write(rel,lim):\n"
    " if len(DATA)!=lim: raise R('not_writable')\n"
    " fd,name=walk(rel,True,'not_writable')\n"
    " f=opened(fd,name,os.O_WRONLY|os.O_CREAT,'not_writable')\n"
    " os.ftruncate(f,0); v=memoryview(DATA)\n"
    " while v: v=v[os.write(f,v):]\n"
    " os.close(f); o.write(b'ok %d\\n'%len(DATA))\n"
    "op,lim=sys.argv[1],int(sys.argv[2])\n"
    "DATA=sys.stdin.buffer.read(lim) if op=='write' else b''\n"
    "for rel in sys.argv[3:]:\n"
    " try: {'look':look,'read':read,'write':write}[op](rel,lim)\n"
    " except R as r: o.write(b'no %s\\n'%r.args[0].encode())\n"
    " except OSError: o.write(b'no %s\\n'%(b'not_writable' if op=='write' else b'unreadable'))\n"
    "o.flush()\n"
)
HELPER_ARGV = ("/usr/bin/python3", "-I", "-S", "-c", HELPER)
#: Bound on one answer line (``ok <size>`` / ``no <reason>``).
_LINE = 64


class KubernetesWorkspaceFiles(LookedUp):
    """The pod's ``/workspace``, with its masks, reached through exec (see the module)."""

    def __init__(
        self,
        api: PodApi,
        pod: str,
        container: str,
        *,
        masks: Sequence[MaskEntry] = (),
        ttl_s: float = 30.0,
        max_known: int = 1024,
        max_lookups: int = 8,
    ) -> None:
        super().__init__(masks=masks, ttl_s=ttl_s, max_known=max_known, max_lookups=max_lookups)
        self._api, self._pod, self._container = api, pod, container

    # --- artifacts: looked up in one exec --------------------------------------------

    async def _look_up(self, rels: list[str]) -> None:
        try:
            out = await self._exchange("look", 0, rels, bound=_LINE * len(rels))
            answers = [_answer(line) for line in _lines(out, len(rels))]
        except SandboxError as exc:
            log.warning(
                "looking up %d paths in the sandbox pod %s failed: %s",
                len(rels),
                self._pod,
                exc.details,
            )
            answers = [("unreadable", 0)] * len(rels)
        for rel, (reason, size) in zip(rels, answers, strict=True):
            self.remember(rel, _verdict(rel, reason, size))

    # --- fs/* -------------------------------------------------------------------------

    async def read_text(self, path: str, *, limit: int) -> str:
        """See :class:`worker.sandbox.files.WorkspaceFiles`."""
        rel = self.relative(path)
        try:
            out = await self._exchange("read", limit, [rel], bound=_LINE + limit)
            head, _, data = out.partition(b"\n")
            reason, size = _answer(head)
        except SandboxError as exc:
            log.warning("reading in the sandbox pod %s failed: %s", self._pod, exc.details)
            raise PathRefused("unreadable") from None
        if reason != "ok":
            raise PathRefused(reason)
        if size != len(data) or size > limit:
            raise PathRefused("unreadable")
        self.remember(rel, Verdict(relative=rel, size=size))
        return data.decode("utf-8", "replace")

    async def write_text(self, path: str, content: str) -> None:
        """See :class:`worker.sandbox.files.WorkspaceFiles`: missing directories are made
        (755, as the sandbox user: the agent may change them afterwards)."""
        rel = self.relative(path)
        data = content.encode("utf-8")
        try:
            out = await self._exchange("write", len(data), [rel], bound=_LINE, data=data)
            reason, size = _answer(_lines(out, 1)[0])
        except SandboxError as exc:
            log.warning("writing in the sandbox pod %s failed: %s", self._pod, exc.details)
            raise PathRefused("not_writable") from None
        if reason != "ok":
            raise PathRefused(reason)
        self.remember(rel, Verdict(relative=rel, size=size))

    # --- the exec -----------------------------------------------------------------------

    async def _exchange(
        self, op: str, limit: int, rels: list[str], *, bound: int, data: bytes | None = None
    ) -> bytes:
        return await asyncio.to_thread(self._exchange_now, op, limit, rels, bound, data)

    def _exchange_now(
        self, op: str, limit: int, rels: list[str], bound: int, data: bytes | None
    ) -> bytes:
        """What the helper answers for ``rels`` (at most ``bound`` bytes; blocking).

        Raises:
            SandboxError: the exec failed, the helper did not exit 0 or sent too much.
        """
        command = [*HELPER_ARGV, op, str(limit), *rels]
        api = self._api
        ws = api.exec(
            self._pod, self._container, command, stdin=data is not None,
            timeout_s=api.exec_timeout_s,
        )  # fmt: skip
        sink = io.BytesIO()
        try:
            if data is not None:
                for start in range(0, len(data), transfer.CHUNK):
                    ws.write_channel(STDIN, data[start : start + transfer.CHUNK])
            _, err, code = transfer.drain(
                ws, sink=sink, limit=bound, timeout_s=api.exec_timeout_s, ping_s=api.ping_s
            )
        except (OSError, WebSocketException) as exc:  # the stream broke mid-way
            raise SandboxError(
                "the file helper's stream in the sandbox pod failed", pod=self._pod,
                error=str(exc),
            ) from exc  # fmt: skip
        finally:
            transfer.close(ws)
        if code != 0:
            raise SandboxError(
                "the file helper in the sandbox pod failed", pod=self._pod, exit_code=code,
                stderr=err,
            )  # fmt: skip
        return sink.getvalue()


def _lines(out: bytes, count: int) -> list[bytes]:
    lines = out.split(b"\n")
    if len(lines) != count + 1 or lines[-1]:
        raise SandboxError("the file helper in the sandbox pod answered out of protocol")
    return lines[:-1]


def _answer(line: bytes) -> tuple[str, int]:
    """``("ok", size)`` or ``(reason, 0)`` from one answer line (untrusted).

    Raises:
        SandboxError: the line is not one the helper writes.
    """
    word, _, rest = line.decode("ascii", "replace").partition(" ")
    if word == "ok" and rest.isdigit():
        return "ok", int(rest)
    if word == "no" and rest in REASONS:
        return rest, 0
    raise SandboxError("the file helper in the sandbox pod answered out of protocol")


def _verdict(rel: str, reason: str, size: int) -> Verdict:
    return Verdict(relative=rel, size=size) if reason == "ok" else Verdict(reason=reason)


__all__ = ["HELPER", "KubernetesWorkspaceFiles"]
