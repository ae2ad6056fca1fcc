"""An agent that records a turn only after answering it keeps its session (issue 14, item 3).

claude-agent-acp's CLI, a child process, wrote the transcript 40-70 ms after the answer by default;
on stdin EOF its parent stops it and exits at once, and in bubblewrap nothing outlives
the parent (the pid namespace goes with it). A teardown that closed stdin right after the
answer lost the session now and then, by timing. The peer here does the same thing, only
later (a child writes the record 300 ms after the answer; the parent exits on EOF at
once), so without the wait for ``launch.sessions.recorded_after_answer`` its session is
lost every time, and with it, every time kept.

The agent is a small peer script run as the pack's program in real bubblewrap (the
emulator pack's closure, another ``launch``), not the emulator, whose bytes are pinned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.hungry_pack import emulator_variant

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
SESSION = "late-1"

# Answers initialize, session/new and session/prompt; after answering a prompt, a child
# writes ~/.late/<session>.jsonl DELAY seconds later (DELAY < 0: never); on stdin EOF the
# parent exits at once, as claude-agent-acp does.
PEER = textwrap.dedent(
    """
    import json, os, sys, time

    DELAY = float(sys.argv[1])
    out = sys.stdout.buffer

    def send(obj):
        out.write(json.dumps(obj).encode() + b"\\n")
        out.flush()

    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        method = msg.get("method")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"sessionId": "SESSION"}})
        elif method == "session/prompt":
            send({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": "SESSION", "update": {"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "noted"}}}})
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {"stopReason": "end_turn"}})
            if DELAY >= 0 and os.fork() == 0:
                time.sleep(DELAY)
                folder = os.path.join(os.environ["HOME"], ".late")
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, "SESSION.jsonl"), "w") as f:
                    f.write(json.dumps({"turn": 1, "said": "noted"}) + "\\n")
                os._exit(0)
    os._exit(0)
    """
).replace("SESSION", SESSION)


def _run(tmp_path: Path, delay: float, *, settle_s: float) -> tuple[int, list[dict[str, Any]]]:
    sessions = {"dir": ".late", "keep": ["{session}.jsonl"], "recorded_after_answer": True}
    packs = emulator_variant(
        tmp_path,
        argv=["/usr/bin/python3", "-c", PEER, str(delay)],
        session_store=None,
        sessions=sessions,
    )
    (tmp_path / "ws").mkdir()
    job = {
        "v": 1,
        "job_id": f"settle-{tmp_path.name[-16:]}".replace("_", "-"),
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": "Remember the code word.",
        "limits": {"timeout_s": 60, "memory_mb": 256, "pids": 64},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        ACPW_PACKS_DIR=str(packs),
        ACPW_CACHE_DIR=str(tmp_path / "cache"),
        ACPW_WORK_DIR=str(tmp_path / "work"),
        ACPW_RESULTS_DIR=str(tmp_path / "results"),
        ACPW_SESSION_DIR=str(tmp_path / "sessions"),
        ACPW_SESSION_SETTLE_S=str(settle_s),
    )
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"), "--json"],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=REPO,
        check=False,
    )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return result.returncode, events


def _notices(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == code]


def test_a_session_recorded_after_the_answer_is_kept(tmp_path: Path) -> None:
    # The bound is far above the peer's 300 ms: the wait ends when the file is written.
    code, events = _run(tmp_path, 0.3, settle_s=60)
    assert code == 0, events[-3:]
    assert events[-1]["data"]["status"] == "succeeded"
    kept = tmp_path / "sessions" / "cursor-emulator" / SESSION / f"{SESSION}.jsonl"
    assert json.loads(kept.read_text()) == {"turn": 1, "said": "noted"}
    assert not _notices(events, "session_not_saved")


def test_an_answered_session_never_recorded_is_said(tmp_path: Path) -> None:
    code, events = _run(tmp_path, -1, settle_s=0.2)
    assert code == 0, events[-3:]
    assert events[-1]["data"]["status"] == "succeeded"  # the job's outcome is unchanged
    [notice] = _notices(events, "session_not_saved")
    assert notice["details"] == {"session_id": SESSION, "reason": "not_recorded"}
    assert "~/.late" in notice["message"]
    assert not (tmp_path / "sessions" / "cursor-emulator" / SESSION).exists()
