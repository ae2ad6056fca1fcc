"""The one-shot overhead of a job: what `acp-worker run` costs around the agent's run.

Three figures for `acp-worker run examples/hello.json --json` (the emulator), each with
its baseline measured in the same run, interleaved round by round:

1. CLI start → first event (the first JSONL line on stdout), against `python -c pass`
   (the interpreter's own start) and `python -c "import pydantic_settings"` (the settings
   library every command needs);
2. `job.completed` read → process exit, against a bare interpreter that prints one line
   and exits;
3. preparing the claude-agent-acp closure (8,460 files) for a launch when it has not
   changed (its verified record stands: the whole ``prepare_pack``), against a bare stat
   walk of the same tree; and the full re-hash, for scale.

`one_shot.py cli` or `one_shot.py closure` runs one part. With BASE=<the root of another
checkout> (`git archive <rev> | tar -x -C DIR`), the CLI figures are also taken for that
code, in the same rounds (its jobs run with PYTHONPATH=BASE); with BASE_PYCACHE=<dir> the
base side runs with that bytecode cache instead of the installed one (PYTHONPYCACHEPREFIX;
the script compiles the worker and the standard library into it, not site-packages: the
dependencies without bytecode, as uv installs them, against this side's). Medians over ROUNDS rounds
(default 9; FULL_ROUNDS=3 for the full re-hash). No assertion: the figures go to
docs/figures.md. The closure cache is ACPW_CACHE_DIR (the default cache if unset);
the first run materializes the claude pack there (`make packs` builds its archive).
Targets (issue 14, item 5): first event ≤ 120 ms, completed → exit ≤ 20 ms, unchanged
closure ≤ 30 ms.
"""

from __future__ import annotations

import compileall
import os
import stat
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from _bench import dry_run, size, summary

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
ROUNDS = int(os.environ.get("ROUNDS", str(size(9, 1))))
FULL_ROUNDS = int(os.environ.get("FULL_ROUNDS", str(size(3, 1))))
FIGURES: dict[str, float] = {}
SANDBOX_UID = 61000  # a uid other than the worker's (the default sandbox_host_uid)


BASE = os.environ.get("BASE")
BASE_PYCACHE = os.environ.get("BASE_PYCACHE")
BASED = BASE is not None or BASE_PYCACHE is not None


def _run_job(pythonpath: str | None = None, pycache: str | None = None) -> tuple[float, float]:
    """(start → first JSONL line, job.completed line → exit), in ms."""
    argv = [sys.executable, "-m", "worker.cli", "run", "hello.json", "--json", "--quiet"]
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = pycache
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=EXAMPLES, env=env
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    first = time.perf_counter()
    completed = None
    for line in proc.stdout:
        if b'"type":"job.completed"' in line:
            completed = time.perf_counter()
    proc.wait()
    end = time.perf_counter()
    assert proc.returncode == 0, "the hello job failed"
    assert completed is not None, "no job.completed"
    return (first - start) * 1e3, (end - completed) * 1e3


def _interpreter(code: str) -> tuple[float, float]:
    """(start → first line, that line → exit) of ``python -c code``, in ms."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=EXAMPLES)
    assert proc.stdout is not None
    proc.stdout.readline()
    first = time.perf_counter()
    proc.wait()
    end = time.perf_counter()
    return (first - start) * 1e3, (end - first) * 1e3


def _stat_walk(root: Path) -> float:
    """A bare lstat of every entry below ``root``, in ms."""
    start = time.perf_counter()
    pending = [os.fspath(root)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            pending.extend(
                entry.path
                for entry in entries
                if stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode)
            )
    return (time.perf_counter() - start) * 1e3


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _compile(root: Path) -> None:
    """Bytecode for the worker's modules, as an installed worker has (with
    PYTHONDONTWRITEBYTECODE set, every run would compile them from source again)."""
    compileall.compile_dir(root / "worker", quiet=1)


def cli_figures() -> None:
    _compile(REPO)
    if BASE is not None:
        _compile(Path(BASE))
    if BASE_PYCACHE is not None:
        # With a prefix Python reads no __pycache__ at all: the worker's bytecode and the
        # standard library's go there too, as this side has them.
        stdlib = sysconfig.get_paths()["stdlib"]
        subprocess.run(
            [sys.executable, "-X", f"pycache_prefix={BASE_PYCACHE}", "-m", "compileall", "-q",
             "-j", "0", "-x", "site-packages|test", str(Path(BASE or REPO) / "worker"), stdlib],
            check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    _run_job()  # warm-up: materializes the emulator pack, fills the page cache
    bare, settings, first, exit_bare, exit_job = [], [], [], [], []
    base_first, base_exit = [], []
    for _ in range(ROUNDS):
        if BASED:
            job_first, job_exit = _run_job(BASE, BASE_PYCACHE)
            base_first.append(job_first)
            base_exit.append(job_exit)
        bare.append(_interpreter("print('x', flush=True)")[0])
        settings.append(_interpreter("import pydantic_settings; print('x', flush=True)")[0])
        line_exit = _interpreter("print('x', flush=True)")[1]
        job_first, job_exit = _run_job()
        first.append(job_first)
        exit_bare.append(line_exit)
        exit_job.append(job_exit)
    FIGURES["first"], FIGURES["exit"] = _median(first), _median(exit_job)
    print(f"CLI start → first event   median {_median(first):7.1f} ms (n={ROUNDS})")
    print(f"  python -c pass start     median {_median(bare):7.1f} ms: ratio {_ratio(first, bare)}")
    print(f"  import pydantic_settings median {_median(settings):7.1f} ms: ratio "
          f"{_ratio(first, settings)}")  # fmt: skip
    if BASED:
        print(f"  BASE's first event       median {_median(base_first):7.1f} ms: ratio "
              f"{_ratio(first, base_first)} of it")  # fmt: skip
    print(f"job.completed → exit      median {_median(exit_job):7.1f} ms")
    print(f"  bare line → exit         median {_median(exit_bare):7.1f} ms: ratio "
          f"{_ratio(exit_job, exit_bare)}")  # fmt: skip
    if BASED:
        print(f"  BASE's completed → exit  median {_median(base_exit):7.1f} ms: ratio "
              f"{_ratio(exit_job, base_exit)} of it")  # fmt: skip


def _ratio(values: list[float], baseline: list[float]) -> str:
    return f"{_median(values) / _median(baseline):.2f}x"


def closure_figures() -> None:
    from worker.packs.runtime import load_declaration, prepare_pack
    from worker.packs.verify import verify_closure
    from worker.settings import Settings

    settings = Settings()
    pack = load_declaration(settings, "claude-agent-acp")
    lock = pack.read_lock(pack.for_platform(None))

    def launch() -> tuple[float, int]:
        # What a launch pays for it: the whole prepare_pack (the lock's parse included
        # when it runs), not only the verification's own clock.
        start = time.perf_counter()
        prepared = prepare_pack(settings, pack, sandbox_uids=(SANDBOX_UID,))
        return (time.perf_counter() - start) * 1e3, prepared.stats.hashed_bytes

    closure = prepare_pack(settings, pack).closure  # materialized if missing
    launch()  # a full verification that writes the record (unless the scan was racy)
    if launch()[1] != 0:
        time.sleep(2.5)  # just materialized: wait out the racy window, then record
        launch()
    walk, fast, hashed = [], [], 0
    for _ in range(ROUNDS):
        walk.append(_stat_walk(closure))
        seconds, hashed_bytes = launch()
        fast.append(seconds)
        hashed += hashed_bytes
    full = _timed(lambda: verify_closure(closure, lock).seconds * 1e3, FULL_ROUNDS)
    FIGURES["closure"] = _median(fast)
    print(f"unchanged closure verify  median {_median(fast):7.1f} ms ({len(lock.files)} files, "
          f"{hashed} bytes hashed over {ROUNDS} launches)")  # fmt: skip
    print(f"  bare stat walk           median {_median(walk):7.1f} ms: ratio {_ratio(fast, walk)}")
    print(f"  full re-hash             median {_median(full):7.1f} ms (n={FULL_ROUNDS}): "
          f"{_median(full) / _median(fast):.0f}x the fast path")  # fmt: skip


def _timed(measure: Callable[[], float], rounds: int) -> list[float]:
    return [measure() for _ in range(rounds)]


def main() -> int:
    dry_run("first event ≤ 120 ms, completed → exit ≤ 20 ms, unchanged closure ≤ 30 ms")
    part = sys.argv[1] if len(sys.argv) > 1 else "all"  # `cli`, `closure` or `all`
    if part in {"cli", "all"}:
        cli_figures()
    if part in {"closure", "all"}:
        closure_figures()
    first, done, closure = (FIGURES.get(k) for k in ("first", "exit", "closure"))
    figures = [f"first event {first:.0f} ms, completed → exit {done:.0f} ms"] if first else []
    figures += [f"unchanged closure {closure:.0f} ms"] if closure else []
    summary(
        "; ".join(figures),
        "first event ≤ 120 ms, completed → exit ≤ 20 ms, unchanged closure ≤ 30 ms",
        (first is None or (first <= 120 and (done or 0) <= 20))
        and (closure is None or closure <= 30),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
