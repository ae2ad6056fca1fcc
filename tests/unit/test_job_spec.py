"""Job spec v1: strict validation, one-line errors naming the field, no secret echo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.errors import InvalidJobSpec
from worker.jobs.spec import parse_job


def _job(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "v": 1,
        "job_id": "job-1",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "/tmp/ws"},
        "prompt": "hello",
    }
    job.update(overrides)
    return job


def test_minimal_job_gets_defaults() -> None:
    spec = parse_job(json.dumps(_job()))
    assert spec.limits.timeout_s == 600
    assert spec.network.mode == "none"
    assert spec.prompt_blocks() == [{"type": "text", "text": "hello"}]


def test_content_block_prompt() -> None:
    spec = parse_job(_job(prompt=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))
    assert [b["text"] for b in spec.prompt_blocks()] == ["a", "b"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps(_job(extra_field=1)).encode(), "extra_field"),
        (json.dumps(_job(v=2)).encode(), "v:"),
        (json.dumps(_job(limits={"timeout_s": "soon"})).encode(), "limits.timeout_s"),
        (json.dumps(_job(limits={"memory_mb": 1})).encode(), "limits.memory_mb"),
        (json.dumps(_job(pack={"name": "../etc"})).encode(), "pack.name"),
        (json.dumps(_job(job_id="a b")).encode(), "job_id"),
        (json.dumps(_job(network={"mode": "host"})).encode(), "network.mode"),
        (json.dumps(_job(workspace={"kind": "nfs", "path": "/x"})).encode(), "workspace"),
    ],
)
def test_invalid_jobs_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(InvalidJobSpec) as info:
        parse_job(raw)
    assert field in info.value.message
    assert "\n" not in info.value.message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"limits": {"timeout_s": "60"}}, "limits.timeout_s"),
        ({"limits": {"pids": 64.0}}, "limits.pids"),
        ({"limits": {"cpus": True}}, "limits.cpus"),
        ({"keep_workspace": "yes"}, "keep_workspace"),
        ({"keep_workspace": 1}, "keep_workspace"),
        ({"v": "1"}, "v"),
        ({"labels": {"team": 7}}, "labels.team"),
        ({"workspace": {"kind": "git", "url": "https://h/r", "submodules": "false"}}, "submodules"),
    ],
)
def test_no_type_coercion(overrides: dict[str, Any], field: str) -> None:
    # A JSON string is not a number and 1 is not true, from text or from a mapping.
    for raw in (_job(**overrides), json.dumps(_job(**overrides))):
        with pytest.raises(InvalidJobSpec) as info:
            parse_job(raw)
        assert field in info.value.message


def test_numbers_keep_their_json_meaning() -> None:
    spec = parse_job(_job(limits={"timeout_s": 60, "cpus": 2, "memory_mb": 512}))
    assert (spec.limits.timeout_s, spec.limits.cpus, spec.limits.memory_mb) == (60.0, 2.0, 512)


def test_a_mapping_that_is_not_json_data_is_refused() -> None:
    with pytest.raises(InvalidJobSpec, match="not JSON data") as info:
        parse_job(_job(prompt=object()))
    assert info.value.details["job_id"] == "job-1"
    with pytest.raises(InvalidJobSpec, match="not JSON data"):
        parse_job(_job(limits={"timeout_s": float("nan")}))


def test_missing_field_is_named() -> None:
    job = _job()
    del job["prompt"]
    with pytest.raises(InvalidJobSpec, match=r"^prompt: Field required"):
        parse_job(job)


def test_inline_secret_is_refused_without_echoing_it() -> None:
    secret = "sk-live-0123456789abcdef"
    with pytest.raises(InvalidJobSpec) as info:
        parse_job(_job(credentials={"CURSOR_API_KEY": secret}))
    assert "never the secret" in info.value.message
    assert secret not in info.value.message
    assert secret not in json.dumps(info.value.to_dict())


def test_credential_references_accepted() -> None:
    spec = parse_job(
        _job(credentials={"CURSOR_API_KEY": "env:MY_KEY", "CURSOR_AUTH_TOKEN": "file:tok"})
    )
    assert spec.credentials["CURSOR_API_KEY"] == "env:MY_KEY"


def test_job_id_is_kept_for_the_terminal_event_when_readable() -> None:
    with pytest.raises(InvalidJobSpec) as info:
        parse_job(_job(prompt=5))
    assert info.value.details["job_id"] == "job-1"


@pytest.mark.parametrize("mode", ["plan", "acceptEdits", "read-only", "bypassPermissions", "a.b:c"])
def test_mode_takes_any_safe_id(mode: str) -> None:
    assert parse_job(_job(mode=mode)).mode == mode


@pytest.mark.parametrize("mode", ["", "-x", "a b", "../x", "a/b", "x" * 65, "mode\n", "é"])
def test_mode_refuses_unsafe_ids(mode: str) -> None:
    with pytest.raises(InvalidJobSpec, match="mode"):
        parse_job(_job(mode=mode))
