"""``acp-worker agents probe`` against the Cursor emulator in a real bubblewrap sandbox.

The emulator opens a session only with ``CURSOR_API_KEY``: without one the probe shows the
refusal, with ``--credential CURSOR_API_KEY=<reference>`` it shows the modes and models,
and the key's value is nowhere in what the probe prints.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_run_job import _env, run_cli

pytestmark = pytest.mark.integration
SECRET = "probe-secret-3f9a1c77e2"


def _probe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(tmp_path, "agents", "probe", "cursor-emulator", *args, env=_env(tmp_path, **env))


def test_without_a_credential_the_session_is_refused(tmp_path: Path) -> None:
    result = _probe(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["credentials"] == []
    assert "authenticate" not in report
    assert report["session"]["opened"] is False
    assert report["session"]["error"]["code"] == "auth_required"


@pytest.mark.parametrize(
    ("ref", "env"),
    [
        ("env:PROBE_KEY", {"PROBE_KEY": SECRET}),
        ("file:cursor-key", {"ACPW_SECRETS_DIR": "secrets"}),
    ],
)
def test_a_bound_credential_opens_the_session(
    tmp_path: Path, ref: str, env: dict[str, str]
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "cursor-key").write_text(SECRET + "\n")
    env = {k: str(tmp_path / v) if k == "ACPW_SECRETS_DIR" else v for k, v in env.items()}
    as_json = _probe(tmp_path, "--credential", f"CURSOR_API_KEY={ref}", "--json", **env)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["credentials"] == ["CURSOR_API_KEY"]
    session = report["session"]
    assert session["opened"] is True
    assert [m["id"] for m in session["modes"]["availableModes"]] == ["agent", "plan", "ask"]
    assert session["models"]["availableModels"]
    assert any(o["category"] == "model" for o in session["configOptions"])

    text = _probe(tmp_path, "--credential", f"CURSOR_API_KEY={ref}", **env)
    assert text.returncode == 0, text.stderr
    assert "session   opened with the bound credentials" in text.stdout
    assert "\nmodes     agent, plan, ask\n" in text.stdout
    assert "\nmodels    " in text.stdout
    for result in (as_json, text):
        assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("arg", "code", "exit_code"),
    [
        (SECRET, "invalid_input", 2),  # the secret itself, not NAME=REF
        (f"CURSOR_API_KEY={SECRET}", "credential_refused", 3),  # the secret as a reference
        ("OPENAI_API_KEY=env:PROBE_KEY", "credential_refused", 3),  # not the pack's
        ("CURSOR_API_KEY=env:PROBE_UNSET", "credential_refused", 3),  # does not resolve
        ("CURSOR_API_KEY=aws-sm:some/secret", "credential_refused", 3),  # source not enabled
    ],
)
def test_a_credential_that_cannot_bind_refuses_the_probe(
    tmp_path: Path, arg: str, code: str, exit_code: int
) -> None:
    result = _probe(tmp_path, "--credential", arg, "--json", PROBE_KEY=SECRET)
    assert result.returncode == exit_code, result.stderr
    assert json.loads(result.stderr)["error"]["code"] == code
    assert result.stdout == ""  # nothing was started
    assert SECRET not in result.stderr
