"""``acp-worker admission check``: exit codes, human lines and JSON, on real trees."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from worker.cli import admission as admission_cli
from worker.errors import WorkerError
from worker.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse and dispatch exactly as ``worker.cli.main`` does, with only this sub-command."""
    parser = argparse.ArgumentParser(prog="acp-worker")
    parser.add_argument("--json", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    admission_cli.register(sub)
    args = parser.parse_args(argv)
    try:
        code = args.handler(args, Settings())
    except WorkerError as exc:
        code = exc.exit_code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / ".git").mkdir(parents=True)
    return workspace


@pytest.fixture
def sysroot(tmp_path: Path) -> str:
    (tmp_path / "sys").mkdir()
    return str(tmp_path / "sys")


def refuse(ws: Path) -> None:
    (ws / ".cursor").mkdir()
    (ws / ".cursor/hooks.json").write_text("{}")
    (ws / ".mcp.json").write_text("{}")


def test_admitted_exits_zero(ws: Path, sysroot: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["admission", "check", str(ws), "--system-root", sysroot], capsys)
    assert code == 0
    assert out == f"admitted: {ws.resolve()}\n"


def test_admitted_json(ws: Path, sysroot: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["admission", "check", str(ws), "--system-root", sysroot, "--json"], capsys)
    assert code == 0
    assert json.loads(out)["admitted"] is True
    assert json.loads(out)["findings"] == []


def test_refused_prints_every_finding(
    ws: Path, sysroot: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refuse(ws)
    code, out, err = run(["admission", "check", str(ws), "--system-root", sysroot], capsys)
    assert code == 3
    lines = out.splitlines()
    assert [line.split("  ")[:2] for line in lines] == [
        ["mcp.project", ".mcp.json"],
        ["cursor.hooks", ".cursor/hooks.json"],
    ]
    assert all(line.split("  ")[2].endswith(".") for line in lines)
    assert "2 finding(s) [admission_refused]" in err


def test_refused_json(ws: Path, sysroot: str, capsys: pytest.CaptureFixture[str]) -> None:
    refuse(ws)
    argv = ["--json", "admission", "check", str(ws), "--system-root", sysroot]
    code, out, _ = run(argv, capsys)
    assert code == 3
    doc = json.loads(out)
    assert doc["admitted"] is False
    assert {(f["rule"], f["path"]) for f in doc["findings"]} == {
        ("mcp.project", ".mcp.json"),
        ("cursor.hooks", ".cursor/hooks.json"),
    }
    assert all(set(f) == {"path", "rule", "reason"} for f in doc["findings"])


def test_system_root_option_finds_enterprise_hooks(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooks = tmp_path / "image/etc/cursor/hooks.json"
    hooks.parent.mkdir(parents=True)
    hooks.write_text("{}")
    argv = ["admission", "check", str(ws), "--system-root", str(tmp_path / "image"), "--json"]
    code, out, _ = run(argv, capsys)
    assert code == 3
    assert json.loads(out)["findings"][0] == {
        "path": str(hooks),
        "rule": "system.hooks",
        "reason": "Enterprise Cursor hooks run shell commands on agent events in every project.",
    }


def test_missing_dir_is_invalid_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["admission", "check", str(tmp_path / "missing")], capsys)
    assert code == 2
    assert out == ""


def test_unknown_provider_is_a_usage_error(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["admission", "check", str(ws), "--provider", "nope"], capsys)
    assert info.value.code == 2


def test_through_the_real_entry_point(ws: Path, sysroot: str) -> None:
    refuse(ws)
    argv = ["admission", "check", str(ws), "--system-root", sysroot, "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    if "invalid choice: 'admission'" in proc.stderr or "ModuleNotFoundError" in proc.stderr:
        pytest.skip("admission_cli.register is not wired into worker.cli._registrars yet")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["admitted"] is False


def test_notes_are_shown_human_and_json(
    tmp_path: Path, sysroot: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "dangling"
    workspace.mkdir()
    (workspace / ".git").write_text("gitdir: /nonexistent/worktree\n")
    code, out, err = run(["admission", "check", str(workspace), "--system-root", sysroot], capsys)
    assert code == 0
    assert out == f"admitted: {workspace.resolve()}\n"
    assert err.startswith("note: git.marker_dangling  .git  ")
    assert "/nonexistent/worktree" in err
    code, out, _ = run(
        ["admission", "check", str(workspace), "--system-root", sysroot, "--json"], capsys
    )
    assert code == 0
    (note,) = json.loads(out)["notes"]
    assert (note["path"], note["code"]) == (".git", "git.marker_dangling")
