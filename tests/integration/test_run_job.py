"""`acp-worker run` end to end: real bubblewrap, the real emulator pack, real Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import redis

from tests.hungry_pack import hungry_packs
from tests.procs import finish
from worker.events.schema import event_schema
from worker.store import keys

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SECRET = "emulator-test-secret-6f1d2c9a"


def _job(tmp_path: Path, prompt: str, **overrides: Any) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# hello\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "key").write_text(SECRET + "\n")
    job = {
        "v": 1,
        "job_id": f"it-{tmp_path.name[-20:]}".replace("_", "-"),
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": prompt,
        "credentials": {"CURSOR_API_KEY": "file:key"},
        "limits": {"timeout_s": 30, "memory_mb": 512, "pids": 128},
    }
    job.update(overrides)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # make test-k8s: the chart's NetworkPolicies are in place, its Role may not create any.
    keep = {"ACPW_K8S_NETWORK_POLICIES"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_") or k in keep}
    env.update(
        {
            "ACPW_CACHE_DIR": str(tmp_path / "cache"),
            "ACPW_WORK_DIR": str(tmp_path / "work"),
            "ACPW_RESULTS_DIR": str(tmp_path / "results"),
            "ACPW_SHUTDOWN_EOF_GRACE": "1",
        }
    )
    env.update(extra)
    return env


def run_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or _env(tmp_path),
        cwd=REPO,
    )


def _events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _check_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    validator = jsonschema.Draft202012Validator(event_schema())
    for event in events:
        errors = list(validator.iter_errors(event))
        assert not errors, f"{event['type']}: {errors[0].message}"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    terminal = [e for e in events if e["type"] == "job.completed"]
    assert len(terminal) == 1
    assert events[-1]["type"] == "job.completed"
    return terminal[0]["data"]


def _no_process_left(marker: str, scope: Path) -> list[str]:
    """Processes whose command line has ``marker`` and that belong to this test's job:
    their mounts name ``scope`` (the pack closure is bound from the test's own cache), so
    agents that other runs on this machine started are not counted."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if marker not in cmdline:
                continue
            mounts = (proc / "mountinfo").read_text()
        except OSError:
            continue
        if str(scope) in mounts:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_hello_end_to_end_json_and_redis(tmp_path: Path, redis_url: str) -> None:
    job = _job(tmp_path, "scenario: hello")
    result = run_cli(tmp_path, "run", str(job), "--json", "--redis", redis_url)
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    done = _check_stream(events)
    assert done["status"] == "succeeded"
    assert done["stop_reason"] == "end_turn"
    types = [e["type"] for e in events]
    for expected in (
        "job.accepted",
        "pack.ready",
        "sandbox.ready",
        "agent.initialized",
        "session.started",
        "message.delta",
        "tool.started",
        "tool.completed",
    ):
        assert expected in types
    usage = next(e for e in events if e["type"] == "usage.reported")
    assert usage["data"] == {"available": False}
    text = "".join(
        e["data"]["text"]
        for e in events
        if e["type"] == "message.delta" and e["data"]["role"] == "assistant"
    )
    assert "Hello" in text
    client = redis.Redis.from_url(redis_url)
    stored = [json.loads(f[b"event"]) for _, f in client.xrange(keys.events(events[0]["job_id"]))]
    assert stored == events
    assert "job succeeded" in result.stderr  # the human progress view


def test_hello_matches_golden(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello", job_id="golden-hello")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    got = [_normalized(e) for e in _events(result.stdout)]
    golden = GOLDEN / "hello.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in got))
    want = [json.loads(line) for line in golden.read_text().splitlines()]
    assert got == want


def _normalized(event: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(event)
    text = re.sub(r'"ts": "[^"]+"', '"ts": "<ts>"', text)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", text)
    text = re.sub(r"fc_[0-9a-f]+", "fc_<hex>", text)
    text = re.sub(r"acpw-golden-hello-1-[0-9a-f]+", "<sandbox>", text)
    out = json.loads(text)
    data = out["data"]
    for key in ("duration_ms", "verify_ms"):
        if key in data:
            data[key] = 0
    if "timings_ms" in data:
        data["timings_ms"] = dict.fromkeys(sorted(data["timings_ms"]), 0)
    if out["type"] == "job.started":
        data["worker_id"] = "<worker>"
    return out


def test_tampered_cached_closure_is_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello")
    first = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert first.returncode == 0, first.stderr
    target = next((tmp_path / "cache" / "closures").glob("*/cursor_emulator.py"))
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[-2] ^= 0x01  # one byte
    target.write_bytes(bytes(data))
    target.chmod(0o555)
    second = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert second.returncode == 3
    done = _check_stream(_events(second.stdout))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "digest_mismatch"
    assert "sandbox.ready" not in [e["type"] for e in _events(second.stdout)]


def test_agent_crash_mid_turn_fails_with_agent_exited(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: crash")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 1
    done = _check_stream(_events(result.stdout))
    assert done["status"] == "failed"
    assert done["error"]["code"] == "agent_exited"
    assert "stderr_preview" in done["error"]["details"]
    assert done["error"]["details"]["exit_code"] == 3  # the scenario's `crash 3`
    assert "signal" not in done["error"]["details"]
    assert _no_process_left("cursor_emulator.py", tmp_path) == []


def test_agent_killed_for_memory_fails_oom_killed(tmp_path: Path) -> None:
    limits = {"timeout_s": 30, "memory_mb": 64, "pids": 128}
    job = _job(tmp_path, "scenario: hello", limits=limits)
    env = _env(tmp_path, ACPW_PACKS_DIR=str(hungry_packs(tmp_path)))
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 1, result.stderr
    events = _events(result.stdout)
    done = _check_stream(events)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "oom_killed"
    assert "limits.memory_mb = 64" in done["error"]["message"]
    details = done["error"]["details"]
    assert details["signal"] == "SIGKILL"
    assert details["memory_mb"] == 64
    assert "exit_code" not in details
    [notice] = [e["data"] for e in events if e["type"] == "notice"]
    assert notice["code"] == "oom_killed"
    assert notice["details"] == {"limit": "limits.memory_mb", "memory_mb": 64}
    assert "survived" not in result.stdout + result.stderr


def test_garbage_on_stdout_is_a_notice_not_a_crash(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", str(_job(tmp_path, "scenario: garbage")), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    notices = [e["data"] for e in events if e["type"] == "notice"]
    assert any(n["code"] == "acp_malformed_line" and "not JSON" in n["message"] for n in notices)
    assert _check_stream(events)["status"] == "succeeded"


def test_missing_credentials_fail_with_auth_required(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello", credentials={})
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 1
    done = _check_stream(_events(result.stdout))
    assert done["error"]["code"] == "auth_required"


def test_secret_never_leaves_the_worker(tmp_path: Path) -> None:
    script = "#!scenario\nexec echo key=$CURSOR_API_KEY\nsay {{exitCode}}\nstderr $CURSOR_API_KEY\n"
    result = run_cli(
        tmp_path,
        "run",
        str(_job(tmp_path, script)),
        "--json",
        "--events-out",
        str(tmp_path / "ev.jsonl"),
    )
    assert result.returncode == 0, result.stderr
    outputs = result.stdout + result.stderr + (tmp_path / "ev.jsonl").read_text()
    assert "key=[REDACTED]" in outputs  # the agent did see it, and we scrubbed it
    assert SECRET not in outputs


def test_timeout_settles_timed_out(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hang", limits={"timeout_s": 1.5, "memory_mb": 512, "pids": 128})
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 5, result.stderr
    done = _check_stream(_events(result.stdout))
    assert done["status"] == "timed_out"
    assert done["stop_reason"] == "cancelled"  # the emulator honoured session/cancel


def test_sigint_cancels_the_job(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hang")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the turn is running
        if '"Working' in line or '"message.delta"' in line:
            break
    proc.send_signal(signal.SIGINT)
    out, _ = finish(proc, timeout=30)
    assert proc.returncode == 4
    done = _events(out)[-1]["data"]
    assert done["status"] == "cancelled"
    assert _no_process_left("cursor_emulator.py", tmp_path) == []


def test_invalid_job_is_exit_2_with_one_line(tmp_path: Path) -> None:
    job = tmp_path / "bad.json"
    job.write_text(
        json.dumps(
            {
                "v": 1,
                "job_id": "x",
                "pack": {"name": "cursor-emulator"},
                "workspace": {"kind": "local", "path": "ws"},
                "prompt": "p",
                "limitz": {},
            }
        )
    )
    result = run_cli(tmp_path, "run", str(job), "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert json.loads(line)["error"]["code"] == "invalid_job_spec"
    assert "limitz" in line


def test_unknown_credential_is_refused_before_anything_starts(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello", credentials={"OPENAI_API_KEY": "file:key"})
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 3
    events = _events(result.stdout)
    assert _check_stream(events)["error"]["code"] == "credential_refused"
    assert "sandbox.ready" not in [e["type"] for e in events]
    assert not (tmp_path / "cache").exists()


def test_agent_works_on_a_private_copy_that_is_removed(tmp_path: Path) -> None:
    script = "#!scenario\nwrite README.md changed by the agent\nwrite new.txt hi\n"
    job = _job(tmp_path, script)
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    assert any(e["type"] == "tool.completed" and e["data"]["diffs"] for e in events)
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    assert {p["path"]: p["status"] for p in changed["paths"]} == {
        "README.md": "modified",
        "new.txt": "added",
    }
    patch = Path(changed["patch"]["path"]).read_text()
    assert "+changed by the agent" in patch
    assert (tmp_path / "ws" / "README.md").read_text() == "# hello\n"
    assert not (tmp_path / "ws" / "new.txt").exists()
    assert list((tmp_path / "work").iterdir()) == []


def test_ambient_hooks_refuse_the_job_before_launch(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello")
    (tmp_path / "ws" / ".cursor").mkdir()
    (tmp_path / "ws" / ".cursor" / "hooks.json").write_text('{"hooks": {}}')
    (tmp_path / "ws" / ".mcp.json").write_text('{"mcpServers": {}}')
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 3
    events = _events(result.stdout)
    error = _check_stream(events)["error"]
    assert error["code"] == "admission_refused"
    assert {f["rule"] for f in error["details"]["findings"]} == {"cursor.hooks", "mcp.project"}
    assert "sandbox.ready" not in [e["type"] for e in events]
    assert not (tmp_path / "ws" / ".cursor-emulator-hook-ran").exists()


def test_kept_workspace_is_reaped_after_its_time(tmp_path: Path, redis_url: str) -> None:
    import asyncio

    import redis.asyncio as aioredis

    from worker.service.reaper import reap_workspaces

    job = _job(tmp_path, "#!scenario\nwrite kept.txt still here\n", keep_workspace=True)
    env = _env(tmp_path, ACPW_KEEP_WORKSPACE_S="0")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet", env=env)
    assert result.returncode == 0, result.stderr
    kept = next(
        e["data"]
        for e in _events(result.stdout)
        if e["type"] == "notice" and e["data"]["code"] == "workspace_kept"
    )
    assert (Path(kept["details"]["path"]) / "kept.txt").read_text() == "still here"
    [job_dir] = list((tmp_path / "work").iterdir())
    # The agent's state (its session files, saved to the store) is not kept with it.
    assert not (job_dir / "agent-state").exists()

    async def reap() -> list[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await reap_workspaces(client, tmp_path / "work")
        finally:
            await client.aclose()

    assert asyncio.run(reap()) == [job_dir.name]  # its time is up and its process is gone
    assert list((tmp_path / "work").iterdir()) == []


def test_reaper_spares_live_and_still_kept_work_dirs(tmp_path: Path, redis_url: str) -> None:
    import asyncio
    import time as clock

    import redis.asyncio as aioredis

    from worker.service.reaper import reap_workspaces
    from worker.workspace.prepare import write_labels

    work = tmp_path / "work"
    (work / "live").mkdir(parents=True)
    write_labels(work / "live", {"acpw.job": "j", "acpw.token": "0", "pid": str(os.getpid())})
    (work / "kept").mkdir()
    write_labels(
        work / "kept",
        {"acpw.job": "k", "acpw.token": "0", "pid": "0", "keep_until": str(clock.time() + 3600)},
    )
    (work / "unlabelled").mkdir()

    async def reap() -> list[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await reap_workspaces(client, work)
        finally:
            await client.aclose()

    assert asyncio.run(reap()) == []
    assert sorted(p.name for p in work.iterdir()) == ["kept", "live", "unlabelled"]


def test_network_denials_become_notices(tmp_path: Path) -> None:
    script = (
        "#!scenario\n"
        "exec curl -s -o /dev/null -w '%{http_code}' https://denied.example:443/ || true\n"
    )
    job = _job(tmp_path, script, network={"mode": "allowlist", "allow": ["allowed.example:443"]})
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    _check_stream(events)
    denied = [
        e["data"] for e in events if e["type"] == "notice" and e["data"]["code"] == "network_denied"
    ]
    assert [d["details"]["target"] for d in denied] == ["denied.example:443"]
    assert denied[0]["details"]["reason"] == "not_allowed"


def test_change_capture_of_a_real_run(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "gone.txt").write_text("bye\n")
    (ws / "tool.sh").write_text("#!/bin/sh\n")
    script = (
        "#!scenario\n"
        "exec sh -c 'echo more >> README.md && echo new > added.txt && rm gone.txt"
        " && chmod 755 tool.sh && ln -s /etc/passwd passwd"
        " && head -c 52428800 /dev/zero > big.bin'\n"
    )
    result = run_cli(tmp_path, "run", str(_job(tmp_path, script)), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    changed = next(e["data"] for e in events if e["type"] == "workspace.changed")
    by_path = {p["path"]: p for p in changed["paths"]}
    assert {k: v["status"] for k, v in by_path.items()} == {
        "README.md": "modified",
        "added.txt": "added",
        "gone.txt": "deleted",
        "tool.sh": "mode_changed",
        "passwd": "added",
        "big.bin": "added",
    }
    assert by_path["passwd"]["kind"] == "link"
    assert by_path["passwd"]["target"] == "/etc/passwd"  # reported, never followed
    assert by_path["big.bin"]["size"] == 52428800
    assert by_path["big.bin"]["in_patch"] is False
    assert changed["patch"]["omitted"] == ["big.bin"]
    patch = Path(changed["patch"]["path"]).read_text()
    assert "+more" in patch
    assert "deleted file mode 100644" in patch
    assert "new mode 100755" in patch
    assert "+++ b/passwd" in patch
    assert "root:" not in patch  # the link's target file was never read


def test_admission_notes_reach_the_job_and_its_refusal(tmp_path: Path) -> None:
    job = _job(tmp_path, "scenario: hello")
    (tmp_path / "ws" / ".git").write_text("gitdir: /nonexistent/.git/worktrees/ws\n")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    _check_stream(events)
    (notice,) = [e["data"] for e in events if e["data"].get("code") == "admission_notes"]
    (note,) = notice["details"]["notes"]
    assert (note["path"], note["code"]) == (".git", "git.marker_dangling")
    # Above the dangling marker, a real repository root with config: refused, noted.
    (tmp_path / ".git").mkdir()
    (tmp_path / ".mcp.json").write_text('{"mcpServers": {}}')
    try:
        result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    finally:
        (tmp_path / ".git").rmdir()
    assert result.returncode == 3
    error = _check_stream(_events(result.stdout))["error"]
    assert error["code"] == "admission_refused"
    assert [f["path"] for f in error["details"]["findings"]] == ["../.mcp.json"]
    assert [n["code"] for n in error["details"]["notes"]] == ["git.marker_dangling"]


def test_notes_only_the_sandbox_view_has_are_emitted_before_launch(tmp_path: Path) -> None:
    """A submodule-style gitfile resolves beside the source but not in the sandbox's copy:
    the staging admission takes it as the Git root, the re-admission notes it."""
    job = _job(tmp_path, "scenario: hello")
    (tmp_path / "gitdirs" / "ws").mkdir(parents=True)
    (tmp_path / "ws" / ".git").write_text("gitdir: ../gitdirs/ws\n")
    result = run_cli(tmp_path, "run", str(job), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    events = _events(result.stdout)
    _check_stream(events)
    notes = [e for e in events if e["data"].get("code") == "admission_notes"]
    assert [[n["code"] for n in e["data"]["details"]["notes"]] for e in notes] == [
        ["git.marker_dangling"]
    ]
    types = [e["type"] for e in events]
    assert types.index("sandbox.ready") < events.index(notes[0]) < types.index("agent.initialized")
