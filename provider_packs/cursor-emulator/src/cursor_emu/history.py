"""session/load and session/list: stored sessions read back, history replayed.

Imported on the first of these calls (a hello job makes none), so a start compiles only
the store's writing half (sessions.py). Only sessions that took a turn are listed or
loadable (FACTS §3 [obs O1]).
"""

from __future__ import annotations

import json
import os

from .rpc import copy_json, session_not_found, zod_error
from .sessions import Session, iso_now

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .agent import Agent
    from .sessions import SessionStore

    JSON = dict[str, Any]

CHUNK_KINDS = ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk")


def session_load(agent: Agent, _rid: Any, params: JSON) -> JSON:
    agent.require_auth()
    session = find(agent.store, params.get("sessionId"))
    if session is None:
        raise session_not_found(params.get("sessionId"))
    cwd = params.get("cwd")
    if isinstance(cwd, str) and cwd:
        session.cwd = cwd  # A different cwd silently rebinds the session (FACTS §3).
    for update in replay_updates(session.turns):
        agent.transport.notify(
            "session/update", {"sessionId": session.session_id, "update": update}
        )
    return agent.session_state(session)


def session_list(agent: Agent, _rid: Any, params: JSON) -> JSON:
    agent.require_auth()
    if "cursor" in params:
        raise zod_error("cursor", "Unrecognized key: cursor")
    cwd = params.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise zod_error("cwd", "Expected an absolute path")
    return {"sessions": list_sessions(agent.store)}


METHODS: dict[str, Callable[[Agent, Any, JSON], Any]] = {
    "session/load": session_load,
    "session/list": session_list,
}


# --- the store, read back ------------------------------------------------------------


def find(store: SessionStore, session_id: Any) -> Session | None:
    """A session that took at least one turn, live or on disk."""
    live = store.get_live(session_id)
    if live is not None:
        return live if live.turns else None
    disk = _read_disk(store, session_id)
    if disk is not None:
        store.add(disk)
    return disk


def list_sessions(store: SessionStore) -> list[JSON]:
    """Every prompted session, live or stored, newest first."""
    found: dict[str, JSON] = {}
    for meta in _disk_metas(store):
        found[meta["sessionId"]] = meta
    with store.lock:
        for s in store.live.values():
            if s.turns:
                found[s.session_id] = s.meta()
    rows = [
        {
            "sessionId": m["sessionId"],
            "cwd": m["cwd"],
            "title": m.get("title") or "",
            "updatedAt": m["updatedAt"],
        }
        for m in found.values()
    ]
    rows.sort(key=lambda r: r["updatedAt"], reverse=True)
    return rows


def _disk_metas(store: SessionStore) -> list[JSON]:
    if store.root is None or not os.path.isdir(store.root):
        return []
    metas = []
    for name in sorted(os.listdir(store.root)):
        meta = _read_json(os.path.join(store.root, name, "meta.json"))
        if isinstance(meta, dict) and isinstance(meta.get("sessionId"), str):
            metas.append(meta)
    return metas


def _read_disk(store: SessionStore, session_id: Any) -> Session | None:
    if store.root is None or not isinstance(session_id, str) or "/" in session_id:
        return None
    folder = os.path.join(store.root, session_id)
    meta = _read_json(os.path.join(folder, "meta.json"))
    turns = _read_json(os.path.join(folder, "history.json"))
    if not isinstance(meta, dict) or not isinstance(turns, list) or not turns:
        return None
    return Session(
        session_id=session_id,
        cwd=str(meta.get("cwd", "")),
        title=meta.get("title"),
        created_at=str(meta.get("createdAt", iso_now())),
        updated_at=str(meta.get("updatedAt", iso_now())),
        turns=turns,
    )


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError):
        return None


# --- replay -------------------------------------------------------------------------


def replay_updates(turns: list[list[JSON]]) -> list[JSON]:
    """History as load replays it: coalesced chunks, one entry per tool, synthetic ids."""
    out: list[JSON] = []
    for turn_no, turn in enumerate(turns):
        tool_ids: dict[str, str] = {}
        tool_entries: dict[str, JSON] = {}
        for update in turn:
            kind = update.get("sessionUpdate")
            if kind in CHUNK_KINDS:
                _append_chunk(out, update)
            elif kind == "tool_call":
                _replay_tool(out, update, turn_no, tool_ids, tool_entries)
            elif kind == "tool_call_update":
                entry = tool_entries.get(str(update.get("toolCallId")))
                if entry is not None:
                    fields = {
                        k: v for k, v in update.items() if k not in ("sessionUpdate", "toolCallId")
                    }
                    entry.update(copy_json(fields))
            elif kind not in ("session_info_update", "available_commands_update"):
                out.append(copy_json(update))
    return out


def _append_chunk(out: list[JSON], update: JSON) -> None:
    prev = out[-1] if out else None
    text = (update.get("content") or {}).get("text")
    if (
        prev is not None
        and prev.get("sessionUpdate") == update.get("sessionUpdate")
        and isinstance(text, str)
        and isinstance((prev.get("content") or {}).get("text"), str)
    ):
        prev["content"]["text"] += text
        return
    out.append(copy_json(update))


def _replay_tool(
    out: list[JSON], update: JSON, turn_no: int, ids: dict[str, str], entries: dict[str, JSON]
) -> None:
    original = str(update.get("toolCallId"))
    synthetic = f"replay-{turn_no}-{len(ids)}"
    ids[original] = synthetic
    entry = copy_json(update)
    entry["toolCallId"] = synthetic
    entries[original] = entry
    out.append(entry)
