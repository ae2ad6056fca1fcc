"""Helpers for running emulator jobs end to end (real bubblewrap, real Redis) and
comparing their canonical events with golden files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job, _normalized

GOLDEN = REPO / "tests" / "golden"
Answerer = Callable[[dict[str, Any]], None]

__all__ = ["GOLDEN", "check_golden", "golden_form", "run_job", "run_live"]


def run_job(
    tmp_path: Path,
    prompt: Any,
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    **spec: Any,
) -> list[dict[str, Any]]:
    """Run one job with ``acp-worker run --json``; returns its events (schema-checked).

    ``env``: more settings (e.g. ``docker_engine.job_backend``'s backend)."""
    job = _job(tmp_path, prompt, **spec)
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(job), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp_path, **(env or {})),
        cwd=REPO,
    )
    events = _events(result.stdout)
    _check_stream(events)
    return events


def run_live(
    tmp_path: Path,
    prompt: str,
    redis_url: str,
    on_event: Callable[[dict[str, Any], subprocess.Popen[str]], None],
    **spec: Any,
) -> list[dict[str, Any]]:
    """Run a job with ``--redis`` and call ``on_event`` for every event as it arrives."""
    job = _job(tmp_path, prompt, **spec)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "run",
            str(job),
            "--json",
            "--quiet",
            "--redis",
            redis_url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.stdout is not None
    events = []
    for line in proc.stdout:
        event = json.loads(line)
        events.append(event)
        on_event(event, proc)
    proc.communicate(timeout=60)
    _check_stream(events)
    return events


def golden_form(event: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """``_normalized`` plus what varies per run beyond ids and timestamps."""
    text = json.dumps(_normalized(event)).replace(str(tmp_path), "<tmp>")
    text = re.sub(r"acpw-[A-Za-z0-9._-]+-1-[0-9a-f]{6,}", "<sandbox>", text)
    text = re.sub(
        r"\b(question|plan|permission)-(\d+)-(\d+)-[0-9a-f]{8}\b", r"\1-\2-\3-<hex>", text
    )
    text = re.sub(r"-[0-9a-f]{8}\.plan\.md", "-<hex>.plan.md", text)
    out = json.loads(text)
    if "expires_at" in out["data"]:
        out["data"]["expires_at"] = "<ts>"
    return out


def check_golden(name: str, events: list[dict[str, Any]], tmp_path: Path) -> None:
    """The events, normalized, equal ``tests/golden/NAME.jsonl`` (``UPDATE_GOLDEN=1``
    rewrites it)."""
    got = [golden_form(e, tmp_path) for e in events]
    golden = GOLDEN / f"{name}.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in got))
    want = [json.loads(line) for line in golden.read_text().splitlines()]
    assert got == want
