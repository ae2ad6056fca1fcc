"""The CLI imports only the module of the sub-command it runs (worker/cli/__init__.py):
its table of which module registers which command must name every command."""

from __future__ import annotations

import argparse

from worker import cli


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


def test_every_registered_command_is_in_the_table() -> None:
    assert _commands(cli._build_parser([])) == set(cli._COMMANDS)


def test_each_command_registers_from_its_own_module() -> None:
    for command, module in cli._COMMANDS.items():
        registered = _commands(cli._build_parser([command]))
        assert command in registered, (command, module)
        assert registered == {c for c, m in cli._COMMANDS.items() if m == module}


def test_the_command_is_the_first_argument_that_is_not_an_option() -> None:
    assert cli._command(["--json", "run", "job.json"]) == "run"
    assert cli._command(["--help"]) is None
