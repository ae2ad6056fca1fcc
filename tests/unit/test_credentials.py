"""Credential references: only names the pack accepts, resolved or refused, always redacted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.credentials.redact import MASK, Redactor
from worker.credentials.resolve import resolve_credentials, secret_sources
from worker.errors import CredentialRefused
from worker.launch import BASE_ENV, launch_plan
from worker.packs.manifest import load_pack
from worker.settings import Settings

ALLOWED = ["CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"]


def _resolve(
    refs: dict[str, str], *, environ: dict[str, str] | None = None, secrets: Path | None = None
) -> tuple[dict[str, str], Redactor]:
    redactor = Redactor()
    sources = secret_sources(Settings(secrets_dir=secrets), environ or {})
    values = resolve_credentials(refs, allowed=ALLOWED, sources=sources, redactor=redactor)
    return values, redactor


def test_env_reference_resolves_and_registers_for_redaction() -> None:
    values, redactor = _resolve({"CURSOR_API_KEY": "env:K"}, environ={"K": "secret-value-1"})
    assert values == {"CURSOR_API_KEY": "secret-value-1"}
    assert redactor.scrub("x secret-value-1 y") == f"x {MASK} y"


def test_file_reference_under_secrets_dir(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("file-secret-2\n")
    values, _ = _resolve({"CURSOR_API_KEY": "file:key"}, secrets=tmp_path)
    assert values == {"CURSOR_API_KEY": "file-secret-2"}


@pytest.mark.parametrize(
    ("refs", "reason"),
    [
        ({"OPENAI_API_KEY": "env:K"}, "not_allowed"),
        ({"CURSOR_API_KEY": "env:MISSING"}, "unresolved"),
        ({"CURSOR_API_KEY": "file:../outside"}, "outside_secrets_dir"),
        ({"CURSOR_API_KEY": "file:/etc/passwd"}, "outside_secrets_dir"),
        ({"CURSOR_API_KEY": "file:absent"}, "unresolved"),
        ({"CURSOR_API_KEY": "file:link"}, "outside_secrets_dir"),
        ({"CURSOR_API_KEY": "file:empty"}, "unresolved"),
        ({"CURSOR_API_KEY": "file:big"}, "unresolved"),
        ({"CURSOR_API_KEY": "vault:kv/cursor"}, "unknown_source"),
        ({"CURSOR_API_KEY": "aws-sm:prod/cursor"}, "unknown_source"),  # shipped, not enabled
    ],
)
def test_refusals(tmp_path: Path, refs: dict[str, str], reason: str) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (tmp_path / "outside").write_text("not yours")
    (secrets / "empty").write_text("")
    (secrets / "big").write_text("x" * (64 * 1024 + 1))
    os.symlink(tmp_path / "outside", secrets / "link")
    with pytest.raises(CredentialRefused) as info:
        _resolve(refs, environ={"K": "v-1234"}, secrets=secrets)
    assert info.value.details["reason"] == reason
    assert info.value.exit_code == 3
    assert "not yours" not in info.value.message


def test_file_reference_needs_a_secrets_dir() -> None:
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": "file:key"})
    assert info.value.details["reason"] == "no_secrets_dir"


def test_launch_env_is_closed() -> None:
    plan = launch_plan(
        argv=["/usr/bin/python3", "{pack}/agent.py", "acp"],
        env={"CURSOR_CONFIG_DIR": "{home}/.cursor"},
        dialect="cursor",
        credentials={"CURSOR_API_KEY": "k-123"},
    )
    assert plan.argv == ("/usr/bin/python3", "/opt/acp-pack/agent.py", "acp")
    assert plan.env["CURSOR_CONFIG_DIR"] == "/home/agent/.cursor"
    assert set(plan.env) == {*BASE_ENV, "CURSOR_CONFIG_DIR", "CURSOR_API_KEY"}


def test_a_pack_may_keep_the_clients_fs_methods_from_its_agent() -> None:
    """gemini-cli 0.61's write_file cannot create a file through fs/read_text_file (it
    never takes the client's not-found error for ENOENT): its pack turns them off."""
    packs = Path(__file__).resolve().parents[2] / "provider_packs"
    offered = {
        d.name: load_pack(packs, d.name).manifest.launch.client_fs
        for d in packs.iterdir()
        if (d / "pack.json").exists()
    }
    assert offered.pop("gemini-cli") is False
    assert offered
    assert set(offered.values()) == {None}, offered  # absent: offered
    plan = launch_plan(argv=["a"], env={}, dialect="acp", credentials={})
    assert plan.client_fs is True
    assert (
        launch_plan(argv=["a"], env={}, dialect="acp", credentials={}, client_fs=False).client_fs
        is False
    )
