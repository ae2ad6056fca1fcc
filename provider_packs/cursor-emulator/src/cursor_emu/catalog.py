"""Static data Cursor answers with: initialize result, modes, models, commands.

Shapes follow docs/CURSOR_ACP_FACTS.md §2, §4, §5 and §7 ([obs] wins over docs).
"""

from __future__ import annotations

from .rpc import copy_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]

AUTH_METHODS: list[JSON] = [
    {
        "id": "cursor_login",
        "name": "Cursor Login",
        "description": (
            "Authenticate using existing Cursor login credentials. "
            "Run 'agent login' first if not logged in."
        ),
    }
]

MODES: list[JSON] = [
    {"id": "agent", "name": "Agent", "description": "Full agent capabilities with tool access"},
    {
        "id": "plan",
        "name": "Plan",
        "description": "Read-only mode for planning and designing before implementation",
    },
    {"id": "ask", "name": "Ask", "description": "Q&A mode - no edits or command execution"},
]
MODE_IDS = [m["id"] for m in MODES]
# The bundle accepts the legacy ACP mode names as aliases (FACTS §4, [rep R1]).
MODE_ALIASES = {"code": "agent", "architect": "plan", "chat": "ask"}

# Variant-id space: what a client without _meta.parameterizedModelPicker sees (FACTS §5).
VARIANT_MODELS: list[JSON] = [
    {"modelId": "default[]", "name": "Auto"},
    {"modelId": "gpt-5.6-luna[context=272k,reasoning=medium,fast=false]", "name": "gpt-5.6-luna"},
    {"modelId": "grok-4.6[effort=high,fast=true]", "name": "grok-4.6"},
    {"modelId": "claude-opus-5[thinking=true,context=200k]", "name": "claude-opus-5"},
]
DEFAULT_VARIANT = "default[]"

# Parameterized space: base ids plus per-model parameter selects (FACTS §5, [rep R1; obs S0]).
# param id -> (display name, category, option values, default value)
Param = tuple[str, str, list[str], str]
BASE_MODELS: dict[str, tuple[str, dict[str, Param]]] = {
    "default": ("Auto", {}),
    "gpt-5.6-luna": (
        "GPT-5.6 Luna",
        {
            "context": ("Context", "model_config", ["272k", "1m"], "272k"),
            "reasoning": ("Reasoning", "thought_level", ["low", "medium", "high"], "medium"),
            "fast": ("Fast", "model_config", ["false", "true"], "false"),
        },
    ),
    "grok-4.6": (
        "Cursor Grok 4.6",
        {
            "effort": ("Effort", "thought_level", ["low", "medium", "high", "xhigh"], "high"),
            # Catalog defaults can silently turn on the pricier fast=true (FACTS §5).
            "fast": ("Fast", "model_config", ["false", "true"], "true"),
        },
    ),
    "claude-opus-5": (
        "Opus 5",
        {
            "thinking": ("Thinking", "thought_level", ["false", "true"], "true"),
            "context": ("Context", "model_config", ["200k", "1m"], "200k"),
        },
    ),
}
DEFAULT_BASE = "default"

AVAILABLE_COMMANDS: list[JSON] = [
    {"name": "copy-request-id", "description": "Copy the last request ID to the clipboard"},
    {"name": "create-rule", "description": "Create a new Cursor rule"},
    {"name": "summarize", "description": "Summarize the conversation so far"},
]

PERMISSION_OPTIONS: list[JSON] = [
    {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Allow always", "kind": "allow_always"},
    {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
]


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness: the real agent tests `_meta.subagents` in JS, where {} is true."""
    if isinstance(value, (dict, list)):
        return True
    return bool(value)


def initialize_result(client_capabilities: Any) -> JSON:
    """The initialize result; subagents appear only when the client opts in via _meta."""
    session_caps: JSON = {"list": {}}
    meta = client_capabilities.get("_meta") if isinstance(client_capabilities, dict) else None
    if isinstance(meta, dict) and js_truthy(meta.get("subagents")):
        session_caps["subagents"] = {}
    return {
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": True,
            "mcpCapabilities": {"http": True, "sse": True},
            "promptCapabilities": {"audio": False, "embeddedContext": False, "image": True},
            "sessionCapabilities": session_caps,
        },
        "authMethods": copy_json(AUTH_METHODS),
    }


def modes_state(current: str) -> JSON:
    return {"currentModeId": current, "availableModes": copy_json(MODES)}


def select_option(
    option_id: str, name: str, category: str, current: str, options: list[JSON]
) -> JSON:
    return {
        "id": option_id,
        "name": name,
        "category": category,
        "type": "select",
        "currentValue": current,
        "options": options,
    }
