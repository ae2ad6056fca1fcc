"""The process that owns what a job creates, named so that a reused pid cannot pass for it.

Every sandbox and work directory carries the ``acpw.owner`` label of the process that
ran its job: ``<boot id>:<pid namespace inode>:<pid>:<start time>``, the start time being
field 22 of ``/proc/<pid>/stat`` (clock ticks since boot). A pid is reused after its
process dies, but never with the same start time within one boot. It is the reaper's
first word on whether a job is over: a job run by ``acp-worker run`` holds no lease (its
token label is ``0``), and a job id may be reused by another deployment whose tokens this
Redis cannot judge.

:func:`owner_state` judges a label only from the boot and the pid namespace it was made
in (another host, another boot or another container's pids cannot be checked from here):
anything else is ``unknown``, and the reaper falls back to the lease tokens.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

LABEL_OWNER = "acpw.owner"
#: The Redis a leased job's token comes from: another deployment's sandboxes on this host
#: carry another value, and their tokens mean nothing to this one's reaper.
LABEL_STORE = "acpw.store"

OwnerState = Literal["alive", "gone", "unknown"]

_PROC = Path("/proc")
_DEAD_STATES = frozenset({"Z", "X", "x"})  # zombie, dead: exited, not yet (or just) reaped


def owner_labels() -> dict[str, str]:
    """``{"acpw.owner": ...}`` for this process, or nothing where ``/proc`` cannot tell.

    Read from ``/proc`` once per process (every sandbox and warm slot of a job labels
    itself with it; a process's boot, namespace, pid and start time never change; a forked
    child, another pid, reads its own)."""
    pid = os.getpid()
    if pid not in _own:
        identity = owner_label(pid)
        _own.clear()
        _own[pid] = {} if identity is None else {LABEL_OWNER: identity}
    return dict(_own[pid])


_own: dict[int, dict[str, str]] = {}  # this process's labels, by its pid


def store_label(redis_url: str | None) -> str | None:
    """A short, credential-free name of the Redis at ``redis_url`` (scheme, host, port,
    database), or None without one."""
    if not redis_url:
        return None
    wheres = []
    for part in sorted(redis_url.split(";")):  # sentinel://a;sentinel://b/0: its sentinels
        parts = urlsplit(part)
        try:
            port = parts.port
        except ValueError:
            port = None
        wheres.append(f"{parts.scheme}://{parts.hostname}:{port}{parts.path or '/0'}")
    where = ";".join(wheres)
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def owner_state(label: str | None) -> OwnerState:
    """Whether the process a ``acpw.owner`` label names is still running."""
    parts = (label or "").split(":")
    if len(parts) != 4 or not parts[2].isdigit():
        return "unknown"
    boot, namespace, pid, started = parts
    here = _host()
    if here is None or (boot, namespace) != here:
        return "unknown"
    try:
        return _judge(int(pid), started)
    except OSError:  # not ours to read (hidepid, another user): cannot tell
        return "unknown"


def _judge(pid: int, started: str) -> OwnerState:
    stat = _stat(pid)
    if stat is None or stat[1] != started:
        return "gone"  # no such process, or the pid was reused by another one
    if stat[0] in _DEAD_STATES and _threads(pid) <= 1:
        return "gone"
    return "alive"


def owner_label(pid: int) -> str | None:
    """The ``acpw.owner`` label naming process ``pid``; None where ``/proc`` cannot tell."""
    here = _host()
    try:
        stat = _stat(pid)
    except OSError:
        return None
    if here is None or stat is None:
        return None
    return f"{here[0]}:{here[1]}:{pid}:{stat[1]}"


def _host() -> tuple[str, str] | None:
    """(boot id, pid namespace inode) as this process sees them."""
    try:
        boot = (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
        namespace = os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return None
    inode = namespace.partition("[")[2].rstrip("]")
    return (boot, inode) if boot and inode.isdigit() else None


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of ``pid``, or None when there is no such process.

    Raises:
        OSError: the process exists but its stat cannot be read.
    """
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # ``pid (comm) state ...``: comm may hold spaces and parentheses, so split after the
    # last ')'; the start time is field 22 overall, the 20th after comm.
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(_PROC / str(pid) / "task"))
    except OSError:
        return 0
