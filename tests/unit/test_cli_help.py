"""``--help`` is read on a terminal: no reST markup (````x````, ``:class:`x```) in any
command's help, whichever module registers it."""

from __future__ import annotations

import argparse
import re

from worker.cli import _build_parser

MARKUP = re.compile(r"``|:(?:class|func|meth|data|attr|mod):`")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_parsers(child))
    return found


def test_no_help_text_carries_rest_markup() -> None:
    parsers = _parsers(_build_parser(["--help"]))
    assert len(parsers) > 20, "the walk found too few commands to prove anything"
    marked = {p.prog: MARKUP.findall(p.format_help()) for p in parsers}
    assert {prog: found for prog, found in marked.items() if found} == {}
