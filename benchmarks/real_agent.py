"""A real agent's one-shot job through the worker against the same exchange driven directly.

For each npm agent pack (claude-agent-acp and codex-acp by default): the same prompt, the
same scripted fake model API on loopback (``tests/fake_models``), the same machine, runs
interleaved, medians. Two ways, each timed from process start to process exit:

- **direct**: the agent's own process from its pack closure, HOME in a temp dir, driven
  over ACP stdio (initialize, authenticate if the pack does, session/new, one prompt),
  then its stdin closed and its exit awaited (``tests/integration/real_agents.py``);
- **worker**: ``acp-worker run job.json`` on the local backend (bubblewrap), a warm pack
  cache, the fake declared as an operator model endpoint (``ACPW_MODEL_ENDPOINTS``),
  and as many cores as the direct side has (``limits.cpus``: the default job gets one
  core, whose quota alone slows node's start and the agent's first requests by about a
  third here; that is the job's limit, not the worker's overhead).

And ``acpx exec`` when ``acpx`` is on PATH. Target (issue 14): worker <= 1.15 x direct.

    .venv/bin/python benchmarks/real_agent.py [--runs 7] [--packs claude-agent-acp,codex-acp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _bench import dry_run, size, summary  # noqa: E402

from tests.fake_models import FakeModel, say  # noqa: E402 - after the path
from tests.integration.real_agents import ENDPOINTS, agent_session, extract_closure  # noqa: E402

KEY = "bench-model-key-0c4f"
PROMPT = "Say hello."
#: What a job of each agent says besides the prompt (codex: a model it has metadata for).
JOB_EXTRA: dict[str, dict[str, Any]] = {"codex-acp": {"model": {"id": "gpt-5.5"}}}
CREDENTIAL = {
    "claude-agent-acp": "ANTHROPIC_API_KEY",
    "codex-acp": "OPENAI_API_KEY",
    "gemini-cli": "GEMINI_API_KEY",
}
URL_PATH = {"codex-acp": "/v1"}
CPUS = os.cpu_count() or 1


async def direct(pack: str, closure: Path, fake: FakeModel, tmp: Path) -> float:
    """Seconds from spawning the agent to its exit, one prompt answered."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "ws").mkdir()
    fake.add(say("hello"))
    start = time.perf_counter()
    async with agent_session(pack, closure, work, fake, workspace=work / "ws") as session:
        stop = await session.prompt(PROMPT)
    assert stop == "end_turn", stop
    return time.perf_counter() - start


def worker(pack: str, fake: FakeModel, tmp: Path, env: dict[str, str]) -> float:
    """Seconds of ``acp-worker run`` for the same prompt; its job must succeed."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "ws").mkdir()
    job = {
        "v": 1,
        "job_id": f"bench-{work.name[-12:]}".replace("_", "-").lower(),
        "pack": {"name": pack},
        "workspace": {"kind": "local", "path": str(work / "ws")},
        "prompt": PROMPT,
        "credentials": {CREDENTIAL[pack]: "file:key"},
        **JOB_EXTRA.get(pack, {}),
        # The direct side runs on every core; the job gets as much (its default is 1 core).
        "limits": {"cpus": float(CPUS)},
    }
    (work / "job.json").write_text(json.dumps(job))
    fake.add(say("hello"))
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(work / "job.json"), "--json", "--quiet"],
        capture_output=True, text=True, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    took = time.perf_counter() - start
    last = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    if done.returncode != 0 or last.get("data", {}).get("status") != "succeeded":
        sys.exit(f"{pack} job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr}")
    if os.environ.get("BENCH_VERBOSE"):
        print(f"  {pack} worker phases (ms): {last['data'].get('timings_ms')}", file=sys.stderr)
    return took


def acpx(pack: str, tmp: Path) -> float | None:
    """``acpx exec`` of the same prompt, when it is installed (not here: no internet)."""
    if shutil.which("acpx") is None:
        return None
    start = time.perf_counter()
    subprocess.run(["acpx", "exec", pack, PROMPT], cwd=tmp, capture_output=True, check=False)
    return time.perf_counter() - start


def _worker_env(tmp: Path, fake: FakeModel, pack: str) -> dict[str, str]:
    secrets = tmp / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "key").write_text(KEY + "\n")
    endpoint = {
        "packs": [pack],
        "url": fake.url + URL_PATH.get(pack, ""),
        "plain_http": True,
        "private": True,
        "default": True,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
    env.update(
        {
            "ACPW_CACHE_DIR": str(tmp / "cache"),
            "ACPW_WORK_DIR": str(tmp / "work"),
            "ACPW_RESULTS_DIR": str(tmp / "results"),
            "ACPW_SECRETS_DIR": str(secrets),
            "ACPW_MODEL_ENDPOINTS": json.dumps({"bench": endpoint}),
        }
    )
    return env


async def measure(pack: str, runs: int, tmp: Path) -> dict[str, float | None]:
    closure = extract_closure(pack, tmp / "closures")
    with ENDPOINTS[pack].fake([]) as fake:
        env = _worker_env(tmp, fake, pack)
        worker(pack, fake, tmp, env)  # warm the pack cache (materialize once)
        await direct(pack, closure, fake, tmp)  # and the page cache for the direct side
        seen: dict[str, list[float]] = {"direct": [], "worker": []}
        for i in range(runs):
            order = ("direct", "worker") if i % 2 == 0 else ("worker", "direct")
            for side in order:
                took = (
                    await direct(pack, closure, fake, tmp)
                    if side == "direct"
                    else worker(pack, fake, tmp, env)
                )
                seen[side].append(took)
    return {
        "direct": statistics.median(seen["direct"]),
        "worker": statistics.median(seen["worker"]),
        "acpx": acpx(pack, tmp),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=size(7, 1))
    parser.add_argument("--packs", default="claude-agent-acp,codex-acp")
    opts = parser.parse_args()
    dry_run("≤ 1.15x the direct exchange")
    figures, met = [], True
    with tempfile.TemporaryDirectory(prefix="acpw-bench-agent-") as tmp:
        for pack in opts.packs.split(","):
            got = asyncio.run(measure(pack, opts.runs, Path(tmp)))
            direct_s, worker_s = got["direct"] or 0.0, got["worker"] or 0.0
            ratio = worker_s / direct_s
            verdict = "OK" if ratio <= 1.15 else "MISSED"
            figures.append(
                f"{pack} {ratio:.2f}x ({worker_s * 1000:.0f} vs {direct_s * 1000:.0f} ms)"
            )
            met = met and ratio <= 1.15
            print(
                f"{pack}: direct {direct_s * 1000:.0f} ms, worker {worker_s * 1000:.0f} ms "
                f"(median of {opts.runs}, interleaved): {ratio:.2f}x  target <= 1.15x -> {verdict}"
            )
            acpx_s = got["acpx"]
            print(
                f"  acpx exec: {acpx_s * 1000:.0f} ms, worker {worker_s / acpx_s:.2f}x"
                if acpx_s
                else "  acpx exec: not installed"
            )
    summary("; ".join(figures), "≤ 1.15x", met)


if __name__ == "__main__":
    main()
