"""Stable rule ids and the table of project execution config the admission walks.

Rule ids are API: a control plane may branch on them, so they never change meaning.
The :data:`PROJECT_CONFIG` table is the single source of truth for both the admission
check (:mod:`worker.admission.check`) and the sandbox mask plan (:mod:`worker.admission.mask`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

CURSOR_MCP = "cursor.mcp"
CURSOR_HOOKS = "cursor.hooks"
CURSOR_PLUGINS = "cursor.plugins"
MCP_PROJECT = "mcp.project"
CLAUDE_HOOKS = "claude.hooks"
CLAUDE_PLUGINS = "claude.plugins"
CLAUDE_MCP = "claude.mcp"
CODEX_CONFIG = "codex.config"
CONFIG_SYMLINK = "config.symlink"
CONFIG_UNREADABLE = "config.unreadable"
CONFIG_NOT_REGULAR = "config.not_regular"
CONFIG_INVALID_JSON = "config.invalid_json"
CONFIG_TOO_LARGE = "config.too_large"
SYSTEM_HOOKS = "system.hooks"

RULES: frozenset[str] = frozenset(
    {
        CURSOR_MCP,
        CURSOR_HOOKS,
        CURSOR_PLUGINS,
        MCP_PROJECT,
        CLAUDE_HOOKS,
        CLAUDE_PLUGINS,
        CLAUDE_MCP,
        CODEX_CONFIG,
        CONFIG_SYMLINK,
        CONFIG_UNREADABLE,
        CONFIG_NOT_REGULAR,
        CONFIG_INVALID_JSON,
        CONFIG_TOO_LARGE,
        SYSTEM_HOOKS,
    }
)

#: Settings files are read whole to look for keys; anything larger is refused unread.
MAX_SETTINGS_BYTES = 1024 * 1024


class Expect(enum.Enum):
    """What a config path is when it exists (also how the sandbox masks it)."""

    FILE = "file"
    DIR = "dir"


# Top-level keys of Claude(-compatible) settings that make the agent run or load code.
# A key "declares" something when its JSON value is truthy: `"hooks": {}`, `false`,
# `null` or `[]` configure nothing and are admitted; anything else is refused without
# trying to understand its schema (a non-empty object of empty lists is still refused).
CLAUDE_EXEC_KEYS: Mapping[str, str] = {
    # Shell commands run on agent events; Cursor loads Claude hooks for compatibility.
    "hooks": CLAUDE_HOOKS,
    # Plugins bundle hooks, MCP servers and commands; both spellings have shipped.
    "plugins": CLAUDE_PLUGINS,
    "enabledPlugins": CLAUDE_PLUGINS,
    # Inline MCP server definitions start processes directly.
    "mcpServers": CLAUDE_MCP,
    # These start nothing alone: they pre-approve servers from `.mcp.json`. `.mcp.json` is
    # refused and masked, but an approval left in settings would turn any `.mcp.json`
    # that slips past (created mid-run, above the Git root) into a silent launch.
    "enableAllProjectMcpServers": CLAUDE_MCP,
    "enabledMcpjsonServers": CLAUDE_MCP,
}


@dataclass(frozen=True, slots=True)
class ConfigPath:
    """One config location, relative to a directory level (or to a system root).

    With ``keys`` unset, the entry existing at all refuses (``rule``, ``reason``); with
    ``keys`` it is a JSON settings file refused for each declared key, under that key's rule.
    """

    path: PurePosixPath
    expect: Expect
    rule: str
    reason: str
    keys: Mapping[str, str] | None = None


def _cfg(path: str, expect: Expect, rule: str, reason: str) -> ConfigPath:
    return ConfigPath(PurePosixPath(path), expect, rule, reason)


def _claude(path: str) -> ConfigPath:
    reason = "Claude settings declare code the agent would run."
    return ConfigPath(PurePosixPath(path), Expect.FILE, CLAUDE_HOOKS, reason, CLAUDE_EXEC_KEYS)


#: Directories that hold config files; each must itself be a real directory.
CONFIG_DIRS: tuple[str, ...] = (".cursor", ".claude", ".codex")

PROJECT_CONFIG: tuple[ConfigPath, ...] = (
    _cfg(
        ".cursor/mcp.json",
        Expect.FILE,
        CURSOR_MCP,
        "Cursor project MCP config starts server processes the job did not declare.",
    ),
    _cfg(
        ".cursor/hooks.json",
        Expect.FILE,
        CURSOR_HOOKS,
        "Cursor project hooks run shell commands on agent events.",
    ),
    _cfg(
        ".cursor/plugins",
        Expect.DIR,
        CURSOR_PLUGINS,
        "Cursor plugin directory loads code the job did not declare.",
    ),
    _cfg(
        ".cursor/extensions",
        Expect.DIR,
        CURSOR_PLUGINS,
        "Cursor extension directory loads code the job did not declare.",
    ),
    _cfg(
        ".mcp.json",
        Expect.FILE,
        MCP_PROJECT,
        "Project MCP config (.mcp.json) starts server processes the job did not declare.",
    ),
    _claude(".claude/settings.json"),
    _claude(".claude/settings.local.json"),
    # Refused whatever agent the job runs: a workspace is admitted or not on its own, and
    # the mask plan is the same for every provider. codex-acp 2.6.0 started an MCP server
    # declared here in an untrusted workspace (tests/conformance/README.md). The file is
    # TOML and also declares notify commands and profiles; nothing in it is needed to run
    # a job, so it is refused whole rather than parsed.
    _cfg(
        ".codex/config.toml",
        Expect.FILE,
        CODEX_CONFIG,
        "Codex project config (.codex/config.toml) can start MCP servers and notify commands.",
    ),
)

_KEY_REASONS: Mapping[str, str] = {
    CLAUDE_HOOKS: "Claude settings declare hooks, which run shell commands on agent events.",
    SYSTEM_HOOKS: "Managed Claude settings declare hooks, which Cursor runs for every project.",
    CLAUDE_PLUGINS: "Claude settings enable plugins, which load hooks, MCP servers and commands.",
    CLAUDE_MCP: "Claude settings declare or pre-approve MCP servers, which start processes.",
}


def key_reason(rule: str, key: str) -> str:
    """The sentence for a settings-key finding, naming the offending key."""
    return f"{_KEY_REASONS[rule][:-1]} (key {key!r})."


# Enterprise/system locations per provider, relative to each system root (``/`` on a
# host; a sandbox image's root filesystem when the check runs in its mount view).
SYSTEM_CONFIG: Mapping[str, tuple[ConfigPath, ...]] = {
    "cursor": (
        _cfg(
            "etc/cursor/hooks.json",
            Expect.FILE,
            SYSTEM_HOOKS,
            "Enterprise Cursor hooks run shell commands on agent events in every project.",
        ),
        # Cursor loads Claude hooks for compatibility, including the managed (enterprise) file;
        # only its hooks matter here, so other managed policy keys are admitted.
        ConfigPath(
            PurePosixPath("etc/claude-code/managed-settings.json"),
            Expect.FILE,
            SYSTEM_HOOKS,
            "Managed Claude settings declare hooks.",
            {"hooks": SYSTEM_HOOKS},
        ),
    ),
    # Claude Code (claude-agent-acp) loads exactly the Claude project config above
    # (.claude settings hooks/plugins/MCP, .mcp.json) plus the managed (enterprise) files.
    "claude": (
        ConfigPath(
            PurePosixPath("etc/claude-code/managed-settings.json"),
            Expect.FILE,
            SYSTEM_HOOKS,
            "Managed Claude settings declare code the agent would run.",
            CLAUDE_EXEC_KEYS,
        ),
        _cfg(
            "etc/claude-code/managed-mcp.json",
            Expect.FILE,
            CLAUDE_MCP,
            "Managed Claude MCP config starts server processes in every session.",
        ),
    ),
    # Managed files that declare MCP servers, hooks or notify commands for every session.
    # Project config: Gemini CLI ignores .gemini/ hooks, agents and MCP servers in an
    # untrusted folder (every sandbox HOME is new, so nothing is trusted). Codex does
    # NOT: codex-acp 2.6.0 started an MCP server from an untrusted .codex/config.toml,
    # which PROJECT_CONFIG refuses (rule codex.config) and the sandbox masks.
    "codex": (
        _cfg(
            "etc/codex/managed_config.toml",
            Expect.FILE,
            SYSTEM_HOOKS,
            "Managed Codex config can declare MCP servers and notify commands.",
        ),
    ),
    "gemini": (
        _cfg(
            "etc/gemini-cli/settings.json",
            Expect.FILE,
            SYSTEM_HOOKS,
            "System Gemini CLI settings can declare hooks, MCP servers and tool commands.",
        ),
    ),
}

PROVIDERS: tuple[str, ...] = tuple(sorted(SYSTEM_CONFIG))
