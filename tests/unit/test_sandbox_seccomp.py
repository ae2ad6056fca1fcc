"""The seccomp rule table and its compilation."""

from __future__ import annotations

import errno

from worker.sandbox import seccomp
from worker.sandbox.seccomp import RULES, Rule

MUST_DENY = [
    "ptrace",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "process_vm_readv",
    "process_vm_writev",
]


def _unconditional() -> dict[str, int]:
    return {r.syscall: r.errno for r in RULES if r.arg is None}


def test_dangerous_syscalls_are_denied_outright_with_eperm() -> None:
    table = _unconditional()
    for name in MUST_DENY:
        assert table.get(name) == errno.EPERM, name


def test_clone3_answers_enosys_so_glibc_falls_back_to_clone() -> None:
    assert _unconditional()["clone3"] == errno.ENOSYS


def test_clone_is_denied_per_namespace_flag_only() -> None:
    clone = [r for r in RULES if r.syscall == "clone"]
    assert {r.flag for r in clone} == set(seccomp.CLONE_NAMESPACE_FLAGS)
    assert all(r.arg == 0 and r.errno == errno.EPERM for r in clone)
    assert seccomp.CLONE_NEWUSER in {r.flag for r in clone}


def test_setid_modes_are_denied_at_the_mode_argument() -> None:
    positions = {r.syscall: r.arg for r in RULES if r.flag == seccomp.S_ISUID}
    assert positions == {
        "chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1,
        "open": 2, "openat": 3, "mknod": 1, "mknodat": 2,
    }  # fmt: skip


def test_name_to_handle_at_stays_allowed() -> None:
    assert "name_to_handle_at" not in {r.syscall for r in RULES}


def test_program_is_classic_bpf_and_cached() -> None:
    program = seccomp.program()
    assert len(program) % 8 == 0  # struct sock_filter is 8 bytes
    assert len(program) > 8 * len(MUST_DENY)
    assert seccomp.program() is program


def test_more_rules_make_a_longer_program() -> None:
    base = seccomp.compile_bpf(())
    one = seccomp.compile_bpf((Rule("ptrace", errno.EPERM),))
    assert len(one) > len(base)


def test_unknown_syscalls_are_skipped() -> None:
    assert seccomp.compile_bpf((Rule("no_such_syscall", errno.EPERM),)) == seccomp.compile_bpf(())
