#!/usr/bin/python3
"""Offline emulator of Cursor's `agent acp`, for tests of acp-worker.

Launch exactly as the pack manifest does:
    /usr/bin/python3 /opt/acp-pack/cursor_emulator.py --disable-project-configs \
        --disable-auto-update acp
Stdlib only. Only JSON-RPC goes to stdout; see README.md for the scenario language.
"""

from __future__ import annotations

import os
import sys
import time

# The C module under `signal`: the same handlers, without the enums signal.py builds
# (every start would pay for them; nothing here needs more than these three names).
from _signal import SIG_DFL, SIGTERM, signal  # type: ignore[import-not-found]

# The pack is mounted read-only; never try to write __pycache__ next to it.
sys.dont_write_bytecode = True

from cursor_emu.agent import Agent, Settings  # noqa: E402
from cursor_emu.rpc import Transport  # noqa: E402

EXPECTED_ARGS = ["--disable-project-configs", "--disable-auto-update", "acp"]


def install_sigterm(agent: Agent) -> None:
    """SIGTERM kills us, unless a scenario said `ignore-sigterm` (for shutdown tests).

    Python only lets the main thread install handlers, so the scenario flips a flag.
    """

    def on_sigterm(signum: int, _frame: object) -> None:
        if agent.ignore_sigterm:
            return
        signal(signum, SIG_DFL)
        os.kill(os.getpid(), signum)

    signal(SIGTERM, on_sigterm)


def main(argv: list[str]) -> int:
    if argv != EXPECTED_ARGS:
        sys.stderr.write(
            "cursor-emulator: refusing to start; expected arguments: "
            + " ".join(EXPECTED_ARGS)
            + "\n"
        )
        return 2
    settings = Settings.from_env(os.environ)
    agent = Agent(Transport(sys.stdout.buffer), settings)
    install_sigterm(agent)
    for line in sys.stdin.buffer:
        agent.handle_line(line)
    # The real binary can take seconds to exit after stdin EOF (FACTS §1).
    if settings.exit_delay:
        time.sleep(settings.exit_delay)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: turn threads may still be blocked on the client.
    os._exit(code)
