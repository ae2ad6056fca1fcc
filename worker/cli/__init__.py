"""The ``acp-worker`` command line.

Every sub-command handler has the signature ``handler(args, settings) -> int`` and
raises :class:`worker.errors.WorkerError` for anticipated failures; ``main`` turns those
into one readable line on stderr (or ``{"error": {...}}`` with ``--json``) and the
error's exit code. No traceback for anticipated errors.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import ClassVar, NoReturn

from worker.errors import EXIT_INVALID, InvalidInput, WorkerError
from worker.settings import Settings, load_settings

Handler = Callable[[argparse.Namespace, Settings], int]


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Let ``--json`` follow the sub-command too (``acp-worker run JOB.json --json``)."""
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )


#: Which module registers each sub-command: only the module of the command given is
#: imported (a plain ``run`` must not pay for the service's Celery, Redis and boto3
#: imports, nor the image builder's docker SDK); ``--help``, no command or an unknown
#: one registers them all.
_COMMANDS = {
    "run": "run",
    "schema": "run",
    "pack": "packs",
    "admission": "admission",
    "serve": "service",
    "reap": "service",
    "ready": "service",
    "submit": "service",
    "events": "service",
    "status": "service",
    "cancel": "service",
    "requeue": "service",
    "answer": "interactions",
    "interactions": "interactions",
    "image": "images",
    "agents": "agents",
    "budget": "budgets",
}
_MODULES = (
    "run",
    "packs",
    "admission",
    "service",
    "interactions",
    "images",
    "agents",
    "budgets",
)


class _Parser(argparse.ArgumentParser):
    """With ``--json`` anywhere on the command line, a usage error is one JSON line too
    (``invalid_input``, exit 2), not argparse's usage text. Sub-command parsers are of
    this class as well (``add_subparsers`` makes them so)."""

    #: The command line being parsed holds ``--json`` (set by :func:`main`).
    json_errors: ClassVar[bool] = False

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            _report(InvalidInput(f"{self.prog}: {message}"), as_json=True)
            sys.exit(EXIT_INVALID)
        super().error(message)


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="acp-worker",
        description="Runs coding agents in sandboxes for a control plane: one job here "
        "(run), or a worker of the job service (serve) and its client commands.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _registrars(_command(sys.argv[1:] if argv is None else argv)):
        register(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command's name: the first argument that is not an option (the only
    top-level option, ``--json``, takes no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _registrars(
    command: str | None = None,
) -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    module = _COMMANDS.get(command or "")
    names = _MODULES if module is None else (module,)
    return [importlib.import_module(f"worker.cli.{name}").register for name in names]


def _report(exc: WorkerError, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": exc.to_dict()}, ensure_ascii=False), file=sys.stderr)
    else:
        print(f"acp-worker: {exc.message} [{exc.code}]", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    _Parser.json_errors = "--json" in (sys.argv[1:] if argv is None else argv)
    parser = _build_parser(argv)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        handler: Handler = args.handler
        return handler(args, settings)
    except WorkerError as exc:
        _report(exc, as_json=args.json)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`acp-worker events J | head`): stop quietly, as `cat`
        # does; stdout now points nowhere so the interpreter's final flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        if argv is None:  # the program itself (`acp-worker`, `python -m worker.cli`)
            _before_exit()


def _before_exit() -> None:
    """The command is over (a job's sandbox destroyed, its events written and flushed)
    and the process is about to exit: keep the interpreter's exit short (not done for a
    caller that passes ``argv``, a test, whose process goes on). The interpreter's final
    garbage collections walk every object the run made (pydantic's validators, the
    modules' own) and took about 150 ms after ``job.completed``; frozen objects are not
    walked, and still freed as the modules are torn down. Nothing of the worker relies
    on a cycle's finalizer (cleanup is in ``finally`` and ``async with``), and atexit
    handlers and buffered streams still run and flush as before."""
    gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
