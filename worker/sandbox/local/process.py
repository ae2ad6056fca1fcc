"""Starting one bwrap process inside a sandbox's cgroups, and signalling what it runs.

The worker moves each spawn into the cgroups itself while bubblewrap starts: bubblewrap
waits for its options on a pipe the worker fills only then, so it clones the sandbox
inside them (whose cgroup namespace is rooted at its own cgroup), and the sandboxed
child also waits on a gate (``--block-fd``) until it is in, so the program never runs a
single instruction outside them (see ``_admit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from worker.errors import SandboxError
from worker.sandbox import cgroups, seccomp
from worker.sandbox.base import ExitDiagnosis, PipedProcess, ended
from worker.sandbox.local.bwrap import bwrap_command, nul_joined

_KILL_ROUNDS = 200  # x about 10 ms: bound on destroy's kill loop
#: The pauses between two rounds of the kill loop: the first short (a sandbox whose agent
#: already exited may be empty within a millisecond or two), doubling up to the longest.
#: A big agent's last process can take ~20 ms to leave its cgroup after SIGKILL (codex-acp
#: on a loaded 2-core host): then this saves nothing, and costs a few more rounds.
_KILL_PAUSE_S = (0.001, 0.01)
# Bound on bwrap reporting its sandboxed child (it does so right after clone()).
_ADMIT_TIMEOUT_S = 30.0


def _data_fd(name: str, data: bytes) -> int:
    """A memfd holding ``data`` at offset 0 (bwrap reads fds to the end); caller closes."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def _child_pid(info_fd: int, deadline: float) -> int | None:
    """The host pid of bwrap's sandboxed child, from its ``--info-fd`` JSON.

    None when bwrap exited before it cloned (its stderr says why).

    Raises:
        SandboxError: bwrap said nothing in time, or something unreadable.
    """
    data = b""
    while not data.endswith(b"}\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([info_fd], [], [], left)[0]:
            raise SandboxError("bwrap did not report its sandbox in time")
        chunk = os.read(info_fd, 4096)
        if not chunk:
            return None
        data += chunk
    try:
        pid = json.loads(data)["child-pid"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError("bwrap reported an unreadable child", info=data[:200]) from exc
    if not isinstance(pid, int) or pid <= 1:
        raise SandboxError("bwrap reported an unreadable child", info=data[:200])
    return pid


def _before_gate(before_gate: Callable[[int], None], child: int) -> bool:
    """Run ``before_gate(child)``: False when the child is gone meanwhile.

    Raises:
        SandboxError: it failed otherwise.
    """
    try:
        before_gate(child)
    except (ProcessLookupError, FileNotFoundError):
        return False
    except OSError as exc:
        raise SandboxError("cannot prepare the sandbox before it runs", error=str(exc)) from exc
    return True


def _admit(
    cgs: cgroups.CgroupSet,
    pid: int,
    options: bytes,
    fds: tuple[int, int, int],
    before_gate: Callable[[int], None] | None = None,
) -> None:
    """Put one spawn into the sandbox's cgroups, then let it run (blocking; a thread).

    ``fds``: the write end of bwrap's ``--args`` pipe, the read end of its ``--info-fd``,
    the write end of its ``--block-fd`` gate. ``pid`` (nsenter, then bwrap: one pid
    across the execs) is moved while it starts; bwrap waits for its options on the args
    pipe, which are written only then, so it clones the sandbox inside the cgroups (and
    the sandbox's cgroup namespace is rooted at its own cgroup: the agent sees ``/``).
    The child bwrap reports on the info fd is moved too, and only then is the gate
    written: that child waits on it before it forks the sandbox's init or execs the
    command, so not one instruction of the program runs outside the cgroups. On any
    failure the spawn's process group is killed before the gate closes (bwrap reads EOF
    on the gate as "go"). ``before_gate(child)`` runs once the child is in the cgroups,
    before the gate: what must exist before the sandbox runs anything (the proxy's
    listeners in its network namespace, ``netns``); what it raises fails the spawn. Owns
    and closes the three descriptors.

    Raises:
        SandboxError: a cgroup could not be joined, bwrap did not report in time, or
            ``before_gate`` failed.
    """
    args_fd, info_fd, gate_fd = fds
    opened = False
    try:
        try:
            cgroups.join(cgs, pid)
            _write_all(args_fd, options)
        except (ProcessLookupError, BrokenPipeError):
            return  # exited already (nsenter or bwrap refused): its stderr says why
        os.close(args_fd)  # bwrap parses its options and clones, inside the cgroups
        args_fd = -1
        child = _child_pid(info_fd, time.monotonic() + _ADMIT_TIMEOUT_S)
        if child is None:
            return
        try:
            cgroups.join(cgs, child)
        except ProcessLookupError:
            # The child died in its own set-up (a mount bwrap could not make): nothing
            # can run, and bwrap's exit and stderr say why, so it is not killed.
            opened = True
            return
        if before_gate is not None and not _before_gate(before_gate, child):
            opened = True  # it died in its set-up, as above: bwrap's exit says why
            return
        os.write(gate_fd, b"1")
        opened = True
    except OSError as exc:
        raise SandboxError("cannot join the sandbox's cgroups", error=str(exc)) from exc
    finally:
        if not opened:  # killed before its args or its gate read EOF: nothing runs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for fd in (args_fd, info_fd, gate_fd):
            if fd >= 0:
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Host pids below ``pid``, parents before children (a snapshot; races are benign)."""
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += _children(child)
    return out


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class LocalProcess(PipedProcess):
    """A bwrap process; its pid is bwrap's (host pid), the program runs under it."""

    def __init__(self, proc: asyncio.subprocess.Process, cgs: cgroups.CgroupSet) -> None:
        super().__init__(proc, what="bwrap")
        self._cgroups = cgs

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """bwrap's exit status is the program's (``128 + N`` when signal N ended it); an
        end by SIGKILL in a sandbox whose cgroup counted an OOM kill was the kernel's."""
        diagnosis = ended(self._proc.returncode)
        if diagnosis.signal != "SIGKILL":
            return diagnosis
        try:  # a small cgroupfs file: read inline
            oom = cgroups.out_of_memory(self._cgroups)
        except (OSError, ValueError):  # unreadable evidence is not claimed
            return diagnosis
        return ended(self._proc.returncode, oom_killed=oom)

    def terminate(self) -> None:
        """SIGTERM to every process of this spawn's tree inside the sandbox.

        Not to bwrap itself: bwrap dies on SIGTERM without forwarding it, and
        --die-with-parent then SIGKILLs the tree, which would give the agent no grace.
        """
        if self._proc.returncode is None:
            _signal(descendants(self.pid), signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to bwrap's process group and the tree under it.

        Killing bwrap alone suffices (the pid namespace's init dies with it and takes
        every process inside along); the tree is signalled too so nothing waits on that.
        """
        if self._proc.returncode is not None:
            return
        tree = descendants(self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        _signal(tree, signal.SIGKILL)


async def start_admitted(
    cgs: cgroups.CgroupSet,
    *,
    prefix: Sequence[str],
    bwrap: str,
    argv: Sequence[str],
    options: Callable[[int], Sequence[str]],
    limit: int,
    before_gate: Callable[[int], None] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``prefix`` + bwrap running ``argv``, admitted into ``cgs`` before it runs.

    ``options(seccomp_fd)``: bwrap's options (they name the seccomp program's fd), sent
    through the ``--args`` pipe once the process is in the cgroups (see :func:`_admit`).
    ``before_gate(child)``: run in :func:`_admit`'s thread with the sandbox's pid before
    it may run anything.

    Raises:
        SandboxError: the spawn could not be put into the cgroups, or an option holds a
            NUL byte.
        OSError: the process could not be started.
    """
    filter_fd = _data_fd("acpw-seccomp", seccomp.program())
    child_fds = [filter_fd]
    ours: list[int] = []
    try:
        info_r, info_w = os.pipe()
        ours.append(info_r)
        child_fds.append(info_w)
        gate_r, gate_w = os.pipe()
        ours.append(gate_w)
        child_fds.append(gate_r)
        args_r, args_w = os.pipe()  # filled once bwrap is in the cgroups: see _admit
        ours.append(args_w)
        child_fds.append(args_r)
        data = nul_joined(options(filter_fd))
        command = bwrap_command(bwrap, args_r, argv, info_fd=info_w, block_fd=gate_r)
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=limit,
            env={},
            pass_fds=tuple(child_fds),
            start_new_session=True,
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    # Submitted now, so the thread owns both descriptors whatever happens to us.
    admitted = asyncio.get_running_loop().run_in_executor(
        None, _admit, cgs, proc.pid, data, (args_w, info_r, gate_w), before_gate
    )
    try:
        await admitted
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc


async def kill_until_exiting(cgs: cgroups.CgroupSet, sandbox_id: str) -> None:
    """SIGKILL every member of ``cgs`` until each is exiting (``cgroups.exiting``) and
    none appeared since: from then on nothing in the sandbox can run, write or fork again.

    The kernel may still be tearing the last of them down: closing an inotify instance
    waits for an SRCU grace period, dropping the sandbox's mount namespace for an RCU
    one (10-50 ms for codex-acp here, the pauses of a loop that waits for the cgroups
    to empty); :func:`kill_and_remove` waits for that.

    Raises:
        SandboxError: a process was still not exiting after the bounded kill loop.
    """
    pause, longest = _KILL_PAUSE_S
    for _ in range(_KILL_ROUNDS):
        found = cgroups.members(cgs)
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A member forks no more once it is exiting: if every one listed is, and the
        # cgroups list none besides them, none can appear later.
        if all(cgroups.exiting(pid) for pid in found) and cgroups.members(cgs) <= found:
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)
    raise _survived(cgs, sandbox_id)


async def kill_and_remove(cgs: cgroups.CgroupSet, sandbox_id: str) -> None:
    """SIGKILL every member of ``cgs`` until none is left, then remove the cgroups.

    Loops because a process may fork between reading cgroup.procs and the kill;
    pids.max bounds how long that can go on. rmdir is EBUSY until members are reaped.

    Raises:
        SandboxError: processes survived the bounded kill loop or a cgroup stayed busy.
    """
    pause, longest = _KILL_PAUSE_S
    for _ in range(_KILL_ROUNDS):
        if cgroups.signal_all(cgs, signal.SIGKILL) == 0 and cgroups.remove(cgs):
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)
    raise _survived(cgs, sandbox_id)


def _survived(cgs: cgroups.CgroupSet, sandbox_id: str) -> SandboxError:
    """What a kill loop that ran out of rounds raises: who is still there."""
    return SandboxError(
        "sandbox processes survived destroy",
        sandbox_id=sandbox_id,
        pids=sorted(cgroups.members(cgs)),
        errno=errno.EBUSY,
    )
