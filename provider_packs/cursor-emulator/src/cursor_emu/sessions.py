"""Sessions: live state plus the on-disk store under ~/.cursor/acp-sessions/<id>/.

Only sessions that took a turn are stored, listed or loadable (FACTS §3 [obs O1]); what
reads them back (session/load, session/list) is in history.py.
"""

from __future__ import annotations

import json
import os
import threading
import time

from .rpc import copy_json

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from typing import Any

    JSON = dict[str, Any]


def iso_now() -> str:
    """UTC now to the millisecond (truncated), `2026-01-02T03:04:05.678Z`: what
    `datetime.now(UTC).isoformat(timespec="milliseconds")` says, without importing
    `datetime` at every start."""
    seconds, ns = divmod(time.time_ns(), 1_000_000_000)
    t = time.gmtime(seconds)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{ns // 1_000_000:03d}Z"
    )


class Session:
    """One session's live state (a plain class: `dataclasses` costs every start more
    than the rest of this module)."""

    __slots__ = (
        "session_id",
        "cwd",
        "mode",
        "title",
        "created_at",
        "updated_at",
        "turns",
        "lock",
        "active",
        "active_thread",
        "commands_pushed",
    )

    def __init__(
        self,
        session_id: str,
        cwd: str,
        mode: str = "agent",
        title: str | None = None,
        created_at: str | None = None,
        updated_at: str | None = None,
        turns: list[list[JSON]] | None = None,
    ) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.mode = mode
        self.title = title
        self.created_at = iso_now() if created_at is None else created_at
        self.updated_at = iso_now() if updated_at is None else updated_at
        # One list of raw session updates per finished or running turn.
        self.turns: list[list[JSON]] = [] if turns is None else turns
        self.lock = threading.Lock()
        # The running turn (a turn.Turn) and its thread; guarded by `lock`.
        self.active: Any = None
        self.active_thread: threading.Thread | None = None
        # available_commands_update goes out once per session (see Agent.push_commands).
        self.commands_pushed = False

    def record(self, update: JSON) -> None:
        if self.turns:
            self.turns[-1].append(copy_json(update))

    def meta(self) -> JSON:
        return {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "title": self.title,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }


class SessionStore:
    """In-memory sessions backed by `$HOME/.cursor/acp-sessions` when HOME is writable;
    history.py reads them back (session/load, session/list).

    Paths are os.path strings: pathlib's import would cost every start more than the
    store's work in a whole session."""

    def __init__(self, home: str | None) -> None:
        self.root = os.path.join(home, ".cursor", "acp-sessions") if home else None
        self.live: dict[str, Session] = {}
        self.lock = threading.Lock()

    def add(self, session: Session) -> None:
        with self.lock:
            self.live[session.session_id] = session

    def get_live(self, session_id: Any) -> Session | None:
        with self.lock:
            return self.live.get(session_id) if isinstance(session_id, str) else None

    def persist(self, session: Session) -> None:
        if self.root is None:
            return
        folder = os.path.join(self.root, session.session_id)
        try:
            os.makedirs(folder, exist_ok=True)
            _write_json(folder, "meta.json", session.meta())
            _write_json(folder, "history.json", session.turns)
        except OSError:
            pass  # A read-only HOME only costs us persistence, never the turn.


def _write_json(folder: str, name: str, data: Any) -> None:
    text = json.dumps(data, ensure_ascii=False)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{time.monotonic_ns()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(folder, name))
