"""A real agent's job through a resident ``acp-worker serve``, cold and warm, against the
same exchange driven directly.

One ``acp-worker serve --concurrency 2`` per mode, each on its own queue (``ACPW_QUEUE``)
of the same Redis dbs, stays up for the whole run, and one resident
:class:`worker.client.Client` per mode submits to it; the modes are interleaved round by
round (so a slow spell of a noisy machine falls on both alike):

- **cold**: no ``ACPW_WARM_POOLS``: each job creates its sandbox and spawns its agent;
- **warm**: ``ACPW_WARM_POOLS`` names every pack measured here, so a job claims a slot whose
  sandbox exists and whose agent answered ``initialize``. When the tree has no warm pools
  (``Settings`` has no such setting, or a job's ``sandbox.ready`` lacks ``warm: true``) the
  mode says ``warm: unavailable`` and measures nothing.

For claude-agent-acp and codex-acp (the packs ``make packs`` builds): submit → first
assistant text (the first ``message.delta``) and submit → ``job.completed``, against the
agent driven directly over ACP stdio (spawn → first ``agent_message_chunk``, spawn →
exit: ``benchmarks/real_agent.py``'s baseline, the same fake model API on loopback),
interleaved round by round with both modes' jobs (one direct baseline for both), medians.
After each service job, the next side waits until what that job left running is over
(``quiet``: its tail, which ends after the task returned, and in the warm mode the slot
that replaces the one it claimed). Without that wait, the side after a warm job shared
the machine with the replacement's start (for claude a node start, about half a second of
CPU), and the direct baseline, which followed the warm job in two rounds of three, came
out 60-120 ms slower than alone: every ratio against it looked better than it was.
For the emulator's hello job (``examples/hello.json``): submit → ``job.completed`` cold
against warm, one of each per round, and jobs/s with two jobs at a time: ``--jobs`` hello
jobs submitted at once, ``--bursts`` bursts per mode alternating between the modes, their
median. The claim time, when ``sandbox.ready`` carries one, is reported as its p95.

It ends with one line per agent and mode,
``<pack> <cold|warm>: <ratio>x direct (<ms> ms vs <ms> ms)``, and the summary line.
Targets: cold ≤ 1.10x direct; warm ≤ 0.6x (codex-acp), ≤ 0.8x (claude-agent-acp);
claim ≤ 50 ms p95; emulator warm ≤ 0.6x cold; ≥ 20 jobs/s warm. It says whether the host's
cgroup2 is mounted with ``favordynmods`` (docs/operating.md, "cgroup migrations"): without
it a cold job's agent start joins its cgroups cheaply only because the worker primes the
migrations (``ACPW_CGROUP_PRIME``, on: the serves take no ``ACPW_*`` from this script's
environment), which would otherwise wait 6-19 ms more. It changes nothing.

    .venv/bin/python benchmarks/service_agent.py [--runs 7] [--modes cold,warm]
        [--packs claude-agent-acp,codex-acp] [--jobs 40] [--bursts 3]

Uses Redis db 12 (events) and 11 (broker) unless ACPW_BENCH_REDIS_URL / _BROKER_URL say
otherwise; both are flushed. ``BENCH_VERBOSE=1`` prints each job's ``timings_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402
from _bench import QUICK, dry_run, size, summary  # noqa: E402
from real_agent import CPUS, CREDENTIAL, JOB_EXTRA, PROMPT, _worker_env  # noqa: E402

from tests.fake_models import FakeModel, say  # noqa: E402 - after the path
from tests.integration.real_agents import ENDPOINTS, agent_session, extract_closure  # noqa: E402
from worker.client import Client  # noqa: E402
from worker.sandbox.cgroups import dynmods_favored  # noqa: E402
from worker.settings import Settings  # noqa: E402
from worker.store import keys  # noqa: E402

URL = os.environ.get("ACPW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
BROKER = os.environ.get("ACPW_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
STORE = redis.Redis.from_url(URL)
EMULATOR = "cursor-emulator"
#: Warm ratio targets against the direct exchange, per pack (cold: COLD_TARGET for all).
WARM_TARGET = {"codex-acp": 0.6, "claude-agent-acp": 0.8}
COLD_TARGET = 1.10
CLAIM_TARGET_MS = 50.0
HELLO_TARGET = 0.6
RATE_TARGET = 20.0
#: Between two warm jobs, time for the pool to fill the claimed slot again (a sandbox, a
#: spawn, an ``initialize``: up to about 2 s for codex-acp on a loaded 2-core machine).
REFILL_S = 3.0
#: ``BENCH_TRACE=1``: each job's events with when each was written and seen (ms).
TRACE = bool(os.environ.get("BENCH_TRACE"))
#: How often a throughput burst looks at its oldest unsettled job.
POLL_S = 0.005
TARGET = (
    "cold ≤ 1.10x direct; warm ≤ 0.6x (codex), ≤ 0.8x (claude); claim p95 ≤ 50 ms; "
    "hello warm ≤ 0.6x cold; ≥ 20 jobs/s warm"
)


@dataclass
class Job:
    """What one job through the service took, from its submit."""

    first_text_s: float | None
    completed_s: float
    warm: bool
    claim_ms: float | None
    timings_ms: dict[str, float] = field(default_factory=dict)


def warm_pools_known() -> bool:
    """Whether this tree's settings have the warm pools at all."""
    return "warm_pools" in Settings.model_fields


def claim_of(ready: dict[str, Any]) -> float | None:
    """The claim time ``sandbox.ready`` reports (a numeric field named ``claim…``), ms."""
    for key, value in ready.items():
        if "claim" in key and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) * (1000.0 if key.endswith("_s") else 1.0)
    return None


def through_service(client: Client, spec: dict[str, Any]) -> Job:
    """Submit ``spec`` and follow it to its ``job.completed``; it must succeed."""
    start, wall = time.perf_counter(), time.time()
    client.submit(spec)
    trail: list[str] = []
    first: float | None = None
    ready: dict[str, Any] = {}
    last: dict[str, Any] = {}
    for item in client.events(spec["job_id"], follow=True, timeout=180):
        event = dict(item.event)
        data = event.get("data", {})
        if TRACE:
            at = datetime.fromisoformat(str(event["ts"])).timestamp()
            seen = time.perf_counter() - start
            trail.append(f"{event.get('type')} {1000 * (at - wall):.0f}/{1000 * seen:.0f}")
        if event.get("type") == "sandbox.ready":
            ready = data
        elif (
            first is None
            and event.get("type") == "message.delta"
            and data.get("role") == "assistant"
        ):
            first = time.perf_counter() - start
        last = event
    took = time.perf_counter() - start
    data = last.get("data", {})
    if last.get("type") != "job.completed" or data.get("status") != "succeeded":
        sys.exit(f"{spec['job_id']} did not succeed: {json.dumps(last)[:2000]}")
    timings = data.get("timings_ms", {})
    if os.environ.get("BENCH_VERBOSE"):
        print(f"  {spec['pack']['name']} phases (ms): {timings}", file=sys.stderr)
    if TRACE:  # each event: written / seen by the client, ms after the submit
        print(f"  {spec['pack']['name']} events: {'; '.join(trail)}", file=sys.stderr)
    return Job(first, took, ready.get("warm") is True, claim_of(ready), timings)


async def direct(pack: str, closure: Path, fake: FakeModel, tmp: Path) -> tuple[float, float]:
    """(spawn → first agent text, spawn → exit) of the agent driven directly, seconds."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "ws").mkdir()
    fake.add(say("hello"))
    first: list[float] = []
    start = time.perf_counter()
    async with agent_session(pack, closure, work, fake, workspace=work / "ws") as session:
        turn = asyncio.ensure_future(session.prompt(PROMPT))
        while not turn.done():  # the first chunk, seen within a millisecond
            if not first and "agent_message_chunk" in session.kinds():
                first.append(time.perf_counter() - start)
            await asyncio.sleep(0.001)
        stop = turn.result()
        if not first:
            first.append(time.perf_counter() - start)
    assert stop == "end_turn", stop
    return first[0], time.perf_counter() - start


def agent_job(pack: str, tmp: Path, tag: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "ws").mkdir()
    return {
        "v": 1,
        "job_id": f"svc-{tag}-{uuid.uuid4().hex[:10]}",
        "pack": {"name": pack},
        "workspace": {"kind": "local", "path": str(work / "ws")},
        "prompt": PROMPT,
        "credentials": {CREDENTIAL[pack]: "file:key"},
        **JOB_EXTRA.get(pack, {}),
        "limits": {"cpus": float(CPUS)},  # as many cores as the direct side has
    }


def hello_job(tag: str) -> dict[str, Any]:
    data = json.loads((REPO / "examples" / "hello.json").read_text())
    data["job_id"] = f"svc-{tag}-{uuid.uuid4().hex[:10]}"
    data["workspace"]["path"] = str(REPO / "examples" / "hello-workspace")
    return data


def service_env(
    tmp: Path, fakes: dict[str, FakeModel], warm: dict[str, int] | None
) -> dict[str, str]:
    """The serve's environment: real_agent's (per pack), every pack's endpoint at once."""
    endpoints: dict[str, Any] = {}
    env: dict[str, str] = {}
    for pack, fake in fakes.items():
        env = _worker_env(tmp, fake, pack)
        endpoints[f"bench-{pack}"] = json.loads(env["ACPW_MODEL_ENDPOINTS"])["bench"]
    if not fakes:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACPW_")}
        env.update(ACPW_CACHE_DIR=str(tmp / "cache"), ACPW_WORK_DIR=str(tmp / "work"))
        env.update(ACPW_RESULTS_DIR=str(tmp / "results"), ACPW_SECRETS_DIR=str(tmp / "secrets"))
        (tmp / "secrets").mkdir(exist_ok=True)
    else:
        env["ACPW_MODEL_ENDPOINTS"] = json.dumps(endpoints)
    key = REPO / "examples" / "secrets" / "emulator-api-key"
    shutil.copy(key, Path(env["ACPW_SECRETS_DIR"]) / key.name)
    env.update(ACPW_REDIS_URL=URL, ACPW_BROKER_URL=BROKER)
    if warm is not None:
        env["ACPW_WARM_POOLS"] = json.dumps(warm)
    return env


@contextmanager
def serving(env: dict[str, str], log: Path) -> Iterator[Client]:
    """A resident ``acp-worker serve --concurrency 2`` and a client of it."""
    acp_worker = str(Path(sys.executable).with_name("acp-worker"))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [acp_worker, "serve", "--concurrency", "2"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while " ready." not in log.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"the worker did not start; see {log}:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        queue = env.get("ACPW_QUEUE", Settings.model_fields["queue"].default)
        settings = Settings(redis_url=URL, broker_url=BROKER, queue=queue)
        with Client(URL, settings=settings) as client:
            yield client
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@dataclass
class Mode:
    """What one mode measured: per pack the service's jobs and the direct runs."""

    name: str
    available: bool = True
    why: str = ""
    jobs: dict[str, list[Job]] = field(default_factory=dict)
    direct: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    hello: list[Job] = field(default_factory=list)
    rate: float | None = None
    #: Each burst's jobs/s (``rate`` is their median).
    rates: list[float] = field(default_factory=list)
    #: The mode's serve log (``quiet`` counts the warm slots it made).
    log: Path | None = None


def start_mode(
    name: str,
    stack: ExitStack,
    tmp: Path,
    fakes: dict[str, FakeModel],
    closures: dict[str, Path],
) -> tuple[Mode, Client | None]:
    """The mode's resident serve, on its own queue, warmed up; its client, or None when
    the mode is unavailable (``Mode.why`` says why)."""
    warm = None
    if name == "warm":
        if not warm_pools_known():
            why = "this tree has no ACPW_WARM_POOLS setting"
            return Mode(name, available=False, why=why), None
        warm = {**dict.fromkeys(fakes, 1), EMULATOR: 2}
    mtmp = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{name}-"))
    env = service_env(mtmp, fakes, warm)
    env["ACPW_QUEUE"] = f"bench-{name}"  # the other mode's serve shares the Redis dbs
    client = stack.enter_context(serving(env, mtmp / "serve.log"))
    cold_pack = warm_up(client, fakes, closures, mtmp, name, REFILL_S if warm else 0.0)
    if cold_pack is not None:
        why = f"{cold_pack}'s sandbox.ready lacks warm: true"
        return Mode(name, available=False, why=why), None
    return Mode(name, log=mtmp / "serve.log"), client


def run_modes(
    names: list[str], opts: argparse.Namespace, tmp: Path, closures: dict[str, Path]
) -> dict[str, Mode]:
    """Every mode's serve up at once, the modes interleaved round by round: the agents'
    jobs against one direct baseline, the hello jobs, then alternating throughput
    bursts. A slow spell of a noisy machine so falls on every mode alike."""
    for url in (URL, BROKER):
        redis.Redis.from_url(url).flushdb()
    with ExitStack() as stack:
        fakes = {p: stack.enter_context(ENDPOINTS[p].fake([])) for p in opts.packs}
        modes: dict[str, Mode] = {}
        clients: dict[str, Client] = {}
        for name in names:
            modes[name], client = start_mode(name, stack, tmp, fakes, closures)
            if client is not None:
                clients[name] = client
        # The warm mode waits for its pool to fill the slot a job claimed (the other
        # modes' jobs of the round run first, so the wait is shorter than it says).
        pause = REFILL_S if "warm" in clients else 0.0
        for pack in opts.packs:
            agent_rounds(pack, modes, clients, opts.runs, tmp, fakes, closures[pack], pause)
        for i in range(opts.runs):
            for name in rotated(list(clients), i):
                job = through_mode(clients[name], modes[name], hello_job(f"{name}-h{i}"))
                modes[name].hello.append(job)
            time.sleep(pause)
        for i in range(opts.bursts):
            for name in rotated(list(clients), i):
                modes[name].rates.append(throughput(clients[name], name, opts.jobs))
                time.sleep(pause)  # the pool's refills settle before the next burst
        for name in clients:
            modes[name].rate = statistics.median(modes[name].rates)
    return modes


def slots_made(mode: Mode) -> int:
    """How many warm slots the mode's serve has made so far (its log says each)."""
    if mode.log is None or not mode.log.exists():
        return 0
    return mode.log.read_text(errors="replace").count(" ready (made in ")


def quiet(mode: Mode, job_id: str, made_before: int) -> None:
    """Wait until what the job left running in the background is over, so that it never
    lands on the next side of the round: its tail (the task returns once ``job.completed``
    is written; the job's leftovers and lease go after it) and, for a warm serve, the
    slot it replaces (a sandbox, the agent's start, its ``initialize``: for claude a
    node start of about half a second of CPU). Bounded: a slot that is never made (its
    pack's pool was full) does not hold the run up longer than ``REFILL_S``."""
    deadline = time.monotonic() + REFILL_S
    lease = keys.lease(job_id)
    while STORE.exists(lease) and time.monotonic() < deadline:
        time.sleep(0.005)
    if mode.name != "warm":
        return
    while slots_made(mode) <= made_before and time.monotonic() < deadline:
        time.sleep(0.005)


def through_mode(client: Client, mode: Mode, spec: dict[str, Any]) -> Job:
    """``through_service``, then ``quiet``."""
    made = slots_made(mode)
    job = through_service(client, spec)
    quiet(mode, spec["job_id"], made)
    return job


def rotated(sides: list[str], i: int) -> list[str]:
    """``sides`` in round ``i``'s order: each starts one round in turn."""
    shift = i % len(sides) if sides else 0
    return sides[shift:] + sides[:shift]


def agent_rounds(
    pack: str,
    modes: dict[str, Mode],
    clients: dict[str, Client],
    runs: int,
    tmp: Path,
    fakes: dict[str, FakeModel],
    closure: Path,
    pause: float,
) -> None:
    """``runs`` rounds of one direct run and one job per live mode, in rotating order."""
    direct_runs: list[tuple[float, float]] = []
    for name in clients:
        modes[name].jobs[pack] = []
        modes[name].direct[pack] = direct_runs  # one baseline, shared
    for i in range(runs):
        for side in rotated(["direct", *clients], i):
            if side == "direct":
                direct_runs.append(asyncio.run(direct(pack, closure, fakes[pack], tmp)))
            else:
                fakes[pack].add(say("hello"))
                spec = agent_job(pack, tmp, f"{side}-{i}")
                modes[side].jobs[pack].append(through_mode(clients[side], modes[side], spec))
        time.sleep(pause)


def warm_up(
    client: Client,
    fakes: dict[str, FakeModel],
    closures: dict[str, Path],
    tmp: Path,
    name: str,
    pause: float,
) -> str | None:
    """Two jobs per pack (the closure into the cache and its verified record, the page
    cache, the pool's first slot for the job's launch identity) and one direct run; in
    the warm mode, the first pack none of whose jobs found a warm slot, or None."""
    warm = name == "warm"
    for pack, fake in fakes.items():

        def job(pack: str = pack, fake: FakeModel = fake) -> Job:
            fake.add(say("hello"))
            return through_service(client, agent_job(pack, tmp, f"{name}-up"))

        # Two: the first extracts the closure, whose verified record is written only by
        # the second check, once the fresh files are older than its racy window.
        seen = [job(), job()]
        asyncio.run(direct(pack, closures[pack], fake, tmp))
        if warm and not claims_warm(seen, job, pause):
            return pack
    seen = [through_service(client, hello_job(f"{name}-up"))]
    if warm and not claims_warm(seen, lambda: through_service(client, hello_job("up")), pause):
        return EMULATOR
    return None


def claims_warm(seen: list[Job], job: Callable[[], Job], pause: float) -> bool:
    """Whether a job claimed a warm slot: one of ``seen``, or one of up to three more
    ``job()`` runs, ``pause`` apart (a pool fills a slot for a launch identity once it has
    seen a job of it, which takes a sandbox, a spawn and an ``initialize``)."""
    for _ in range(3):
        if any(j.warm for j in seen):
            return True
        time.sleep(pause)
        seen = [job()]
    return any(j.warm for j in seen)


def throughput(client: Client, name: str, n: int) -> float:
    """Jobs/s of ``n`` hello jobs submitted at once (the serve runs two at a time).

    The client waits on each job's state (one ``HGETALL`` every few milliseconds, for the
    oldest job not yet settled), not on its events: a control plane reads the event
    streams on its own host, and parsing every event here would take the serve's two
    cores from it. Each job must have succeeded, and its stream must end with its
    ``job.completed``."""
    specs = [hello_job(f"{name}-r{i}") for i in range(n)]
    start = time.perf_counter()
    for spec in specs:
        client.submit(spec)
    deadline = time.monotonic() + 300
    for spec in specs:
        while not client.get(spec["job_id"]).settled:
            if time.monotonic() > deadline:
                sys.exit(f"{spec['job_id']} did not settle within 300 s")
            time.sleep(POLL_S)
    took = time.perf_counter() - start
    for spec in specs:
        last: dict[str, Any] = {}
        for item in client.events(spec["job_id"]):
            last = dict(item.event)
        if last.get("type") != "job.completed" or last["data"].get("status") != "succeeded":
            sys.exit(f"{spec['job_id']} did not succeed: {json.dumps(last)[:2000]}")
    return n / took


def report(modes: dict[str, Mode], packs: list[str]) -> None:
    lines, figures, met = [], [], True
    claims: list[float] = []
    hello: dict[str, float] = {}
    for mode in modes.values():
        if not mode.available:
            print(f"{mode.name}: unavailable ({mode.why})")
            continue
        for pack in packs:
            jobs, direct_runs = mode.jobs[pack], mode.direct[pack]
            done = statistics.median(j.completed_s for j in jobs)
            first = statistics.median(j.first_text_s or j.completed_s for j in jobs)
            d_done = statistics.median(d[1] for d in direct_runs)
            d_first = statistics.median(d[0] for d in direct_runs)
            cold = sum(not j.warm for j in jobs)
            claims += [j.claim_ms for j in jobs if j.claim_ms is not None]
            phases = {
                k: round(statistics.median(j.timings_ms.get(k, 0.0) for j in jobs), 1)
                for k in jobs[0].timings_ms
            }
            print(
                f"{pack} {mode.name}: submit → first text {ms(first)} ms vs {ms(d_first)} ms "
                f"direct ({first / d_first:.2f}x); submit → job.completed {ms(done)} ms vs "
                f"{ms(d_done)} ms spawn → exit (medians of {len(jobs)}, interleaved"
                + (f"; {cold} of them found no warm slot" if mode.name == "warm" and cold else "")
                + ")"
            )
            print(f"  {pack} {mode.name} phases, medians (ms): {phases}")
            ratio = done / d_done
            target = COLD_TARGET if mode.name == "cold" else WARM_TARGET.get(pack, 0.6)
            met = met and ratio <= target
            lines.append(
                f"{pack} {mode.name}: {ratio:.2f}x direct ({ms(done)} ms vs {ms(d_done)} ms)"
            )
        hello[mode.name] = statistics.median(j.completed_s for j in mode.hello)
        print(
            f"{EMULATOR} hello {mode.name}: submit → job.completed {ms(hello[mode.name])} ms "
            f"(median of {len(mode.hello)}); {mode.rate:.1f} jobs/s with --concurrency 2 "
            f"(median of bursts: {', '.join(f'{r:.1f}' for r in mode.rates)})"
        )
        figures.append(f"hello {mode.name} {ms(hello[mode.name])} ms, {mode.rate:.1f} jobs/s")
    warm = modes.get("warm")
    if warm is not None and warm.available and "cold" in hello:
        ratio = hello["warm"] / hello["cold"]
        print(f"{EMULATOR} hello warm: {ratio:.2f}x cold")
        figures.append(f"hello warm {ratio:.2f}x cold")
        met = met and ratio <= HELLO_TARGET
    if warm is not None and warm.available:
        met = met and (warm.rate or 0.0) >= RATE_TARGET
    if claims:
        claim = p95(claims)
        print(f"claim p95 {claim:.1f} ms over {len(claims)} warm jobs")
        figures.append(f"claim p95 {claim:.1f} ms")
        met = met and claim <= CLAIM_TARGET_MS
    note = ""
    if warm is not None and not warm.available:
        note = "warm: unavailable"
        met = False
        lines += [f"{pack} warm: unavailable ({warm.why})" for pack in packs]
    for line in lines:
        print(line)
    figure = "; ".join([line.split(" (")[0] if "unavailable" in line else line for line in lines])
    # Whether a sandbox's first process joined its cgroups at once or after an RCU grace
    # period (docs/operating.md, "cgroup migrations"): cold figures differ by 6-19 ms.
    favored = dynmods_favored(Path("/proc/self/mountinfo").read_text())
    print(f"cgroup2 favordynmods: {'on' if favored else 'off (cgroup migrations primed)'}")
    figures.append(f"favordynmods {'on' if favored else 'off'}")
    summary("; ".join([figure, *figures]), TARGET, met, note=note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=size(7, 1))
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--packs", default="claude-agent-acp,codex-acp")
    parser.add_argument("--jobs", type=int, default=size(40, 4))
    parser.add_argument("--bursts", type=int, default=size(3, 1))
    opts = parser.parse_args()
    opts.packs = [p for p in opts.packs.split(",") if p]
    dry_run(TARGET)
    with tempfile.TemporaryDirectory(prefix="acpw-bench-svc-") as tmp:
        closures = {p: extract_closure(p, Path(tmp) / "closures") for p in opts.packs}
        try:
            modes = run_modes(opts.modes.split(","), opts, Path(tmp), closures)
        finally:
            for url in (URL, BROKER):
                redis.Redis.from_url(url).flushdb()
    if QUICK:
        print("(quick: one round, the figures mean nothing)")
    report(modes, opts.packs)


if __name__ == "__main__":
    main()
