"""The client side of Cursor jobs: permission policies, fs/* and terminal/* served by the
worker (inside the job's sandbox and workspace), and exact model selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cursor_jobs import run_job
from tests.integration.docker_engine import base_image, docker_host, engine_config, job_backend
from tests.integration.test_run_job import _env, _job, run_cli

__all__ = ["base_image", "docker_host", "engine_config", "job_backend"]

Events = list[dict[str, Any]]
PERMISSIONS = """#!scenario
permission {"title": "Read README.md", "kind": "read", "reason": "read"}
say {{permission}}|
permission {"title": "`rm -rf build`", "kind": "execute", "reason": "Not in allowlist: rm"}
say {{permission}}|
permission {"title": "Which colour?", "kind": "think", "reason": "question fallback", \
"options": [{"optionId": "red", "name": "Red", "kind": "allow_once"}, \
{"optionId": "skip", "name": "Skip", "kind": "reject_once"}]}
say {{permission}}
"""


def _of(events: Events, type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == type_]


def _said(events: Events) -> str:
    return "".join(d["text"] for d in _of(events, "message.delta") if d["role"] == "assistant")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("deny", "reject-once|reject-once|skip"),
        ("allow_reads", "allow-once|reject-once|skip"),
        ("allow_all", "allow-once|allow-once|skip"),
    ],
)
def test_permission_policies_never_allow_always(tmp_path: Path, policy: str, expected: str) -> None:
    events = run_job(tmp_path, PERMISSIONS, permissions={"policy": policy})
    assert _said(events) == expected
    decided = _of(events, "permission.decided")
    assert [d["policy"] for d in decided] == [policy] * 3
    assert all(d["option_id"] != "allow-always" for d in decided)
    assert [d["decision"] for d in decided] == [
        "allowed" if option.startswith("allow") else "denied" for option in expected.split("|")
    ]


def test_fs_is_served_inside_the_workspace_only(
    tmp_path: Path, job_backend: dict[str, str]
) -> None:
    """The same answers on every backend, through its own file access: reads and writes
    inside the workspace (a new file and folder the agent can change afterwards, so
    owned as the sandbox user), refusals with the same reasons, and config paths the
    sandbox masks neither read nor written (``masked``)."""
    calls = [
        _read("/workspace/README.md"),
        _write("/workspace/out/new.txt", "written by fs\n"),
        _read("/workspace/out/new.txt"),
        "exec echo changed by the agent >> out/new.txt && touch out/by-agent",
        _read("out/new.txt"),
        _write("/workspace/.cursor/rules/style.md", "ok\n"),  # an anchor: still editable
        _read("/workspace/../etc/passwd"),
        _read("/etc/passwd"),
        _read("/workspace/pw"),
        _write("/workspace/pw", "x"),
        _read("/workspace/.cursor/hooks.json"),
        _write("/workspace/.cursor/mcp.json", "{}"),
        _write(".codex/config.toml", "x = 1"),
        _write("/workspace/.cursor/plugins/p/index.js", "x"),
        "exec rm pw",  # daytona brings no link back (the whole sync would be refused)
    ]
    lines = [
        c if isinstance(c, str) else f'call {json.dumps(c)}\nsay {{{{reply}}}}\nsay "\\n"'
        for c in calls
    ]
    script = "#!scenario\nexec ln -s /etc/passwd pw\n" + "\n".join(lines) + "\n"
    events = run_job(tmp_path, script, env=job_backend)
    assert events[-1]["data"]["status"] == "succeeded", events[-1]
    init = _of(events, "agent.initialized")[0]
    assert init["agent_capabilities"]["sessionCapabilities"]["subagents"] == {}
    replies = [json.loads(line) for line in _said(events).strip().split("\n")]
    assert replies[:5] == [
        {"content": "# hello\n"},
        {},
        {"content": "written by fs\n"},
        {"content": "written by fs\nchanged by the agent\n"},
        {},
    ]
    reasons = [r["error"]["data"]["reason"] for r in replies[5:]]
    assert reasons == ["traversal", "outside_workspace", "symlink", "symlink", *["masked"] * 4]
    [changed] = _of(events, "workspace.changed")
    paths = {p["path"] for p in changed["paths"]}
    assert {"out/new.txt", "out/by-agent", ".cursor/rules/style.md"} <= paths
    assert not paths & {".cursor/mcp.json", ".cursor/hooks.json", ".codex/config.toml"}
    patch = Path(changed["patch"]["path"]).read_text()
    assert "+written by fs\n+changed by the agent\n" in patch


def _read(path: str) -> dict[str, Any]:
    return {"method": "fs/read_text_file", "params": {"path": path}}


def _write(path: str, content: str) -> dict[str, Any]:
    return {"method": "fs/write_text_file", "params": {"path": path, "content": content}}


def test_terminals_run_in_the_sandbox_with_stdin_closed_and_bounded_output(
    tmp_path: Path,
) -> None:
    create = {
        "method": "terminal/create",
        "params": {
            "command": "/bin/sh",
            "outputByteLimit": 64,
            "args": [
                "-c",
                "cat; id -u; ls /opt/acp-pack >/dev/null && echo in-sandbox; seq 1 200 >&2; exit 3",
            ],
        },
    }
    wait = {"method": "terminal/wait_for_exit", "params": {"terminalId": "{{reply_terminalId}}"}}
    output = {"method": "terminal/output", "params": {"terminalId": "{{reply_terminalId}}"}}
    release = {"method": "terminal/release", "params": {"terminalId": "{{reply_terminalId}}"}}
    script = (
        f"#!scenario\ncall {json.dumps(create)}\ncall {json.dumps(wait)}\nsay {{{{reply}}}}|\n"
        f"call {json.dumps(output)}\nsay {{{{reply}}}}|\ncall {json.dumps(release)}\n"
        'call {"method": "terminal/output", "params": {"terminalId": "term-1"}}\nsay {{reply}}\n'
    )
    events = run_job(tmp_path, script)
    exited, out, released = (json.loads(p) for p in _said(events).split("|"))
    assert exited == {"exitCode": 3, "signal": None}
    assert out["truncated"] is True
    assert len(out["output"].encode()) <= 64
    assert out["output"].endswith("199\n200\n")
    assert out["exitStatus"] == {"exitCode": 3, "signal": None}
    assert released["error"]["code"] == -32602  # released: gone


def test_terminal_identity_is_the_sandbox_user(tmp_path: Path) -> None:
    create = {
        "method": "terminal/create",
        "params": {
            "command": "/bin/sh",
            "args": ["-c", "id -u; test -d /opt/acp-pack && echo sandboxed"],
        },
    }
    script = (
        f"#!scenario\ncall {json.dumps(create)}\n"
        'call {"method": "terminal/wait_for_exit", "params": '
        '{"terminalId": "{{reply_terminalId}}"}}\n'
        'call {"method": "terminal/output", "params": {"terminalId": "term-1"}}\nsay {{reply}}\n'
    )
    out = json.loads(_said(run_job(tmp_path, script)))
    assert out["output"] == "1000\nsandboxed\n"


def test_parameterized_model_is_selected_exactly_and_defaults_are_visible(
    tmp_path: Path,
) -> None:
    events = run_job(
        tmp_path, "scenario: hello", model={"id": "grok-4.6", "params": {"effort": "low"}}
    )
    [selected] = _of(events, "model.selected")
    assert selected == {
        "source": "job",
        "model": "grok-4.6",
        "params": {"effort": "low"},
        "defaults": {"fast": "true"},  # the catalog's pricier default: shown, not chosen
        "picker": "parameterized",
        "via": "config_option",
        "verified": True,
    }
    assert events[-1]["data"]["status"] == "succeeded"
    [notice] = [e["data"] for e in events if e["type"] == "notice"]
    assert (notice["code"], notice["details"]) == (
        "cost_raising_default",
        {"model": "grok-4.6", "params": {"fast": "true"}},
    )


def test_a_job_naming_no_model_is_told_the_agents_default(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: hello")
    [selected] = _of(events, "model.selected")
    assert (selected["source"], selected["via"], selected["verified"]) == ("default", None, False)
    assert selected["params"] == {}
    assert selected["model"]  # what the emulator says it uses, as it says it
    started = _of(events, "session.started")[0]
    offered = started["models"] or {}
    options = started["config_options"] or []
    current = [o.get("currentValue") for o in options if o.get("category") == "model"]
    assert selected["model"] in [*current, offered.get("currentModelId")]


def test_the_operator_can_require_every_parameter_named(tmp_path: Path) -> None:
    env = _env(tmp_path, ACPW_MODEL_PARAMS_REQUIRED="1")
    partly = _job(
        tmp_path, "scenario: hello", model={"id": "grok-4.6", "params": {"effort": "low"}}
    )
    done = run_cli(tmp_path, "run", str(partly), "--json", "--quiet", env=env)
    assert done.returncode == 3
    error = json.loads(done.stdout.splitlines()[-1])["data"]["error"]
    assert (error["code"], error["details"]["reason"]) == ("model_unavailable", "params_required")
    assert error["details"]["unset"] == {"fast": "true"}
    named = _job(
        tmp_path,
        "scenario: hello",
        model={"id": "grok-4.6", "params": {"effort": "low", "fast": "false"}},
    )
    assert run_cli(tmp_path, "run", str(named), "--quiet", env=env).returncode == 0
    unnamed = _job(tmp_path, "scenario: hello")
    done = run_cli(tmp_path, "run", str(unnamed), "--json", "--quiet", env=env)
    assert done.returncode == 3
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["data"]["error"]["details"]["reason"] == "model_required"
    assert not {"pack.ready", "sandbox.ready"} & {e["type"] for e in events}


def test_variant_model_id_uses_the_variant_picker(tmp_path: Path) -> None:
    events = run_job(tmp_path, "scenario: hello", model={"id": "grok-4.6[effort=high,fast=true]"})
    [selected] = _of(events, "model.selected")
    assert (selected["picker"], selected["params"]) == (
        "variant",
        {"effort": "high", "fast": "true"},
    )
    assert selected["verified"] is True


@pytest.mark.parametrize(
    "model",
    [
        {"id": "gpt-9-imaginary"},
        {"id": "grok-4.6", "params": {"context": "1m"}},
        {"id": "grok-4.6", "params": {"effort": "ludicrous"}},
        {"id": "grok-4.6", "picker": "variant"},
    ],
)
def test_unavailable_models_are_refused_not_substituted(
    tmp_path: Path, model: dict[str, Any]
) -> None:
    events = run_job(tmp_path, "scenario: hello", model=model)
    done = events[-1]["data"]
    assert (done["status"], done["error"]["code"]) == ("failed", "model_unavailable")
    assert _of(events, "model.selected") == []
    assert not any(e["type"] == "message.delta" for e in events)


@pytest.mark.parametrize(
    ("model", "reasoning", "param"),
    [
        ("grok-4.6", "xhigh", {"effort": "xhigh"}),
        ("grok-4.6", "low", {"effort": "low"}),
        ("gpt-5.6-luna", "high", {"reasoning": "high"}),
        ("claude-opus-5", "off", {"thinking": "false"}),
        ("claude-opus-5", "medium", {"thinking": "true"}),
    ],
)
def test_a_thinking_level_maps_to_the_parameter_the_model_exposes(
    tmp_path: Path, model: str, reasoning: str, param: dict[str, str]
) -> None:
    events = run_job(tmp_path, "scenario: hello", model={"id": model, "reasoning": reasoning})
    assert events[-1]["data"]["status"] == "succeeded"
    [selected] = _of(events, "model.selected")
    assert (selected["params"], selected["reasoning"], selected["verified"]) == (
        param,
        reasoning,
        True,
    )
    assert not set(param) & set(selected["defaults"])


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ({"id": "gpt-5.6-luna", "reasoning": "xhigh"}, "never chosen instead"),  # no step up
        ({"id": "gpt-5.6-luna", "reasoning": "off"}, "offers no reasoning value"),
        ({"id": "default", "reasoning": "high"}, "exposes no thinking level"),
        ({"id": "grok-4.6", "reasoning": "low", "params": {"effort": "high"}}, "names both"),
    ],
)
def test_a_thinking_level_the_catalog_lacks_is_refused(
    tmp_path: Path, model: dict[str, Any], why: str
) -> None:
    events = run_job(tmp_path, "scenario: hello", model=model)
    error = events[-1]["data"]["error"]
    assert error["code"] == "model_unavailable"
    assert why in error["message"]
    assert _of(events, "model.selected") == []


def test_a_variant_id_with_a_thinking_level_is_an_invalid_job(tmp_path: Path) -> None:
    job = _job(
        tmp_path, "scenario: hello", model={"id": "grok-4.6[effort=high]", "reasoning": "low"}
    )
    done = run_cli(tmp_path, "run", str(job), "--quiet")
    assert done.returncode == 2
    assert "model" in done.stderr
