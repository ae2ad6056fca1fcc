"""authenticate, the mode and model methods and cursor/list_available_models.

Imported on the first of these calls (a hello job makes none), so a start compiles only
what initialize, session/new and session/prompt need (FACTS §4, §5).
"""

from __future__ import annotations

from . import catalog
from .models import ModelError
from .rpc import RpcError, invalid_params

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .agent import Agent
    from .sessions import Session

    JSON = dict[str, Any]


def authenticate(agent: Agent, _rid: Any, params: JSON) -> JSON:
    if params.get("methodId") != "cursor_login":
        raise invalid_params(f"Unknown auth method: {params.get('methodId')}")
    agent.require_auth()
    return {}


def set_mode(agent: Agent, _rid: Any, params: JSON) -> JSON:
    session = agent.live_session(params)
    apply_mode(agent, session, params.get("modeId"))
    return {}


def apply_mode(agent: Agent, session: Session, requested: Any) -> None:
    mode = catalog.MODE_ALIASES.get(requested, requested) if isinstance(requested, str) else None
    if mode not in catalog.MODE_IDS:
        valid = ", ".join(catalog.MODE_IDS)
        raise RpcError(
            -32603,
            "Internal error",
            {"details": f"Invalid mode ID: {requested}. Valid modes: {valid}"},
        )
    session.mode = mode
    # The update goes out before the result, in the same millisecond (FACTS §4).
    agent.transport.notify(
        "session/update",
        {
            "sessionId": session.session_id,
            "update": {"sessionUpdate": "current_mode_update", "currentModeId": mode},
        },
    )


def set_config_option(agent: Agent, _rid: Any, params: JSON) -> JSON:
    session = agent.live_session(params)
    config_id, value = params.get("configId"), params.get("value")
    try:
        if config_id == "mode":
            apply_mode(agent, session, value)
        elif config_id == "model":
            agent.picker.select(value)
        elif not agent.picker.set_param(str(config_id), value):
            raise invalid_params(f"Unknown config option: {config_id}")
    except ModelError as exc:
        raise invalid_params(str(exc)) from None
    return {"configOptions": agent.config_options(session)}


def set_model(agent: Agent, _rid: Any, params: JSON) -> JSON:
    agent.live_session(params)
    try:
        agent.picker.select(params.get("modelId"))
    except ModelError as exc:
        raise invalid_params(str(exc)) from None
    return {}


def list_models(agent: Agent, _rid: Any, _params: JSON) -> JSON:
    agent.require_auth()
    return agent.picker.list_available_models()


METHODS: dict[str, Callable[[Agent, Any, JSON], Any]] = {
    "authenticate": authenticate,
    "session/set_mode": set_mode,
    "session/set_config_option": set_config_option,
    "session/set_model": set_model,
    "cursor/list_available_models": list_models,
}
