"""``agents probe --credential``: binding as a job does, and nothing bound ever printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_packs import _manifest
from worker.cli.agents import bind_credentials, render, scrubbed
from worker.credentials.redact import MASK, Redactor
from worker.errors import AuthRequired, CredentialRefused, InvalidInput
from worker.packs.manifest import Pack, parse_manifest
from worker.settings import Settings

SECRET = "unit-probe-secret-0d41"
PACK = Pack(parse_manifest(_manifest(), path="p"), Path("/nonexistent"))


def test_binding_resolves_and_registers_for_scrubbing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_KEY", SECRET)
    redactor = Redactor()
    bound = bind_credentials(["CURSOR_API_KEY=env:PROBE_KEY"], PACK, Settings(), redactor)
    assert bound == {"CURSOR_API_KEY": SECRET}
    assert redactor.scrub(f"agent said {SECRET}") == f"agent said {MASK}"


@pytest.mark.parametrize(
    ("pairs", "error"),
    [
        ([SECRET], InvalidInput),
        (["CURSOR_API_KEY="], InvalidInput),
        (["cursor_api_key=env:PROBE_KEY"], InvalidInput),  # a job spec's names are upper case
        (["CURSOR_API_KEY=env:PROBE_KEY", "CURSOR_API_KEY=env:OTHER"], InvalidInput),
        (["ANTHROPIC_API_KEY=env:PROBE_KEY"], CredentialRefused),
        ([f"CURSOR_API_KEY={SECRET}"], CredentialRefused),
    ],
)
def test_what_a_job_could_not_bind_is_refused_without_echo(
    monkeypatch: pytest.MonkeyPatch, pairs: list[str], error: type[Exception]
) -> None:
    monkeypatch.setenv("PROBE_KEY", SECRET)
    with pytest.raises(error) as info:
        bind_credentials(pairs, PACK, Settings(), Redactor())
    assert SECRET not in str(info.value)
    assert SECRET not in json.dumps(getattr(info.value, "details", {}))


def test_errors_are_scrubbed_of_bound_values() -> None:
    redactor = Redactor()
    redactor.register(SECRET)
    exc = AuthRequired(f"bad key {SECRET}", stderr_preview=f"key={SECRET}\n", method="x")
    out = scrubbed(exc, redactor)
    assert SECRET not in out.message + str(out) + json.dumps(out.to_dict())
    assert out.details == {"stderr_preview": f"key={MASK}\n", "method": "x"}


def test_the_report_names_what_was_bound_never_values() -> None:
    report = {
        "pack": {"name": "p", "version": "1", "platform": "any", "closure_digest": "sha256:x"},
        "agent_info": {"name": "a"},
        "protocol_version": 1,
        "initialize_ms": 1.0,
        "auth_methods": [{"id": "api-key"}],
        "credentials": ["OPENAI_API_KEY"],
        "authenticate": {"method": "api-key", "ok": True},
        "session": {"opened": True, "modes": {"availableModes": [{"id": "agent"}]}},
        "shutdown": {"exit_code": 0, "ended_by": "eof", "seconds": 0.1},
    }
    lines = render(report).splitlines()
    assert "bound     OPENAI_API_KEY" in lines
    assert "authn     api-key ok" in lines
    assert "session   opened with the bound credentials" in lines
