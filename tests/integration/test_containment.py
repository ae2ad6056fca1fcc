"""Containment, proven from inside real bubblewrap sandboxes with real cgroups.

Each test runs a small program in a sandbox and asserts what it could and could not do.
Python inside the sandbox is the host's /usr/bin/python3 (seen through the read-only /usr).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_owner import chown_to_sandbox
from worker.errors import SandboxError
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend, LocalSandbox, descendants

PY = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
PIDS_MAX = 64


def _spec(tmp_path: Path, memory: int = 256 << 20, **kw: Any) -> SandboxSpec:
    (tmp_path / "ws").mkdir(exist_ok=True)
    chown_to_sandbox(tmp_path / "ws", LocalConfig())  # the sandbox writes as that uid
    (tmp_path / "pack").mkdir(exist_ok=True)
    (tmp_path / "pack" / "agent.txt").write_text("pack")
    fields: dict[str, Any] = {
        "job_id": "contain",
        "attempt": 1,
        "workspace": tmp_path / "ws",
        "pack_closure": tmp_path / "pack",
        "limits": ResourceLimits(memory_bytes=memory, cpus=1.0, pids=PIDS_MAX),
        "labels": {"suite": "containment"},
    }
    return SandboxSpec(**{**fields, **kw})


@pytest.fixture(scope="module")
def etc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Building the shared /etc copies a few hundred entries: once per module, not per test.
    return tmp_path_factory.mktemp("etc") / "etc"


def _backend(tmp_path: Path, etc_dir: Path) -> LocalBackend:
    config = LocalConfig(cgroup_parent="acpw-test")
    return LocalBackend(config, state_dir=tmp_path / "state", etc_dir=etc_dir)


@pytest.fixture
def backend(tmp_path: Path, etc_dir: Path) -> LocalBackend:
    return _backend(tmp_path, etc_dir)


@pytest.fixture
async def sandbox(backend: LocalBackend, tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    box = await backend.create(_spec(tmp_path))
    try:
        yield box
    finally:
        await backend.destroy(box.sandbox_id)


async def run(
    box: LocalSandbox, argv: list[str], env: Mapping[str, str] = ENV
) -> tuple[int, str, str]:
    proc = await box.spawn(argv, env=env)
    out, err = await asyncio.wait_for(
        asyncio.gather(proc.stdout.read(), proc.stderr.read()), timeout=20
    )
    return await proc.wait(), out.decode(), err.decode()


async def py(box: LocalSandbox, code: str) -> object:
    """Run ``code`` (which prints one JSON value) inside the sandbox."""
    rc, out, err = await run(box, [PY, "-c", code])
    assert rc == 0, err
    return json.loads(out)


def _host_pids_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


async def _until_gone(marker: str, seconds: float = 2.0) -> list[int]:
    for _ in range(int(seconds / 0.02)):
        left = _host_pids_with(marker)
        if not left:
            return []
        await asyncio.sleep(0.02)
    return _host_pids_with(marker)


# --- network ------------------------------------------------------------------------


async def test_no_network_even_to_host_loopback(sandbox: LocalSandbox) -> None:
    with socket.create_connection(("127.0.0.1", 6379), timeout=2):
        pass  # the host's Redis answers, so a failure inside means isolation
    code = (
        "import socket,json,errno\n"
        "try:\n socket.create_connection(('127.0.0.1',6379),timeout=2); r='connected'\n"
        "except OSError as e: r=errno.errorcode.get(e.errno, str(e))\n"
        "ifs=[l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
        "print(json.dumps([r, ifs]))"
    )
    result, interfaces = await py(sandbox, code)  # type: ignore[misc]
    assert result == "ECONNREFUSED"
    assert interfaces == ["lo"]


# --- processes ----------------------------------------------------------------------


async def test_no_host_pids_visible(sandbox: LocalSandbox) -> None:
    code = (
        "import os,json\n"
        "pids=[p for p in os.listdir('/proc') if p.isdigit()]\n"
        "cmds=[open(f'/proc/{p}/cmdline','rb').read().decode(errors='replace') for p in pids]\n"
        "print(json.dumps([pids, cmds]))"
    )
    pids, cmds = await py(sandbox, code)  # type: ignore[misc]
    assert len(pids) <= 3  # bwrap's init, (maybe) the python process, nothing of the host
    assert not any("pytest" in c for c in cmds), cmds


async def test_cannot_signal_a_host_process(sandbox: LocalSandbox) -> None:
    host = subprocess.Popen(["sleep", "30"])
    try:
        code = (
            f"import os,json\ntry:\n os.kill({host.pid}, 9); r='sent'\n"
            "except ProcessLookupError: r='ESRCH'\n"
            "except PermissionError: r='EPERM'\nprint(json.dumps(r))"
        )
        assert await py(sandbox, code) == "ESRCH"
        assert host.poll() is None  # still alive
    finally:
        host.kill()
        host.wait()


async def test_uid_1000_without_capabilities(sandbox: LocalSandbox) -> None:
    code = (
        "import json\n"
        "st=dict(l.split(':',1) for l in open('/proc/self/status').read().splitlines())\n"
        "print(json.dumps({k: st[k].split() for k in "
        "('Uid','Gid','CapEff','CapPrm','CapBnd','CapAmb','NoNewPrivs')}))"
    )
    status = await py(sandbox, code)
    assert isinstance(status, dict)
    assert status["Uid"] == ["1000"] * 4
    assert status["Gid"] == ["1000"] * 4
    for caps in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(status[caps][0], 16) == 0, caps
    assert status["NoNewPrivs"] == ["1"]  # bwrap sets it with --seccomp


# --- filesystem -----------------------------------------------------------------------


async def test_writes_only_in_workspace_tmp_and_home(sandbox: LocalSandbox, tmp_path: Path) -> None:
    code = (
        "import json\nout={}\n"
        "for p in ['/usr/x','/etc/passwd','/etc/x','/opt/acp-pack/x','/opt/acp-pack/agent.txt',"
        "'/x','/workspace/made','/tmp/t','/home/agent/h']:\n"
        " try: open(p,'a').write('w'); out[p]='ok'\n"
        " except OSError as e: out[p]=e.strerror\n"
        "print(json.dumps(out))"
    )
    out = await py(sandbox, code)
    assert isinstance(out, dict)
    for path in ("/usr/x", "/etc/x", "/opt/acp-pack/x"):
        assert out[path] == "Read-only file system", path
    # Existing files are read-only mounts *and* not the sandbox uid's to write.
    for path in ("/etc/passwd", "/opt/acp-pack/agent.txt"):
        assert out[path] in ("Read-only file system", "Permission denied"), path
    assert out["/x"] != "ok"
    assert (out["/workspace/made"], out["/tmp/t"], out["/home/agent/h"]) == ("ok",) * 3
    assert (tmp_path / "ws" / "made").read_text() == "w"
    assert (tmp_path / "pack" / "agent.txt").read_text() == "pack"


async def test_tmp_and_home_are_private_and_vanish(sandbox: LocalSandbox) -> None:
    marker = f"acpw-{uuid.uuid4().hex}"
    rc, _, _ = await run(
        sandbox, ["/bin/sh", "-c", f"echo x > /tmp/{marker}; echo x > /home/agent/{marker}"]
    )
    assert rc == 0
    assert not Path(f"/tmp/{marker}").exists()  # not the host's /tmp
    rc, out, _ = await run(sandbox, ["/bin/sh", "-c", f"ls /tmp /home/agent | grep -c {marker}"])
    assert out.strip() == "0"  # the next process starts with empty ones


async def test_no_root_home_no_shadow_minimal_etc(sandbox: LocalSandbox) -> None:
    code = (
        "import os,json\n"
        "print(json.dumps([os.path.exists('/root'), os.path.exists('/etc/shadow'),"
        " sorted(os.listdir('/etc')), open('/etc/passwd').read(), os.getcwd(),"
        " sorted(os.listdir('/etc/ssl')), os.path.getsize('/etc/ssl/certs/ca-certificates.crt')]))"
    )
    root, shadow, etc, passwd, cwd, ssl, bundle = await py(sandbox, code)  # type: ignore[misc]
    assert root is False
    assert shadow is False
    assert ssl == ["certs", "openssl.cnf"]  # never ssl/private
    assert bundle > 1000  # TLS clients find their CA bundle
    assert {"passwd", "group", "hosts", "ld.so.cache"} <= set(etc)
    assert not {"shadow", "gshadow", "sudoers", "resolv.conf", "ld.so.preload"} & set(etc)
    assert "agent:x:1000:1000:agent:/home/agent" in passwd
    assert cwd == "/workspace"


async def test_host_environment_not_visible(
    sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACPW_CANARY", "host-secret-canary")
    env = {**ENV, "ONLY": "this"}
    rc, out, err = await run(
        sandbox, [PY, "-c", "import os,json; print(json.dumps(dict(os.environ)))"], env
    )
    assert rc == 0, err
    # Exactly what was given, nothing inherited; bwrap itself sets PWD to the --chdir.
    assert json.loads(out) == {**env, "PWD": "/workspace"}
    assert "host-secret-canary" not in out


# --- limits ---------------------------------------------------------------------------


async def test_pids_limit_enforced(sandbox: LocalSandbox) -> None:
    pids_max = Path(sandbox.cgroups.paths[1] / "pids.max").read_text().strip()
    assert pids_max == str(PIDS_MAX)
    code = (
        "import os,json,time,errno\nn=0;err=None\n"
        "for _ in range(500):\n"
        " try: pid=os.fork()\n"
        " except OSError as e: err=errno.errorcode[e.errno]; break\n"
        " if pid==0: time.sleep(30); os._exit(0)\n"
        " n+=1\n"
        "print(json.dumps([n, err]), flush=True); os._exit(0)"
    )
    forked, err = await py(sandbox, code)  # type: ignore[misc]
    assert err == "EAGAIN"
    assert 0 < forked < PIDS_MAX
    assert subprocess.run(["/bin/true"], check=False).returncode == 0  # the host can fork


async def test_memory_limit_kills_and_is_reported(backend: LocalBackend, tmp_path: Path) -> None:
    box = await backend.create(_spec(tmp_path, memory=64 << 20))
    try:
        assert not box.oom_killed()
        rc, out, _ = await run(box, [PY, "-c", "b = bytearray(200 << 20); print('survived')"])
        assert rc == 128 + signal.SIGKILL
        assert "survived" not in out
        assert box.oom_killed()
        status = await backend.status(box.sandbox_id)
        assert status is not None
        assert status.oom_killed
    finally:
        await backend.destroy(box.sandbox_id)


# --- seccomp --------------------------------------------------------------------------

_SYSCALL_PROBE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and nr == 56:
        os._exit(0)  # a clone that got through: the child must not run the probe
    return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]
buf = ctypes.create_string_buffer(b'/tmp/x')
open('/tmp/x', 'w').close()
p = ctypes.addressof(buf)
print(json.dumps({
    'unshare_user': call(272, 0x10000000),
    'unshare_net': call(272, 0x40000000),
    'setns': call(308, 0, 0),
    'mount': call(165, p, p, p, 0, 0),
    'ptrace_traceme': call(101, 0),
    'keyctl_get_keyring': call(250, 0, -3, 0),
    'bpf': call(321, 0, 0, 0),
    'clone_newuser': call(56, 0x10000000 | 17, 0, 0, 0, 0),
    'clone3': call(435, 0, 0),
    'chmod_setuid': call(90, p, 0o4755),
    'chmod_plain': call(90, p, 0o644),
    'open_setgid': call(257, -100, p, 0o100 | 1, 0o2755),
    'io_uring_setup': call(425, 1, 0),
}))
"""


async def test_seccomp_blocks_dangerous_syscalls(sandbox: LocalSandbox) -> None:
    result = await py(sandbox, _SYSCALL_PROBE)
    assert isinstance(result, dict)
    for name in (
        "unshare_user",
        "unshare_net",
        "setns",
        "mount",
        "ptrace_traceme",  # succeeds without a filter: proves the filter is in place
        "keyctl_get_keyring",  # idem
        "bpf",
        "clone_newuser",
        "chmod_setuid",
        "open_setgid",
        "io_uring_setup",
    ):
        assert result[name] == "EPERM", name
    assert result["clone3"] == "ENOSYS"
    assert result["chmod_plain"] == "ok"  # ordinary chmod still works


async def test_unshare_command_is_refused(sandbox: LocalSandbox) -> None:
    rc, out, err = await run(sandbox, ["/usr/bin/unshare", "-U", "/bin/echo", "inside"])
    assert rc != 0
    assert "inside" not in out
    assert "Operation not permitted" in err


async def test_threads_and_subprocesses_still_work(sandbox: LocalSandbox) -> None:
    # clone for threads/fork must pass the CLONE_NEW* rules; clone3 falls back to clone.
    code = (
        "import json,subprocess,threading\nr=[]\n"
        "t=threading.Thread(target=lambda: r.append(1)); t.start(); t.join()\n"
        "out=subprocess.run(['/bin/echo','child'],capture_output=True,text=True).stdout\n"
        "print(json.dumps([r, out]))"
    )
    assert await py(sandbox, code) == [[1], "child\n"]


# --- teardown -------------------------------------------------------------------------


def _tree_script(marker: str) -> list[str]:
    # A child, a grandchild, and a double-forked daemon in its own session.
    script = (
        f"sleep 600 & "
        f"sh -c 'sleep 600; : {marker}' & "
        f"( setsid sh -c 'sleep 600; : {marker}' & ) ; "
        f"echo ready; sleep 600; : {marker}"
    )
    return ["/bin/sh", "-c", script]


async def test_killing_bwrap_kills_everything_inside(sandbox: LocalSandbox) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    proc = await sandbox.spawn(_tree_script(marker), env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"
    assert len(_host_pids_with(marker)) >= 3
    os.kill(proc.pid, signal.SIGKILL)  # bwrap only, as if the worker killed it
    await proc.wait()
    assert await _until_gone(marker) == []


async def test_destroy_leaves_no_process_and_no_cgroup(
    backend: LocalBackend, tmp_path: Path
) -> None:
    box = await backend.create(_spec(tmp_path))
    marker = f"marker-{uuid.uuid4().hex}"
    proc = await box.spawn(_tree_script(marker), env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"
    await backend.destroy(box.sandbox_id)
    assert _host_pids_with(marker) == []
    assert await proc.wait() != 0
    assert not any(p.exists() for p in box.cgroups.paths)
    assert await backend.list({}) == []


async def test_second_backend_lists_and_destroys(tmp_path: Path, etc_dir: Path) -> None:
    worker = _backend(tmp_path, etc_dir)
    box = await worker.create(_spec(tmp_path))
    marker = f"marker-{uuid.uuid4().hex}"
    proc = await box.spawn(_tree_script(marker), env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"ready\n"

    reaper = LocalBackend(LocalConfig(cgroup_parent="acpw-test"), state_dir=tmp_path / "state")
    found = await reaper.list({"suite": "containment", "acpw.job": "contain"})
    assert [i.sandbox_id for i in found] == [box.sandbox_id]
    assert await reaper.list({"suite": "other"}) == []
    status = await reaper.status(box.sandbox_id)
    assert status is not None
    assert status.running
    await reaper.destroy(box.sandbox_id)

    assert _host_pids_with(marker) == []
    assert await proc.wait() != 0
    assert await reaper.list({}) == []
    await worker.destroy(box.sandbox_id)  # idempotent from the original owner too
    assert await worker.status(box.sandbox_id) is None


async def test_destroy_racing_a_fresh_spawn_leaves_nothing(
    backend: LocalBackend, tmp_path: Path
) -> None:
    box = await backend.create(_spec(tmp_path))
    marker = f"marker-{uuid.uuid4().hex}"
    proc = await box.spawn(_tree_script(marker), env=ENV)
    await backend.destroy(box.sandbox_id)  # before the wrapper may even have joined
    # Either it joined the cgroups and was killed, or it found them gone and never ran.
    assert await asyncio.wait_for(proc.wait(), 10) in (125, -signal.SIGKILL)
    assert await _until_gone(marker) == []


# --- host identity (the worker is root here; the sandbox is not) ----------------------

SANDBOX_HOST = (61000, 61000)  # Settings' default sandbox_host_uid/gid


def _host_ids(pid: int) -> dict[str, list[str]]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.split() for k, v in (line.split(":", 1) for line in status)}


async def test_sandbox_runs_as_the_unprivileged_host_uid(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    assert os.geteuid() == 0, "this suite runs as root, as the worker does here"
    proc = await sandbox.spawn(["/bin/sh", "-c", "echo x > made; echo up; sleep 60"], env=ENV)
    assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
    made = tmp_path / "ws" / "made"
    assert (made.stat().st_uid, made.stat().st_gid) == SANDBOX_HOST
    # bwrap itself and every process under it, as the host sees them.
    for pid in (proc.pid, *descendants(proc.pid)):
        ids = _host_ids(pid)
        assert ids["Uid"] == [str(SANDBOX_HOST[0])] * 4, pid
        assert ids["Gid"] == [str(SANDBOX_HOST[1])] * 4, pid
        assert ids["Groups"] == [], pid
    proc.kill()
    await proc.wait()


async def test_root_only_files_stay_unreadable(sandbox: LocalSandbox, tmp_path: Path) -> None:
    # Before the uid drop the sandbox's uid 1000 *was* host root, so it owned these.
    ws = tmp_path / "ws"
    (ws / "root-secret").write_text("s3cret")
    os.chmod(ws / "root-secret", 0o600)
    (ws / "root-dir").mkdir(mode=0o700)
    (ws / "root-dir" / "f").write_text("x")
    code = (
        "import json,os\nout={}\n"
        "st=os.stat('root-secret'); out['owner']=[st.st_uid, st.st_gid]\n"
        "for name,f in [('read',lambda: open('root-secret').read()),"
        "('chmod',lambda: os.chmod('root-secret',0o644)),"
        "('list',lambda: os.listdir('root-dir')),"
        "('unlink',lambda: os.unlink('root-secret'))]:\n"
        " try: f(); out[name]='ok'\n"
        " except OSError as e: out[name]=e.strerror\n"
        "print(json.dumps(out))"
    )
    out = await py(sandbox, code)
    assert out == {
        "read": "Permission denied",
        "chmod": "Operation not permitted",
        "list": "Permission denied",
        # The workspace dir is the sandbox's, so it may remove entries: that is the
        # directory owner's right, not access to the file.
        "unlink": "ok",
        "owner": [65534, 65534],  # host root is unmapped inside
    }


async def test_sources_under_private_root_dirs_are_bound(tmp_path: Path, etc_dir: Path) -> None:
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)  # like a pack cache under /root
    (private / "pack").mkdir()
    (private / "pack" / "agent.txt").write_text("from a 0700 parent")
    spec = _spec(tmp_path, pack_closure=private / "pack")
    backend = _backend(tmp_path, etc_dir)
    box = await backend.create(spec)
    try:
        assert (await run(box, ["/bin/cat", "/opt/acp-pack/agent.txt"]))[1] == "from a 0700 parent"
        stage = backend.store.read(box.sandbox_id).stage  # type: ignore[union-attr]
        assert stage is not None
        assert list((stage / "workspace").iterdir()) == []  # staged mounts: not on the host
    finally:
        await backend.destroy(box.sandbox_id)
    assert not stage.exists()
    assert str(stage) not in Path("/proc/self/mountinfo").read_text()  # namespace freed


async def test_create_refuses_a_workspace_the_sandbox_cannot_write(
    backend: LocalBackend, tmp_path: Path
) -> None:
    spec = _spec(tmp_path)
    os.chown(spec.workspace, 0, 0)
    with pytest.raises(SandboxError, match="owned by uid 0, not by the sandbox host uid 61000"):
        await backend.create(spec)
    assert await backend.list({}) == []


async def test_no_host_descriptor_leaks_inside(sandbox: LocalSandbox) -> None:
    code = "import os,json; print(json.dumps(sorted(os.listdir('/proc/self/fd'))))"
    assert await py(sandbox, code) == ["0", "1", "2", "3"]  # 3: the listing itself


async def test_tmpfs_fill_stops_at_its_bound(backend: LocalBackend, tmp_path: Path) -> None:
    bound = 8 << 20
    spec = _spec(tmp_path, tmpfs_bytes=bound)
    box = await backend.create(spec)
    code = (
        "import json,os\nres={}\n"
        "for d in ('/tmp','/home/agent'):\n"
        " n=0; err=None\n"
        " with open(d+'/fill','wb') as f:\n"
        "  try:\n"
        "   while n < 64<<20: f.write(b'x'*65536); f.flush(); n+=65536\n"
        "  except OSError as e: err=e.strerror\n"
        " res[d]=[os.path.getsize(d+'/fill'), err]\n"
        "print(json.dumps(res))"
    )
    try:
        out = await py(box, code)
        assert isinstance(out, dict)
        for d in ("/tmp", "/home/agent"):
            size, err = out[d]
            assert err == "No space left on device", d
            assert bound - (1 << 20) <= size <= bound, d
        assert not box.oom_killed()
    finally:
        await backend.destroy(box.sandbox_id)
