"""``--json`` means one line of JSON on every error: a bad ``ACPW_*`` value (the worker's
own settings, a sandbox backend's, a list or a map that is not JSON) and a usage error
each end every command with exactly one line on stderr, ``{"error": {code, message,
details?}}``, nothing on stdout, exit 2, and never quote the value (it may hold a
secret). The real CLI in a real subprocess, with only the variables each case sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-tok-9f2e"
#: An endpoint URL carrying a credential in its user info and its query.
BAD_ENDPOINTS = json.dumps(
    {"gw": {"packs": ["codex-acp"], "url": f"https://ops:{SECRET}@gw.corp:8443/v1?key={SECRET}"}}
)
REDIS = "redis://127.0.0.1:9/0"  # never reached: each case fails before


def _job(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir(exist_ok=True)
    job = {
        "v": 1,
        "job_id": "cli-json-errors",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": str(tmp_path / "ws")},
        "prompt": "hi",
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


COMMANDS = [
    "run",
    "schema",
    "serve",
    "reap",
    "ready",
    "submit",
    "events",
    "status",
    "cancel",
    "requeue",
    "answer",
    "interactions",
    "pack",
    "admission",
    "image",
    "agents",
    "budget",
]


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    job = str(_job(tmp_path))
    answer = tmp_path / "answer.json"
    answer.write_text('{"outcome": "cancelled"}')
    return {
        "run": ["run", job],
        "schema": ["schema"],
        "serve": ["serve", "--redis", REDIS],
        "reap": ["reap", "--redis", REDIS],
        "ready": ["ready", "--redis", REDIS],
        "submit": ["submit", job, "--redis", REDIS],
        "events": ["events", "j", "--redis", REDIS],
        "status": ["status", "j", "--redis", REDIS],
        "cancel": ["cancel", "j", "--redis", REDIS],
        "requeue": ["requeue", "j", "--redis", REDIS],
        "answer": ["answer", "j", "i", str(answer), "--redis", REDIS],
        "interactions": ["interactions", "j", "--redis", REDIS],
        "pack": ["pack", "verify", "cursor-emulator", "--cache", str(tmp_path / "cache")],
        "admission": ["admission", "check", str(tmp_path / "ws")],
        "image": ["image", "resolve", "cursor-emulator"],
        "agents": ["agents", "probe", "cursor-emulator"],
        "budget": ["budget", "show", "t", "--redis", REDIS],
    }


def test_every_command_is_covered(tmp_path: Path) -> None:
    import worker.cli

    assert set(_commands(tmp_path)) == set(COMMANDS) == set(worker.cli._COMMANDS)


def _cli(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=REPO,
        timeout=60,
        check=False,
    )


def _one_error(run: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    """The run's only output: one JSON error line on stderr, of ``code``, exit 2."""
    assert run.stdout == "", run.stdout
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    error = json.loads(lines[0])["error"]
    assert error["code"] == code, error
    assert run.returncode == 2, run.stderr
    assert SECRET not in run.stderr
    return dict(error)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_setting_is_one_json_line_naming_it_and_never_its_value(
    tmp_path: Path, command: str
) -> None:
    argv = [*_commands(tmp_path)[command], "--json"]
    error = _one_error(_cli(argv, ACPW_MODEL_ENDPOINTS=BAD_ENDPOINTS), "invalid_settings")
    assert error["message"].startswith("invalid setting ACPW_MODEL_ENDPOINTS: gw: ")
    assert "https://gw.corp/v1…" in error["message"]  # the URL without what may be secret
    [problem] = error["details"]["settings"]
    assert problem["variable"] == "ACPW_MODEL_ENDPOINTS"


@pytest.mark.parametrize("command", ["run", "serve", "reap", "agents", "image"])
def test_a_bad_backend_setting_fails_the_command_at_start(tmp_path: Path, command: str) -> None:
    """A setting only the sandbox backend reads (``LocalConfig``, ``DockerConfig``): the
    command fails at its start, not each job or reaper pass later."""
    argv = ["--json", *_commands(tmp_path)[command]]
    backend = "docker" if command == "image" else "local"
    run = _cli(argv, ACPW_BACKEND=backend, ACPW_SANDBOX_HOST_UID=SECRET)
    error = _one_error(run, "invalid_settings")
    assert error["details"]["settings"] == [
        {
            "variable": "ACPW_SANDBOX_HOST_UID",
            "reason": "Input should be a valid integer, unable to parse string as an integer",
        }
    ]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ACPW_REAP_BACKENDS", '["local", '),  # a list that is not JSON
        ("ACPW_LEASE_TTL", f"-{SECRET}"),
        ("ACPW_WORKSPACE_DISK", SECRET),
    ],
)
def test_each_kind_of_bad_value_is_one_line_too(tmp_path: Path, variable: str, value: str) -> None:
    for argv in (["--json", "status", "j"], ["status", "j", "--json"]):
        error = _one_error(_cli(argv, **{variable: value}), "invalid_settings")
        assert error["details"]["settings"][0]["variable"] == variable
    plain = _cli(["status", "j"], **{variable: value})  # without --json: one readable line
    assert plain.returncode == 2
    [line] = plain.stderr.splitlines()
    assert line.startswith(f"acp-worker: invalid setting {variable}: ")
    assert line.endswith("[invalid_settings]")
    assert SECRET not in line


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "status"],  # a required argument missing
        ["status", "j", "--json", "--no-such-flag"],
        ["--json", "no-such-command"],
        ["--json", "run", "job.json", "--backend", "nope"],
    ],
)
def test_a_usage_error_with_json_is_one_json_line(argv: list[str]) -> None:
    error = _one_error(_cli(argv), "invalid_input")
    assert error["message"].startswith("acp-worker")
