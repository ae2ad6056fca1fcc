"""Plays parsed scenario steps as Cursor would stream them (FACTS §6-§10).

The verbs that ask the client or act on the workspace are in actions.py, imported only
when a scenario uses one, so a start compiles only this core.
"""

from __future__ import annotations

import json
import os
import re
import sys

from . import ambient, ids
from .turn import TurnCancelled, TurnStopped

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from .models import ModelPicker
    from .rpc import Pending, Transport
    from .scenario import Step
    from .sessions import Session
    from .turn import Turn

    JSON = dict[str, Any]

    class Host(Protocol):
        """What the player needs from the agent."""

        transport: Transport
        picker: ModelPicker
        subagents: bool
        chunk_delay: float
        home: str | None

        def emit(self, session: Session, update: JSON) -> None: ...

        def set_ignore_sigterm(self) -> None: ...


TOKEN_RE = re.compile(r"\s*\S+|\s+")
VAR_RE = re.compile(r"\{\{([A-Za-z_]+)\}\}")
#: The verbs actions.py plays (its HANDLERS); the others are Player's own `do_*` methods.
ACTION_VERBS = frozenset(
    (
        "write",
        "exec",
        "exec-gated",
        "permission",
        "ask-question",
        "create-plan",
        "update-todos",
        "generate-image",
        "task",
        "call",
    )
)


def tool_call_id(index: int) -> str:
    # Cursor's ids embed a literal newline between the call id and the function-call id.
    return f"call-{ids.uuid4()}-{index}\nfc_{ids.token_hex(24)}_{index}"


def tokens(text: str) -> list[str]:
    """Token-ish pieces: a word with its leading whitespace, like a model's stream."""
    return TOKEN_RE.findall(text) or ([text] if text else [])


def substitute(value: Any, variables: dict[str, str]) -> Any:
    """Replace {{name}} in every string of `value`; unknown names stay as written."""
    if isinstance(value, str):
        return VAR_RE.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, variables) for k, v in value.items()}
    return value


class Player:
    def __init__(self, host: Host, session: Session, turn: Turn) -> None:
        self.host = host
        self.session = session
        self.turn = turn
        self.tools = 0

    def play(self, steps: list[Step]) -> str:
        """Run every step; returns the stopReason."""
        handlers = [handler(step.verb) for step in steps]  # actions.py, if needed, first
        try:
            for step, run in zip(steps, handlers):
                self.turn.check()
                run(self, substitute(step.arg, self.turn.vars))
            self.turn.check()
        except TurnCancelled:
            return "cancelled"
        except TurnStopped as stop:
            return "cancelled" if self.turn.cancelled else stop.reason
        return "end_turn"

    # --- plumbing -------------------------------------------------------------------------

    def emit(self, update: JSON) -> None:
        self.turn.check()
        self.host.emit(self.session, update)

    def request(self, method: str, params: JSON) -> Pending:
        self.turn.check()
        return self.host.transport.request(method, params, self.turn.cond)

    def new_tool_id(self) -> str:
        self.tools += 1
        return tool_call_id(self.tools - 1)

    def tool_start(self, tcid: str, title: str, kind: str, **extra: Any) -> None:
        update = {
            "sessionUpdate": "tool_call",
            "toolCallId": tcid,
            "title": title,
            "kind": kind,
            "status": "pending",
        }
        update.update({k: v for k, v in extra.items() if v is not None})
        self.emit(update)

    def tool_update(self, tcid: str, status: str | None = None, **extra: Any) -> None:
        update: JSON = {"sessionUpdate": "tool_call_update", "toolCallId": tcid}
        if status is not None:
            update["status"] = status
        update.update({k: v for k, v in extra.items() if v is not None})
        self.emit(update)

    def stream(self, kind: str, text: str) -> None:
        for piece in tokens(text):
            self.emit({"sessionUpdate": kind, "content": {"type": "text", "text": piece}})
            if self.host.chunk_delay:
                self.turn.sleep(self.host.chunk_delay)

    # --- text -----------------------------------------------------------------------------

    def do_say(self, text: str) -> None:
        self.stream("agent_message_chunk", text)

    def do_think(self, text: str) -> None:
        self.stream("agent_thought_chunk", text)

    def do_error_text(self, message: str) -> None:
        # Backend errors lose their type and arrive as one final assistant chunk (FACTS §12).
        self.emit(
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"\n\nError: {message}"},
            }
        )

    def do_title(self, title: str) -> None:
        self.session.title = title
        self.emit({"sessionUpdate": "session_info_update", "title": title})

    # --- tools ----------------------------------------------------------------------------

    def do_tool(self, spec: JSON) -> None:
        tcid = str(spec.get("toolCallId") or self.new_tool_id())
        self.tool_start(
            tcid,
            str(spec.get("title", "Tool")),
            str(spec.get("kind", "other")),
            rawInput=spec.get("rawInput"),
            locations=spec.get("locations"),
        )
        self.tool_update(tcid, "in_progress")
        if spec.get("delay"):
            self.turn.sleep(float(spec["delay"]))
        self.tool_update(
            tcid,
            str(spec.get("status", "completed")),
            rawOutput=spec.get("rawOutput"),
            content=spec.get("content"),
        )

    # --- raw wire and process control ------------------------------------------------------

    def do_plan(self, arg: Any) -> None:
        entries = arg.get("entries", []) if isinstance(arg, dict) else arg
        self.emit({"sessionUpdate": "plan", "entries": entries})

    def do_update(self, update: JSON) -> None:
        self.emit(update)

    def do_raw(self, message: Any) -> None:
        self.turn.check()
        self.host.transport.write_line(json.dumps(message, ensure_ascii=False).encode("utf-8"))

    def do_garbage(self, text: str) -> None:
        self.turn.check()
        self.host.transport.write_line(text.encode("utf-8"))

    def do_bigline(self, size: int) -> None:
        """One valid session/update line of exactly `size` bytes (when size allows)."""
        self.turn.check()
        envelope = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": self.session.session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": ""},
                },
            },
        }
        base = len(json.dumps(envelope, separators=(",", ":")).encode("utf-8"))
        envelope["params"]["update"]["content"]["text"] = "x" * max(0, size - base)
        self.host.transport.write_line(json.dumps(envelope, separators=(",", ":")).encode())

    def do_stderr(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def do_sleep(self, seconds: float) -> None:
        self.turn.sleep(seconds)

    def do_hang(self, _arg: None) -> None:
        self.turn.hang()

    def do_stop(self, reason: str) -> None:
        raise TurnStopped(reason)

    def do_crash(self, code: int | None) -> None:
        sys.stderr.flush()
        os._exit(1 if code is None else code)

    def do_load_config(self, _arg: None) -> None:
        ambient.run_ambient_config(self.session.cwd)

    def do_ignore_sigterm(self, _arg: None) -> None:
        self.host.set_ignore_sigterm()


def handler(verb: str) -> Callable[[Player, Any], None]:
    """What plays `verb` (a parsed one): importing actions.py the first time it is asked."""
    if verb in ACTION_VERBS:
        from . import actions

        return actions.HANDLERS[verb]
    return HANDLERS[verb]


HANDLERS: dict[str, Callable[[Player, Any], None]] = {
    verb: getattr(Player, "do_" + verb.replace("-", "_"))
    for verb in (
        "say",
        "think",
        "error-text",
        "title",
        "tool",
        "plan",
        "update",
        "raw",
        "garbage",
        "bigline",
        "stderr",
        "sleep",
        "hang",
        "stop",
        "crash",
        "load-config",
        "ignore-sigterm",
    )
}
