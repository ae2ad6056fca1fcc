"""The scenario language: one verb per line, `#` comments, JSON where structured.

Parsing is strict and happens before anything plays, so a typo in a test script shows
up as an error text at the start of the turn instead of half a scenario.
"""

from __future__ import annotations

import json
import os
import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from typing import Any

PACK_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
SCENARIO_DIR = os.path.join(PACK_DIR, "scenarios")
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_DECODER = json.JSONDecoder()

# verb -> argument kind
VERBS: dict[str, str] = {
    "say": "text",
    "think": "text",
    "error-text": "text",
    "title": "text",
    "garbage": "text",
    "stderr": "text",
    "exec": "text",
    "exec-gated": "text",
    "tool": "object",
    "plan": "json",
    "permission": "object?",
    "ask-question": "object?",
    "create-plan": "object?",
    "update-todos": "object?",
    "task": "object?",
    "generate-image": "object?",
    "update": "object",
    "call": "object",
    "raw": "json",
    "sleep": "number",
    "bigline": "int",
    "crash": "int?",
    "write": "path-text",
    "stop": "word",
    "load-config": "none",
    "hang": "none",
    "ignore-sigterm": "none",
}


class ScenarioError(Exception):
    """A script that cannot be parsed or found; rendered to the client as error text."""


class Step:
    """One parsed line (a plain class: `dataclasses` costs every start its import)."""

    __slots__ = ("verb", "arg", "line")

    def __init__(self, verb: str, arg: Any, line: int) -> None:
        self.verb = verb
        self.arg = arg
        self.line = line


def parse(text: str) -> list[Step]:
    steps = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        verb, _, rest = line.partition(" ")
        kind = VERBS.get(verb)
        if kind is None:
            raise ScenarioError(f"line {number}: unknown verb {verb!r}")
        try:
            steps.append(Step(verb, _parse_arg(kind, rest.strip()), number))
        except ValueError as exc:
            raise ScenarioError(f"line {number}: {verb}: {exc}") from None
    return steps


def load_named(name: str) -> list[Step]:
    if not NAME_RE.match(name):
        raise ScenarioError(f"invalid scenario name {name!r}")
    try:
        with open(os.path.join(SCENARIO_DIR, f"{name}.scn"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        raise ScenarioError(f"unknown scenario {name!r}") from None
    return parse(text)


def _parse_arg(kind: str, rest: str) -> Any:
    if kind == "text":
        return _text(rest)
    if kind == "none":
        if rest:
            raise ValueError("takes no argument")
        return None
    if kind == "word":
        if not rest or " " in rest:
            raise ValueError("expects one word")
        return rest
    if kind in ("number", "int", "int?"):
        return _number(kind, rest)
    if kind == "path-text":
        return _path_text(rest)
    return _json(kind, rest)


def _text(rest: str) -> str:
    # A leading quote means a JSON string, so scripts can carry newlines and escapes.
    if rest.startswith('"'):
        value = json.loads(rest)
        if not isinstance(value, str):
            raise ValueError("expects a JSON string")
        return value
    return rest


def _number(kind: str, rest: str) -> float | int | None:
    if not rest:
        if kind == "int?":
            return None
        raise ValueError("expects a number")
    value = float(rest) if kind == "number" else int(rest)
    if value < 0:
        raise ValueError("expects a non-negative number")
    return value


def _path_text(rest: str) -> tuple[str, str]:
    if rest.startswith('"'):
        path, end = _DECODER.raw_decode(rest)
        if not isinstance(path, str):
            raise ValueError("path must be a JSON string")
        remainder = rest[end:]
    else:
        path, _, remainder = rest.partition(" ")
    if not path:
        raise ValueError("expects PATH TEXT")
    return path, _text(remainder.strip())


def _json(kind: str, rest: str) -> Any:
    if not rest:
        if kind == "object?":
            return {}
        raise ValueError("expects a JSON argument")
    value = json.loads(rest)
    if kind.startswith("object") and not isinstance(value, dict):
        raise ValueError("expects a JSON object")
    return value
