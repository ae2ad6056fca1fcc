"""Shared fixtures: a real Redis (started by bootstrap or CI), flushed per test."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings

from worker.workspace.disk import unmount_below

# Property tests run the same examples every time (derandomize, no example database) and
# never fail on how long the machine took (these 2-core hosts are shared and noisy): a
# test that passes only sometimes is a failing test.
settings.register_profile(
    "acpw",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("acpw")

REPO = Path(__file__).resolve().parent.parent
# Every process this session starts inherits the mark (tests that build a child's
# environment keep what is not ACPW_*), so what it left running is told from what other
# sessions on this machine run, even once reparented to init.
SESSION_MARK = "PYTEST_ACPW_SESSION"
# A program a test runs that imports this module (a benchmark importing a test's helpers)
# is not a session of its own: it keeps the mark and the temp dir it inherited, or the
# session would lose sight of what it starts and find an empty folder of its making.
_ARGV0 = Path(sys.argv[0])
_A_SESSION = _ARGV0.name in ("pytest", "py.test") or _ARGV0.parent.name == "pytest"
_INHERITED = Path(tempfile.gettempdir())
_NESTED = not _A_SESSION and _INHERITED.name.startswith("acpw-tests-")
if not (_NESTED and SESSION_MARK in os.environ):
    os.environ[SESSION_MARK] = uuid.uuid4().hex
# The session's temp dir, which every process it starts inherits (``TMPDIR``), set before
# any test runs: what the code under test leaves there is told apart from what other
# sessions and programs on this machine leave in /tmp. pytest's own ``tmp_path`` folders
# stay where they were (its basetemp, which pytest keeps for the last three sessions and
# removes itself): ``PYTEST_DEBUG_TEMPROOT`` pins that to the temp dir as it was.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
if _NESTED:
    SESSION_TMPDIR = _INHERITED
else:
    SESSION_TMPDIR = Path(tempfile.mkdtemp(prefix="acpw-tests-"))  # short: sockets go there
    # As /tmp is (sticky, anyone's): a test dropping to another uid still reaches it.
    SESSION_TMPDIR.chmod(0o1777)
os.environ["TMPDIR"] = str(SESSION_TMPDIR)
tempfile.tempdir = str(SESSION_TMPDIR)
#: The worker's own processes: none may outlive the session that started it.
OURS = ("acp-worker", "-m worker.cli", "-m celery", "[celeryd")
# A dedicated database so tests never touch what else uses this Redis.
REDIS_URL = os.environ.get("ACPW_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:  # CI must have started one
        pytest.fail(f"no Redis at {REDIS_URL}: {exc}")
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


#: What a module made at import and must remove by the session's end (``at_session_end``).
_AT_END: list[Callable[[], None]] = []


def at_session_end(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Registers ``cleanup`` to run as the session ends, before its checks (an ``atexit``
    handler would run after them: what it removes would count as left behind)."""
    _AT_END.append(cleanup)
    return cleanup


def left_running(mark: str) -> list[str]:
    """The worker processes (``OURS``) still running that carry ``mark`` in their
    environment: started by this session, directly or not."""
    found = []
    needle = f"{SESSION_MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if stat[stat.rfind(")") + 2] == "Z" or needle not in environ:
            continue
        if any(ours in cmdline for ours in OURS):
            found.append(f"{entry.name}: {cmdline.strip()[:200]}")
    return found


def left_in_tmpdir(folder: Path) -> list[str]:
    """What is still in the session's temp dir, one line each (type and path), deepest
    levels summarised: a file, a socket, a folder and how many entries it holds."""
    found = []
    for entry in sorted(folder.iterdir()):
        try:
            if entry.is_symlink() or not entry.is_dir():
                kind = "socket" if entry.is_socket() else "file"
                found.append(f"{kind}: {entry}")
            else:
                found.append(f"folder: {entry} ({sum(1 for _ in entry.rglob('*'))} entries)")
        except OSError as exc:  # unreadable: still left behind
            found.append(f"{type(exc).__name__}: {entry}")
    return found


def settle_tmpdir(folder: Path) -> list[str]:
    """What was left in ``folder`` (``left_in_tmpdir``); when nothing, it is removed."""
    leftovers = left_in_tmpdir(folder) if folder.is_dir() else []
    if not leftovers:
        shutil.rmtree(folder, ignore_errors=True)
    return leftovers


def _report(session: pytest.Session, title: str, lines: list[str]) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", title, red=True)
        for line in lines:
            reporter.write_line(line, red=True)
    if session.exitstatus == 0:
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _nothing_mounted_in_tmp_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's ``tmp_path`` is left with nothing mounted in it: a served worker stopped
    right after a job's ``job.completed`` leaves that job's workspace disk mounted for
    the reaper (which such a test does not run), and a mounted directory holds its loop
    device and cannot be removed."""
    # Asked for here, so it is torn down after this fixture, not before.
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        unmount_below(tmp)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run of the suite leaves no worker process behind (a ``serve`` or ``run`` a test
    started, a pool process, a reaper) and nothing in its temp dir (a folder from
    ``tempfile``, a ``pymp-*`` of multiprocessing, a socket): either fails the session.
    A clean temp dir is removed; one with leftovers is kept, named, for a look."""
    while _AT_END:
        _AT_END.pop()()
    left = left_running(os.environ[SESSION_MARK])
    if left:
        _report(session, "worker processes this session left running", left)
    leftovers = settle_tmpdir(SESSION_TMPDIR)
    if leftovers:
        _report(session, f"left in the session's temp dir {SESSION_TMPDIR}", leftovers)
