"""Real npm agents complete real turns against our scripted fake model APIs.

Each agent (claude-agent-acp, codex-acp, gemini-cli) runs from its pinned pack closure as
a real process, HOME in a tmp dir, pointed at a fake (``tests/fake_models``) on 127.0.0.1,
driven directly over ACP stdio (``real_agents.py``; not through the worker): what each
agent does on its own, outside our sandbox. Text, reading, writing and editing under
permissions, shell commands and cancel are checked through the worker, per agent, in
``test_full_turns.py``; here only what that cannot show:

- ``history``: a second prompt in the same session; the fake sees the first turn;
- ``no_other_host``: a recording proxy in HTTPS_PROXY sees no host but the fake;
- ``load_from_the_kept_files_alone`` (packs declaring ``launch.sessions``): a fresh HOME
  holding only the session's declared files is enough for ``session/load``.

No sleeps: each wait is a turn's end (``session/prompt`` answered), bounded at 60 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_models import FakeModel, Reply, say
from tests.fake_models.proxy import RecordingProxy
from tests.integration.agent_tools import TOOLS
from tests.integration.real_agents import (
    ENDPOINTS,
    REPO,
    Session,
    agent_session,
    extract_closure,
)
from worker.packs.manifest import load_pack
from worker.safetree import Bounds
from worker.sessions import SessionStore
from worker.sessions.files import Selection

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(180)]

SECRET = "the secret word is marmalade"
WRITTEN = "written by the fake model\n"
PACKS = sorted(ENDPOINTS)


@pytest.fixture(scope="session")
def closures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fake-model-closures")
    yield root
    subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
    shutil.rmtree(root, ignore_errors=True)


def _closure(pack: str, closures: Path) -> Path:
    archive = Path(__file__).resolve().parents[2] / "provider_packs" / pack / "dist"
    if not any(archive.glob("*.tar")):
        pytest.skip(f"pack {pack} is not built (make packs)")
    return extract_closure(pack, closures)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text(SECRET + "\n")
    return ws


def _explain(fake: FakeModel, session: Session | None = None) -> str:
    lines = [f"{r.method} {r.path} main={r.main}" for r in fake.requests]
    lines += [f"unknown: {r.method} {r.path}" for r in fake.unknown]
    lines += [f"fake error: {e}" for e in fake.errors]
    if session is not None:
        lines.append(f"updates: {session.kinds()}")
        lines.append(f"stderr: {session.stderr.read_text()[-2000:]}")
    return "\n".join(lines)


async def _run(
    pack: str,
    closures: Path,
    tmp_path: Path,
    workspace: Path,
    script: list[Reply],
    *prompts: str,
    mode: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[FakeModel, Session, list[str]]:
    fake = ENDPOINTS[pack].fake(script)
    with fake:
        async with agent_session(
            pack,
            _closure(pack, closures),
            tmp_path,
            fake,
            workspace=workspace,
            extra_env=extra_env,
        ) as session:
            if mode is not None:
                await session.client.set_mode(session.session_id, mode)
            stops = [await session.prompt(p) for p in prompts]
    assert not fake.errors, _explain(fake, session)
    assert not fake.script, f"unconsumed script {fake.script}\n{_explain(fake, session)}"
    return fake, session, stops


@pytest.mark.parametrize("pack", PACKS)
async def test_history(pack: str, closures: Path, tmp_path: Path, workspace: Path) -> None:
    script = [say("First answer: apricot"), say("Second answer: quince")]
    fake, session, stops = await _run(
        pack, closures, tmp_path, workspace, script, "First question", "Second question"
    )
    assert stops == ["end_turn", "end_turn"]
    first, second = fake.main_requests
    assert "apricot" not in first.text
    for earlier in ("First question", "First answer: apricot", "Second question"):
        assert earlier in second.text, f"{earlier!r} not in the second request"
    assert session.said().endswith("Second answer: quince")
    assert json.dumps(second.body).count("First question") >= 1


@pytest.mark.parametrize("pack", PACKS)
async def test_no_other_host(pack: str, closures: Path, tmp_path: Path, workspace: Path) -> None:
    """Configured as ``ENDPOINTS`` says, a turn (reading a file, so tools run too) tries
    no host but the fake: a recording proxy in HTTPS_PROXY/HTTP_PROXY sees nothing. (Without
    that configuration it sees claude → api.anthropic.com, codex → github.com,
    api.github.com, chatgpt.com, gemini → play.googleapis.com: docs/agents-endpoints.md.)"""
    proxy = RecordingProxy().start()
    try:
        script = [TOOLS[pack].read(workspace / "notes.txt"), say("Done")]
        await _run(pack, closures, tmp_path, workspace, script, "Go", extra_env=proxy.env())
    finally:
        proxy.stop()
    assert proxy.attempts == []


RESUMABLE = [p for p in PACKS if load_pack(REPO / "provider_packs", p).manifest.launch.sessions]


@pytest.mark.parametrize("pack", RESUMABLE)
async def test_load_from_the_kept_files_alone(
    pack: str, closures: Path, tmp_path: Path, workspace: Path
) -> None:
    """What the pack's ``launch.sessions`` declares is all ``session/load`` needs: the
    session's files, saved by the worker's store and restored into a fresh HOME (nothing
    else of the first HOME: no config, state databases or caches), load, and the next
    model request carries the first turn (docs/sessions.md)."""
    files = load_pack(REPO / "provider_packs", pack).manifest.launch.sessions
    assert files is not None
    closure = _closure(pack, closures)
    store = SessionStore(tmp_path / "store", Bounds(max_bytes=1 << 24, max_entries=1000))
    with ENDPOINTS[pack].fake([say("First answer: apricot")]) as fake:
        async with agent_session(
            pack, closure, tmp_path, fake, workspace=workspace, home=tmp_path / "one"
        ) as session:
            assert await session.prompt("First question: remember tangerine") == "end_turn"
            session_id = session.session_id
    kept = Selection(files.keep, session_id)
    store.save(pack, session_id, tmp_path / "one" / files.dir, kept)
    assert kept.matched, _explain(fake, session)
    fresh = tmp_path / "two" / files.dir
    fresh.parent.mkdir(parents=True)
    store.restore(pack, session_id, fresh, None, Selection(files.keep, session_id))
    with ENDPOINTS[pack].fake([say("Second answer: quince")]) as fake:
        async with agent_session(
            pack,
            closure,
            tmp_path,
            fake,
            workspace=workspace,
            home=tmp_path / "two",
            resume=session_id,
        ) as session:
            assert await session.prompt("Second question") == "end_turn"
    [request] = fake.main_requests
    for earlier in ("remember tangerine", "First answer: apricot", "Second question"):
        assert earlier in request.text, f"{earlier!r} not in the request after the load"


@pytest.mark.parametrize("pack", RESUMABLE)
async def test_the_turn_is_recorded_when_it_is_answered(
    pack: str, closures: Path, tmp_path: Path, workspace: Path
) -> None:
    """A pack that does not declare ``launch.sessions.recorded_after_answer`` has the whole
    turn in its recording the moment ``session/prompt`` is answered, so a teardown that
    closes stdin at once loses nothing. For claude-agent-acp that is its pack's
    ``CLAUDE_CODE_EAGER_FLUSH``: without it the CLI's transcript writes wait on a 100 ms
    timer and land 40-70 ms after the answer (docs/agents-endpoints.md)."""
    files = load_pack(REPO / "provider_packs", pack).manifest.launch.sessions
    assert files is not None
    if files.recorded_after_answer:
        pytest.skip(f"{pack} records its turn after answering it, and says so")
    home = tmp_path / "home"
    with ENDPOINTS[pack].fake([say("The answer is persimmon")]) as fake:
        async with agent_session(
            pack, _closure(pack, closures), tmp_path, fake, workspace=workspace, home=home
        ) as session:
            assert await session.prompt("Name a fruit") == "end_turn"
            # Read before the agent is stopped: what a teardown would find right now.
            recorded = "".join(
                path.read_text(errors="replace")
                for path in sorted((home / files.dir).rglob(f"*{session.session_id}*"))
                if path.is_file()
            )
    assert "Name a fruit" in recorded, _explain(fake, session)
    assert "The answer is persimmon" in recorded, _explain(fake, session)


#: When an agent reads the workspace's project memory file and git state: at the prompt
#: (docs/sessions.md, "Opening the session before the workspace"). claude-agent-acp is not
#: here: the Claude Code process ``session/new`` starts reads them as it starts, racing a
#: change made after ``session/new`` (seen both ways), so no test can pin when.
READ_AT = {"codex-acp": "prompt"}
MEMORY = {"codex-acp": "AGENTS.md"}


def _commit(ws: Path, message: str) -> str:
    """Commit everything in ``ws`` (a repository made on the first call): the short hash."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    if not (ws / ".git").exists():
        subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    subprocess.run([*git, "add", "."], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=ws, check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], cwd=ws, check=True, capture_output=True)
    return head.stdout.decode()[:7]


@pytest.mark.parametrize("pack", sorted(READ_AT))
async def test_when_the_session_reads_the_workspace(
    pack: str, closures: Path, tmp_path: Path, workspace: Path
) -> None:
    memory = workspace / MEMORY[pack]
    memory.write_text("Project rule: rule-at-open\n")
    commits = {"open": _commit(workspace, "first")}
    fake = ENDPOINTS[pack].fake([say("hello")])
    with fake:
        async with agent_session(
            pack, _closure(pack, closures), tmp_path, fake, workspace=workspace
        ) as session:
            # Between session/new and the prompt: the memory file and the HEAD change.
            memory.write_text("Project rule: rule-at-prompt\n")
            commits["prompt"] = _commit(workspace, "second")
            assert await session.prompt("Say hello.") == "end_turn"
    (request,) = fake.main_requests
    seen = {m for m in ("rule-at-open", "rule-at-prompt") if m in request.text}
    heads = {when for when, short in commits.items() if short in request.text}
    when = "open" if READ_AT[pack] == "session/new" else "prompt"
    assert seen == {f"rule-at-{when}"}, _explain(fake, session)
    assert heads == {when}, _explain(fake, session)
