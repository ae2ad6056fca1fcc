"""Normalizer throughput on a recorded stream of mixed Cursor updates, against a bare
``json.loads`` of the same lines in the same run. Target (issue 4): ≥ 25 %.

The stream is recorded from the Cursor emulator (its real stdout, not synthesized): the
``hello``, ``subagents`` (child sessions, delegation), ``todos``, ``unmapped`` (unknown
kinds and fields, usage) and ``artifacts`` scenarios plus a long streamed answer, i.e.
message/thought chunks, tool lifecycles with diffs and locations, plans, subagent
updates and the non-blocking ``cursor/*`` requests. The recording is cycled to N lines;
each cycle is a fresh ``Normalizer`` (one job), so children are spawned, not refused.

    .venv/bin/python benchmarks/normalize.py [--updates 100000] [--repeat 3]

Prints both ratios: normalizer alone on parsed lines (the figure the target is about)
and parse + normalize end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _bench import dry_run, size, summary

from worker.events.artifacts import Verdict
from worker.events.normalizer import Normalizer

REPO = Path(__file__).resolve().parent.parent
EMULATOR = REPO / "provider_packs" / "cursor-emulator" / "src" / "cursor_emulator.py"
SCENARIOS = ["hello", "subagents", "todos", "unmapped", "artifacts"]
LONG_ANSWER = (
    "#!scenario\nthink "
    + "Weighing the options carefully. " * 40
    + "\nsay "
    + ("Here is a long streamed answer with many tokens. " * 80)
)
EXTENSIONS = ("cursor/update_todos", "cursor/task", "cursor/generate_image")


def record() -> list[bytes]:
    """The emulator's stdout lines (updates and cursor/* requests) for every scenario."""
    with tempfile.TemporaryDirectory() as home:
        env = {
            "HOME": home,
            "CURSOR_API_KEY": "bench",
            "CURSOR_EMULATOR_CHUNK_DELAY": "0",
            "CURSOR_EMULATOR_COMMANDS_DELAY": "0",
            "PATH": os.environ.get("PATH", ""),
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EMULATOR),
                "--disable-project-configs",
                "--disable-auto-update",
                "acp",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=home,
        )
        try:
            return _drive(proc, home)
        finally:
            proc.kill()
            proc.wait()


def _drive(proc: subprocess.Popen[bytes], cwd: str) -> list[bytes]:
    assert proc.stdin is not None
    assert proc.stdout is not None
    ids = iter(range(1, 1000))

    def call(method: str, params: dict[str, Any]) -> tuple[Any, list[bytes]]:
        rid = next(ids)
        proc.stdin.write(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "method": method,  # type: ignore[union-attr]
                    "params": params,
                }
            ).encode()
            + b"\n"
        )
        proc.stdin.flush()  # type: ignore[union-attr]
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            message = json.loads(line)
            if message.get("id") == rid and "method" not in message:
                return message.get("result"), seen
            if "method" in message and "id" in message:  # an agent request: acknowledge it
                reply = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
                proc.stdin.write(json.dumps(reply).encode() + b"\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            seen.append(line.rstrip(b"\n"))
        raise RuntimeError("the emulator exited")

    caps = {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
        "_meta": {"subagents": True},
    }
    call("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
    session, lines = call("session/new", {"cwd": cwd, "mcpServers": []})
    prompts = [f"scenario: {name}" for name in SCENARIOS] + [LONG_ANSWER]
    for text in prompts:
        _, seen = call(
            "session/prompt",
            {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": text}]},
        )
        lines += seen
    return [line for line in lines if _kept(line)]


def _kept(line: bytes) -> bool:
    method = json.loads(line).get("method")
    return method == "session/update" or method in EXTENSIONS


def _contained(path: str) -> Verdict:
    return Verdict(path.removeprefix("/workspace/"), 16)


def normalize_all(parsed: list[Any], cycle: int, root: str) -> int:
    produced = 0
    normalizer = Normalizer(workspace_root="/workspace")
    for i, message in enumerate(parsed):
        if i % cycle == 0:
            normalizer = Normalizer(workspace_root="/workspace", artifacts=_contained)
            normalizer.bind(root)
        if message["method"] == "session/update":
            produced += len(normalizer.session_update(message["params"]))
        else:
            produced += len(normalizer.extension(message["method"], message["params"]))
    return produced


def best(repeat: int, run: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=size(100_000, 2_000))
    parser.add_argument("--repeat", type=int, default=size(3, 1))
    args = parser.parse_args()
    dry_run("≥ 25 % of json.loads")
    recording = record()
    lines = (recording * (args.updates // len(recording) + 1))[: args.updates]
    root = next(
        json.loads(line)["params"]["sessionId"]
        for line in recording
        if json.loads(line)["method"] == "session/update"
    )
    parsed = [json.loads(line) for line in lines]
    kinds = {
        json.loads(line)["params"]
        .get("update", {})
        .get("sessionUpdate", json.loads(line)["method"])
        for line in recording
    }
    produced = normalize_all(parsed, len(recording), root)
    t_parse = best(args.repeat, lambda: [json.loads(line) for line in lines])
    t_norm = best(args.repeat, lambda: normalize_all(parsed, len(recording), root))
    t_both = best(
        args.repeat, lambda: normalize_all([json.loads(x) for x in lines], len(recording), root)
    )
    n = len(lines)
    print(f"recorded {len(recording)} lines ({len(kinds)} kinds), cycled to {n}; {produced} events")
    print(f"json.loads          {n / t_parse:>12,.0f} lines/s")
    for label, seconds in (("normalize (parsed)", t_norm), ("parse + normalize", t_both)):
        ratio = t_parse / seconds
        print(f"{label:<19} {n / seconds:>12,.0f} updates/s  = {ratio:6.1%} of json.loads")
    print("target: normalize ≥ 25 % of json.loads")
    ratio = t_parse / t_norm
    summary(f"normalizer at {ratio:.0%} of json.loads", "≥ 25 %", ratio >= 0.25)


if __name__ == "__main__":
    main()
