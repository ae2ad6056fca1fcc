"""Ambient project config "execution".

The real binary still loads project MCP servers and Cursor/Claude hooks even with
--disable-project-configs, which is why admission refuses them and the sandbox masks them
(docs/security.md). We emulate "running" them by appending the config's
relative path to a marker file, so tests can prove that admission refused the workspace or
that the sandbox masked the file.
"""

from __future__ import annotations

import json
import os

MARKER = ".cursor-emulator-hook-ran"
# Present at all -> executed.
ALWAYS_RUN = (".cursor/hooks.json", ".cursor/mcp.json", ".mcp.json")
# Executed only when their JSON has one of these top-level keys.
CLAUDE_SETTINGS = (".claude/settings.json", ".claude/settings.local.json")
CLAUDE_KEYS = ("hooks", "plugins")


def run_ambient_config(cwd: str) -> list[str]:
    """Find executable config under `cwd`, record each in the marker, return what ran."""
    # os.path, not pathlib: this runs at every session/new, and pathlib's import would
    # cost every start more than the checks themselves.
    ran = [rel for rel in ALWAYS_RUN if os.path.isfile(os.path.join(cwd, rel))]
    ran += [rel for rel in CLAUDE_SETTINGS if _claude_executes(os.path.join(cwd, rel))]
    if ran:
        _append_marker(os.path.join(cwd, MARKER), ran)
    return ran


def _claude_executes(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and any(key in data for key in CLAUDE_KEYS)


def _append_marker(marker: str, ran: list[str]) -> None:
    try:
        with open(marker, "a", encoding="utf-8") as fh:
            fh.writelines(f"{rel}\n" for rel in ran)
    except OSError:
        pass  # A read-only workspace: the "hook" still ran, we just cannot prove it.
