"""``level_value``: a job's thinking level becomes only a value the catalog offers."""

from __future__ import annotations

import pytest

from worker.acp.selection import level_value

EFFORT = ["low", "medium", "high", "xhigh"]


@pytest.mark.parametrize(
    ("param", "level", "offered", "value"),
    [
        ("effort", "xhigh", EFFORT, "xhigh"),
        ("reasoning", "xhigh", ["low", "high", "extra-high"], "extra-high"),
        ("effort", "max", EFFORT, None),  # max only to max: no step down to xhigh either
        ("effort", "max", [*EFFORT, "max"], "max"),
        ("effort", "off", EFFORT, None),
        ("reasoning_effort", "off", ["none", "low"], "none"),
        ("reasoning", "high", ["low", "medium"], None),  # never a step up
        ("thinking", "off", ["false", "true"], "false"),
        ("thinking", "low", ["false", "true"], "true"),
        ("thinking", "xhigh", ["true"], "true"),
        ("thinking", "off", ["true"], None),
        ("thinking", "high", ["low", "high"], "high"),  # a non-boolean `thinking` is a level
    ],
)
def test_levels(param: str, level: str, offered: list[str], value: str | None) -> None:
    assert level_value(param, level, offered) == value
