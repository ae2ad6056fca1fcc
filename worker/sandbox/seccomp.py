"""The seccomp program every local sandbox runs under.

Default allow, with a deny list of syscalls an agent never needs and that widen the
kernel attack surface or undo the sandbox (new namespaces, mounts, tracing, keyrings, BPF,
modules). The table is data (``RULES``) so it can be reviewed and unit-tested; the BPF is
compiled at run time with libseccomp (``pyseccomp``), once per process; the local
backend hands it to bubblewrap through a memfd (``--seccomp FD``).

Arguments are filtered where a blanket deny would break ordinary programs:
``clone`` only with a ``CLONE_NEW*`` flag, ``chmod``/``open`` only with set-id mode bits.
``clone3`` passes its flags in memory, which seccomp cannot read, so it answers
``ENOSYS`` and glibc falls back to ``clone``, which we can filter.

Argument positions are those of x86_64 and aarch64 (the platforms we ship); ``clone``'s
flags are argument 0 there.
"""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass

import pyseccomp

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)
S_ISUID = 0o4000
S_ISGID = 0o2000


@dataclass(frozen=True, slots=True)
class Rule:
    """Deny ``syscall`` with ``errno``; if ``arg`` is set, only when ``arg & flag == flag``."""

    syscall: str
    errno: int
    arg: int | None = None
    flag: int = 0


def _deny(names: str, code: int = errno.EPERM) -> tuple[Rule, ...]:
    return tuple(Rule(name, code) for name in names.split())


def _deny_flags(syscall: str, arg: int, flags: tuple[int, ...]) -> tuple[Rule, ...]:
    # One rule per flag: libseccomp ORs separate rules, and ANDs conditions within one.
    return tuple(Rule(syscall, errno.EPERM, arg, flag) for flag in flags)


_SETID = (S_ISUID, S_ISGID)

RULES: tuple[Rule, ...] = (
    # Namespaces and mounts: would let the agent rebuild its own view of the system.
    *_deny("unshare setns"),
    *_deny_flags("clone", 0, CLONE_NAMESPACE_FLAGS),
    *_deny("clone3", errno.ENOSYS),
    *_deny("mount umount2 pivot_root chroot"),
    *_deny("fsopen fsconfig fsmount fspick move_mount open_tree mount_setattr"),
    # Inspecting or steering other processes.
    *_deny("ptrace process_vm_readv process_vm_writev"),
    # Kernel surfaces agents never need: keyrings are per host uid (the sandbox's uid
    # maps to the worker's), BPF, perf, userfaultfd, modules, kexec.
    *_deny("keyctl add_key request_key bpf perf_event_open userfaultfd"),
    *_deny("kexec_load kexec_file_load init_module finit_module delete_module"),
    # open_by_handle_at bypasses path-based confinement; name_to_handle_at only returns
    # an opaque handle, is used by ordinary tools (findmnt, systemd libs) and stays allowed.
    *_deny("open_by_handle_at"),
    # io_uring runs syscalls outside seccomp's view; libuv falls back to threads on EPERM.
    *_deny("io_uring_setup io_uring_enter io_uring_register"),
    # The sandbox uid maps to the worker's host uid, so a set-id file left in the
    # workspace would be set-id *on the host*: refuse to create one.
    *_deny_flags("chmod", 1, _SETID),
    *_deny_flags("fchmod", 1, _SETID),
    *_deny_flags("fchmodat", 2, _SETID),
    *_deny_flags("fchmodat2", 2, _SETID),
    *_deny_flags("creat", 1, _SETID),
    *_deny_flags("open", 2, _SETID),
    *_deny_flags("openat", 3, _SETID),
    *_deny_flags("mknod", 1, _SETID),
    *_deny_flags("mknodat", 2, _SETID),
    # openat2 takes its mode in a struct seccomp cannot read; glibc does not need it.
    *_deny("openat2", errno.ENOSYS),
)


def _known(name: str) -> bool:
    # Syscalls this architecture does not have (e.g. `open` on aarch64) are skipped.
    return bool(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) >= 0)


def _add(flt: pyseccomp.SyscallFilter, rule: Rule) -> None:
    action = pyseccomp.ERRNO(rule.errno)
    if rule.arg is None:
        flt.add_rule(action, rule.syscall)
        return
    cond = pyseccomp.Arg(rule.arg, pyseccomp.MASKED_EQ, rule.flag, rule.flag)
    flt.add_rule(action, rule.syscall, cond)


def compile_bpf(rules: tuple[Rule, ...] = RULES) -> bytes:
    """Compile ``rules`` into a classic-BPF seccomp program for the native architecture.

    Raises:
        OSError: libseccomp refused a rule.
    """
    flt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for rule in rules:
        if _known(rule.syscall):
            _add(flt, rule)
    fd = os.memfd_create("acpw-seccomp-build", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.cache
def program() -> bytes:
    """The compiled program, built once per process (compiling costs ~1 ms)."""
    return compile_bpf()
