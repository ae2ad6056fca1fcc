"""Qualification against real Cursor: full turns through ``acp-worker run`` with the locked
``cursor`` pack and a real ``CURSOR_API_KEY`` (``make qualify-cursor``).

Skipped without the key (nothing here can run offline, and nothing is qualified then).
With it, on a machine with internet: the pack must be locked (``pack_unlocked`` otherwise,
with the command); ``agent --version`` is read in a sandbox from the verified closure;
then real turns: a text reply, a file written (checked by the worker's ``expect`` from
the captured workspace changes, never from the agent's text), a shell command, and a
cancel during a turn. Every turn's outcome, the version and the hosts allowed go to
``$CURSOR_QUALIFY_OUT`` (default ``tests/conformance/results/cursor-<version>.json``):
the evidence ``docs/status.md`` asks for. Each turn costs real model usage, which ACP
does not report (usage stays ``available: false``); use a key with a spend limit.

``CURSOR_QUALIFY_HOSTS`` (comma-separated ``host:port``) adds hosts to the jobs'
network allowlist beyond the pack's ``launch.hosts``; a host the agent needed and was
refused shows up as a ``network_denied`` notice in the recorded results.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.agents import REPO, events, of_type
from worker.packs.contract import program
from worker.packs.manifest import Pack, load_pack
from worker.packs.runtime import prepare_pack
from worker.settings import Settings

pytestmark = pytest.mark.conformance

KEY = "CURSOR_API_KEY"
if not os.environ.get(KEY):
    pytest.skip(
        f"{KEY} is not set: no turn ran against real Cursor, nothing is qualified "
        "(make qualify-cursor on a machine with internet and a Cursor API key)",
        allow_module_level=True,
    )

PACK = os.environ.get("CURSOR_QUALIFY_PACK", "cursor")
RESULTS: dict[str, Any] = {"pack": PACK, "turns": {}}


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(cache_dir=Path(os.environ.get("ACPW_CACHE_DIR") or
                                   tmp_path_factory.mktemp("cursor-cache")))  # fmt: skip


@pytest.fixture(scope="module")
def pack(settings: Settings) -> Iterator[Pack]:
    declared = load_pack(settings.packs_dir, PACK)
    declared.refuse_unlocked()  # pack_unlocked names the one command that locks it
    RESULTS["closure_digest"] = declared.for_platform().pin.closure.digest
    yield declared
    _write_results()


def _write_results() -> None:
    version = RESULTS.get("agent_version", "unknown")
    default = REPO / "tests" / "conformance" / "results" / f"cursor-{version}.json"
    out = Path(os.environ.get("CURSOR_QUALIFY_OUT") or default)
    out.parent.mkdir(parents=True, exist_ok=True)
    RESULTS["recorded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.write_text(json.dumps(RESULTS, indent=1, sort_keys=True) + "\n")


@contextmanager
def _turn(name: str, stream: list[dict[str, Any]]) -> Iterator[None]:
    """Record turn *name*: its outcome, error and network denials, pass or fail."""
    record: dict[str, Any] = {"outcome": "failed"}
    RESULTS["turns"][name] = record
    try:
        yield
        record["outcome"] = "passed"
    except AssertionError as exc:
        record["assertion"] = str(exc)[:2000]
        raise
    finally:
        done = of_type(stream, "job.completed")
        if done:
            record["status"] = done[-1].get("status")
            record["error"] = done[-1].get("error")
        record["network_denied"] = [
            n for n in of_type(stream, "notice") if n.get("code") == "network_denied"
        ]


def _hosts(pack: Pack) -> list[str]:
    extra = [h.strip() for h in os.environ.get("CURSOR_QUALIFY_HOSTS", "").split(",")]
    hosts = [*(pack.manifest.launch.hosts or []), *(h for h in extra if h)]
    RESULTS["hosts"] = hosts
    return hosts


def _job(tmp_path: Path, pack: Pack, prompt: str, **extra: Any) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# qualification workspace\n")
    job = {
        "v": 1,
        "job_id": f"qualify-{tmp_path.name[-16:]}".replace("_", "-"),
        "pack": {"name": PACK},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": prompt,
        "credentials": {KEY: f"env:{KEY}"},
        "permissions": {"policy": "allow_all"},
        "network": {"mode": "allowlist", "allow": _hosts(pack)},
        "limits": {"timeout_s": 180, "memory_mb": 2048, "pids": 512},
        **extra,
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def _env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env |= {
        "ACPW_CACHE_DIR": str(settings.cache_dir),
        "ACPW_PACKS_DIR": str(settings.packs_dir),
        "ACPW_WORK_DIR": str(tmp_path / "work"),
        "ACPW_SECRET_SOURCES": "env,file",
    }
    return env


def _run(settings: Settings, tmp_path: Path, job: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        capture_output=True, text=True, timeout=300, env=_env(settings, tmp_path), cwd=REPO,
    )  # fmt: skip
    return events(done.stdout)


def _text(stream: list[dict[str, Any]]) -> str:
    return "".join(d["text"] for d in of_type(stream, "message.delta") if d["role"] == "assistant")


def test_agent_version_is_read_from_the_verified_closure(settings: Settings, pack: Pack) -> None:
    from worker.sandbox.config import LocalConfig
    from worker.sandbox.local import LocalBackend

    prepared = prepare_pack(settings, pack)
    argv = [*program(prepared.launch_plan({}).argv), "--version"]
    out = asyncio.run(_in_sandbox(LocalBackend(LocalConfig.from_settings(settings)),
                                  prepared.closure, argv))  # fmt: skip
    RESULTS["agent_version"] = out
    assert out[:4].isdigit(), out  # YYYY.MM.DD-<sha>


async def _in_sandbox(backend: Any, closure: Path, argv: list[str]) -> str:
    from worker.launch import BASE_ENV
    from worker.sandbox.base import ResourceLimits, SandboxSpec

    workspace = Path(tempfile.mkdtemp(prefix="qualify-version-"))
    os.chown(workspace, *backend.stage_owner())  # the sandbox's uid when run as root
    spec = SandboxSpec(
        job_id="qualify-version", attempt=1, workspace=workspace, pack_closure=closure,
        limits=ResourceLimits(memory_bytes=1 << 30, cpus=1.0, pids=256), labels={},
    )  # fmt: skip
    sandbox = await backend.create(spec)
    try:
        proc = await sandbox.spawn(argv, env=dict(BASE_ENV))
        out = await asyncio.wait_for(proc.stdout.read(), 60)
        await proc.wait()
        return out.decode().strip()
    finally:
        await backend.destroy(sandbox.sandbox_id)
        shutil.rmtree(workspace, ignore_errors=True)


def test_a_text_turn(settings: Settings, pack: Pack, tmp_path: Path) -> None:
    stream: list[dict[str, Any]] = []
    with _turn("text", stream):
        stream += _run(settings, tmp_path, _job(tmp_path, pack, "Reply with the single word: pong"))
        done = of_type(stream, "job.completed")[-1]
        assert (done["status"], done.get("stop_reason")) == ("succeeded", "end_turn")
        assert "pong" in _text(stream).lower()
        assert of_type(stream, "usage.reported") == [{"available": False}]


def test_a_file_write_turn(settings: Settings, pack: Pack, tmp_path: Path) -> None:
    stream: list[dict[str, Any]] = []
    prompt = "Create a file named qualify.txt in the current directory containing: cursor-ok"
    expect = {"expect": {"files": ["qualify.txt"], "tool_calls": 1}}
    with _turn("file_write", stream):
        stream += _run(settings, tmp_path, _job(tmp_path, pack, prompt, **expect))
        assert of_type(stream, "job.completed")[-1]["status"] == "succeeded"
        changed = of_type(stream, "workspace.changed")
        assert any(p["path"] == "qualify.txt" for p in changed[-1]["paths"])


def test_a_shell_turn(settings: Settings, pack: Pack, tmp_path: Path) -> None:
    stream: list[dict[str, Any]] = []
    prompt = "Run the shell command `echo qualify-$((6*7))` and reply with its output only."
    with _turn("shell", stream):
        stream += _run(settings, tmp_path, _job(tmp_path, pack, prompt,
                                                expect={"tool_calls": 1}))  # fmt: skip
        assert of_type(stream, "job.completed")[-1]["status"] == "succeeded"
        kinds = [t.get("kind") for t in of_type(stream, "tool.started")]
        assert "execute" in kinds, kinds
        assert "qualify-42" in _text(stream)


def test_a_cancel_during_a_turn(settings: Settings, pack: Pack, tmp_path: Path) -> None:
    stream: list[dict[str, Any]] = []
    prompt = "Run the shell command `sleep 60`, then reply: done"
    job = _job(tmp_path, pack, prompt)
    with _turn("cancel", stream):
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
            stdout=subprocess.PIPE, text=True, env=_env(settings, tmp_path), cwd=REPO,
        )  # fmt: skip
        assert proc.stdout is not None
        interrupted = False
        for line in proc.stdout:
            stream.append(json.loads(line))
            if stream[-1]["type"] == "tool.started" and not interrupted:
                proc.send_signal(signal.SIGINT)  # `run` cancels the job (a 2nd: exit now)
                interrupted = True
        proc.wait(timeout=120)
        assert of_type(stream, "job.completed")[-1]["status"] == "cancelled"
