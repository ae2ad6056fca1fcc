"""Sessions: live state plus the on-disk store under ~/.cursor/acp-sessions/<id>/.

Only sessions that took a turn are stored, listed or loadable (FACTS §3 [obs O1]).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
CHUNK_KINDS = ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk")


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Session:
    session_id: str
    cwd: str
    mode: str = "agent"
    title: str | None = None
    created_at: str = field(default_factory=iso_now)
    updated_at: str = field(default_factory=iso_now)
    # One list of raw session updates per finished or running turn.
    turns: list[list[JSON]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The running turn (a player.Turn) and its thread; guarded by `lock`.
    active: Any = None
    active_thread: threading.Thread | None = None
    # available_commands_update goes out once per session (see Agent.push_commands).
    commands_pushed: bool = False

    def record(self, update: JSON) -> None:
        if self.turns:
            self.turns[-1].append(copy.deepcopy(update))

    def meta(self) -> JSON:
        return {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "title": self.title,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }


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
                    entry.update(copy.deepcopy(fields))
            elif kind not in ("session_info_update", "available_commands_update"):
                out.append(copy.deepcopy(update))
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
    out.append(copy.deepcopy(update))


def _replay_tool(
    out: list[JSON], update: JSON, turn_no: int, ids: dict[str, str], entries: dict[str, JSON]
) -> None:
    original = str(update.get("toolCallId"))
    synthetic = f"replay-{turn_no}-{len(ids)}"
    ids[original] = synthetic
    entry = copy.deepcopy(update)
    entry["toolCallId"] = synthetic
    entries[original] = entry
    out.append(entry)


class SessionStore:
    """In-memory sessions backed by `$HOME/.cursor/acp-sessions` when HOME is writable."""

    def __init__(self, home: str | None) -> None:
        self._root = Path(home, ".cursor", "acp-sessions") if home else None
        self._live: dict[str, Session] = {}
        self._lock = threading.Lock()

    def add(self, session: Session) -> None:
        with self._lock:
            self._live[session.session_id] = session

    def get_live(self, session_id: Any) -> Session | None:
        with self._lock:
            return self._live.get(session_id) if isinstance(session_id, str) else None

    def find(self, session_id: Any) -> Session | None:
        """A session that took at least one turn, live or on disk."""
        live = self.get_live(session_id)
        if live is not None:
            return live if live.turns else None
        disk = self._read_disk(session_id)
        if disk is not None:
            self.add(disk)
        return disk

    def persist(self, session: Session) -> None:
        if self._root is None:
            return
        folder = self._root / session.session_id
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_json(folder / "meta.json", session.meta())
            _write_json(folder / "history.json", session.turns)
        except OSError:
            pass  # A read-only HOME only costs us persistence, never the turn.

    def list_sessions(self) -> list[JSON]:
        """Every prompted session, live or stored, newest first."""
        found: dict[str, JSON] = {}
        for meta in self._disk_metas():
            found[meta["sessionId"]] = meta
        with self._lock:
            for s in self._live.values():
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

    def _disk_metas(self) -> list[JSON]:
        if self._root is None or not self._root.is_dir():
            return []
        metas = []
        for folder in sorted(self._root.iterdir()):
            meta = _read_json(folder / "meta.json")
            if isinstance(meta, dict) and isinstance(meta.get("sessionId"), str):
                metas.append(meta)
        return metas

    def _read_disk(self, session_id: Any) -> Session | None:
        if self._root is None or not isinstance(session_id, str) or "/" in session_id:
            return None
        folder = self._root / session_id
        meta = _read_json(folder / "meta.json")
        turns = _read_json(folder / "history.json")
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


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
