"""Pure parts of workspace admission: settings decoding, records, rule tables, public API."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import worker.admission as admission
from worker.admission import rules
from worker.admission.result import AdmissionResult, Finding
from worker.admission.settings_json import declared, parse_settings
from worker.errors import AdmissionRefused


def test_public_api_is_pinned() -> None:
    assert sorted(admission.__all__) == sorted(
        [
            "DEFAULT_SYSTEM_ROOTS",
            "MASKED_PATHS",
            "MAX_SETTINGS_BYTES",
            "PROVIDERS",
            "RULES",
            "AdmissionResult",
            "Finding",
            "MaskEntry",
            "MaskKind",
            "Note",
            "check_view",
            "check_workspace",
            "mask_plan",
        ]
    )
    roots, providers, limit = (
        admission.DEFAULT_SYSTEM_ROOTS,
        admission.PROVIDERS,
        admission.MAX_SETTINGS_BYTES,
    )
    assert roots == (Path("/"),)
    assert providers == ("claude", "codex", "cursor", "gemini")
    assert limit == 1024 * 1024


def test_rule_ids_are_stable() -> None:
    known = rules.RULES
    assert known == {
        "cursor.mcp",
        "cursor.hooks",
        "cursor.plugins",
        "mcp.project",
        "claude.hooks",
        "claude.plugins",
        "claude.mcp",
        "codex.config",
        "config.symlink",
        "config.unreadable",
        "config.not_regular",
        "config.invalid_json",
        "config.too_large",
        "system.hooks",
    }


def test_every_table_rule_is_known() -> None:
    tables = [*rules.PROJECT_CONFIG, *(s for v in rules.SYSTEM_CONFIG.values() for s in v)]
    for spec in tables:
        assert spec.rule in rules.RULES
        assert set((spec.keys or {}).values()) <= rules.RULES
        assert spec.reason.endswith(".")


def test_system_locations_for_cursor() -> None:
    paths = [str(spec.path) for spec in rules.SYSTEM_CONFIG["cursor"]]
    assert paths == ["etc/cursor/hooks.json", "etc/claude-code/managed-settings.json"]


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, []),
        ({"hooks": {}, "plugins": [], "enableAllProjectMcpServers": False}, []),
        ({"hooks": {"Stop": []}}, [("hooks", "claude.hooks")]),
        ({"enabledPlugins": {"p@m": False}}, [("enabledPlugins", "claude.plugins")]),
        ({"enableAllProjectMcpServers": True}, [("enableAllProjectMcpServers", "claude.mcp")]),
        ({"env": {"A": "1"}, "permissions": {"allow": ["x"]}}, []),
    ],
)
def test_declared_keys(doc: dict[str, object], expected: list[tuple[str, str]]) -> None:
    assert declared(doc, rules.CLAUDE_EXEC_KEYS) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[]", "not an object"),
        (b"null", "not an object"),
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'{"x": {"a": 1, "a": 2}}', "duplicate key"),
        (b"\xef\xbb\xbf{}", "BOM"),
        (b"\xc3", "utf-8"),
        (b"[" * 50_000, "nested too deeply"),
    ],
)
def test_parse_settings_refuses(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_settings(data)


@given(st.binary(max_size=256))
def test_parse_settings_raises_only_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        assert isinstance(parse_settings(data), dict)


@given(
    st.dictionaries(
        st.sampled_from([*rules.CLAUDE_EXEC_KEYS, "env", "model"]),
        st.none() | st.booleans() | st.lists(st.integers(), max_size=2) | st.text(max_size=3),
    )
)
def test_a_key_is_declared_exactly_when_truthy(doc: dict[str, object]) -> None:
    settings = parse_settings(json.dumps(doc).encode())
    keys = {key for key, _ in declared(settings, rules.CLAUDE_EXEC_KEYS)}
    assert keys == {k for k, v in doc.items() if k in rules.CLAUDE_EXEC_KEYS and v}


def test_result_dict_and_refusal() -> None:
    findings = (
        Finding(".mcp.json", "mcp.project", "One."),
        Finding("/etc/cursor/hooks.json", "system.hooks", "Two."),
    )
    result = AdmissionResult(Path("/ws"), None, findings)
    assert not result.admitted
    assert result.to_dict() == {
        "admitted": False,
        "workspace": "/ws",
        "git_root": None,
        "findings": [
            {"path": ".mcp.json", "rule": "mcp.project", "reason": "One."},
            {"path": "/etc/cursor/hooks.json", "rule": "system.hooks", "reason": "Two."},
        ],
        "notes": [],
    }
    with pytest.raises(AdmissionRefused) as info:
        result.raise_if_refused()
    assert info.value.details == {"workspace": "/ws", "findings": result.to_dict()["findings"]}
    assert "mcp.project .mcp.json and 1 more" in info.value.message


def test_admitted_result_does_not_raise() -> None:
    result = AdmissionResult(Path("/ws"), Path("/ws"), ())
    assert result.admitted
    result.raise_if_refused()
