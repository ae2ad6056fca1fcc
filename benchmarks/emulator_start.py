"""CPU per start of the Cursor emulator pack, against a bare interpreter in the same run.

The emulator's process is a fixed cost of every emulator job (hello jobs, the warm pool's
slots): an interpreter start plus the imports and compilation of its modules (the pack is
read-only, so nothing is ever cached as bytecode). Measured, interleaved, N runs each, CPU
(user + sys) of each child from ``getrusage(RUSAGE_CHILDREN)``, medians:

- bare: ``/usr/bin/python3 -S -c pass``, the baseline;
- start: the pack's launch (argv and environment from ``pack.json``, the built archive
  extracted to a temporary directory) answering ``initialize``, then stdin EOF → exit;
- hello: the same, then ``session/new`` (cwd a temporary directory) and the prompt
  ``scenario: hello`` answered, then stdin EOF → exit: one hello job's emulator.

``CURSOR_API_KEY`` is set and ``HOME`` is a temporary directory. ``--archive`` measures
another build of the pack (a base revision's ``dist/``, say) with this ``pack.json``'s
launch. Target: a start ≤ 3.5x the baseline (what the emulator cannot do without, the
interpreter with ``site`` plus ``json`` and ``threading``, is ≈ 2.1x on its own).

    .venv/bin/python benchmarks/emulator_start.py [--runs 30] [--archive TAR]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from _bench import dry_run, size, summary

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "provider_packs" / "cursor-emulator"
ARCHIVE = PACK / "dist" / "cursor-emulator-linux.tar"
BARE = ["/usr/bin/python3", "-S", "-c", "pass"]
TARGET = "start ≤ 3.5x python3 -S -c pass"


def cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def measured(run: Callable[[], None]) -> float:
    """CPU ms of the one child `run` starts and waits for."""
    before = cpu_ms()
    run()
    return cpu_ms() - before


def bare() -> None:
    subprocess.run(BARE, check=True)


class Emulator:
    """The pack's launch, with `{pack}` and `{home}` expanded, driven over stdio."""

    def __init__(self, pack_dir: Path, home: Path, cwd: Path) -> None:
        launch = json.loads((PACK / "pack.json").read_text())["launch"]
        expand = {"{pack}": str(pack_dir), "{home}": str(home)}

        def fill(word: str) -> str:
            for key, value in expand.items():
                word = word.replace(key, value)
            return word

        self.argv = [fill(w) for w in launch["argv"]]
        self.env = {k: fill(v) for k, v in launch["env"].items()}
        self.env |= {"PATH": "/usr/bin:/bin", "HOME": str(home), "CURSOR_API_KEY": "bench"}
        self.cwd = cwd

    def run(self, *, hello: bool) -> None:
        proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, cwd=self.cwd
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        ids = iter(range(1, 100))

        def call(method: str, params: dict[str, object]) -> object:
            rid = next(ids)
            message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()
            for line in stdout:
                reply = json.loads(line)
                if reply.get("id") == rid and "method" not in reply:
                    assert "result" in reply, reply
                    return reply["result"]
            raise RuntimeError(f"the emulator exited before answering {method}")

        call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        if hello:
            session = call("session/new", {"cwd": str(self.cwd), "mcpServers": []})
            assert isinstance(session, dict)
            prompt = [{"type": "text", "text": "scenario: hello"}]
            result = call("session/prompt", {"sessionId": session["sessionId"], "prompt": prompt})
            assert result == {"stopReason": "end_turn"}, result
        stdin.close()
        stdout.read()
        assert proc.wait() == 0


def main(runs: int, archive: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pack_dir, home, cwd = root / "pack", root / "home", root / "ws"
        for folder in (pack_dir, home, cwd):
            folder.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(pack_dir, filter="data")
        emulator = Emulator(pack_dir, home, cwd)
        kinds: dict[str, Callable[[], None]] = {
            "bare": bare,
            "start": lambda: emulator.run(hello=False),
            "hello": lambda: emulator.run(hello=True),
        }
        for run in kinds.values():  # warm-up: page cache
            run()
        cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(runs):
            for kind, run in kinds.items():
                cpu[kind].append(measured(run))
        assert not list(pack_dir.rglob("__pycache__")), "bytecode was written to the pack"
    med = {kind: statistics.median(values) for kind, values in cpu.items()}
    print(f"archive: {archive}")
    print(f"runs: {runs} each, interleaved; CPU (user + sys) per process, medians")
    print(f"bare python3 -S -c pass          {med['bare']:6.1f} ms")
    start, hello = med["start"] / med["bare"], med["hello"] / med["bare"]
    print(f"emulator start (initialize)      {med['start']:6.1f} ms  {start:.2f}x bare")
    print(f"emulator hello session           {med['hello']:6.1f} ms  {hello:.2f}x bare")
    summary(
        f"emulator start {med['start']:.1f} ms CPU ({start:.2f}x a bare interpreter's "
        f"{med['bare']:.1f} ms), hello session {med['hello']:.1f} ms ({hello:.2f}x)",
        TARGET,
        start <= 3.5,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=size(30, 2))
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the pack's archive")
    args = parser.parse_args()
    dry_run(TARGET)
    if not args.archive.is_file():
        raise SystemExit(f"{args.archive}: no archive (build it: make emulator-pack)")
    main(args.runs, args.archive)
