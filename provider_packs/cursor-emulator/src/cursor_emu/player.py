"""Plays parsed scenario steps as Cursor would stream them (FACTS §6-§10)."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from . import ambient, catalog
from .models import ModelPicker
from .rpc import Pending, Transport
from .scenario import Step
from .sessions import Session
from .turn import Turn, TurnCancelled, TurnStopped

JSON = dict[str, Any]
TOKEN_RE = re.compile(r"\s*\S+|\s+")
VAR_RE = re.compile(r"\{\{([A-Za-z_]+)\}\}")
PLAN_LINK = "file:///~/.cursor/plans/{slug}-{tag}.plan.md"


class Host(Protocol):
    """What the player needs from the agent."""

    transport: Transport
    picker: ModelPicker
    subagents: bool
    chunk_delay: float
    home: str | None

    def emit(self, session: Session, update: JSON) -> None: ...

    def set_ignore_sigterm(self) -> None: ...


def tool_call_id(index: int) -> str:
    # Cursor's ids embed a literal newline between the call id and the function-call id.
    return f"call-{uuid.uuid4()}-{index}\nfc_{secrets.token_hex(24)}_{index}"


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
        try:
            for step in steps:
                self.turn.check()
                HANDLERS[step.verb](self, substitute(step.arg, self.turn.vars))
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

    def resolve_path(self, path: str) -> Path:
        return Path(self.session.cwd, path)

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

    def do_write(self, arg: tuple[str, str]) -> None:
        path, text = arg
        target = self.resolve_path(path)
        tcid = self.new_tool_id()
        self.tool_start(tcid, "Edit File", "edit", rawInput={}, locations=[{"path": str(target)}])
        self.tool_update(tcid, "in_progress")
        try:
            old = target.read_text(encoding="utf-8") if target.is_file() else ""
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.tool_update(tcid, "completed", rawOutput={"error": str(exc)})
            return
        diff = {"type": "diff", "path": str(target), "oldText": old, "newText": text}
        self.tool_update(tcid, "completed", content=[diff])

    def do_exec(self, command: str) -> None:
        tcid = self.new_tool_id()
        self.tool_start(tcid, f"`{command}`", "execute", rawInput={"command": command})
        self.run_exec(tcid, command)

    def do_exec_gated(self, command: str) -> None:
        tcid = self.new_tool_id()
        self.tool_start(tcid, f"`{command}`", "execute", rawInput={"command": command})
        first_word = command.split(maxsplit=1)[0] if command.split() else command
        chosen = self.ask_permission(
            tcid, f"`{command}`", "execute", f"Not in allowlist: {first_word}"
        )
        if chosen in ("allow-once", "allow-always"):
            self.run_exec(tcid, command)
        else:
            # A rejection is a bare `completed` with no rawOutput (FACTS §7).
            self.tool_update(tcid, "completed")

    def run_exec(self, tcid: str, command: str) -> None:
        self.tool_update(tcid, "in_progress")
        try:
            code, out, err = self.turn.run_shell(command, self.session.cwd)
        except OSError as exc:
            self.tool_update(tcid, "completed", rawOutput={"error": str(exc)})
            return
        self.turn.vars["exitCode"] = str(code)
        raw = {
            "exitCode": code,
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
        }
        self.tool_update(tcid, "completed", rawOutput=raw)

    # --- permission -----------------------------------------------------------------------

    def do_permission(self, spec: JSON) -> None:
        tcid = str(spec.get("toolCallId") or self.new_tool_id())
        title = str(spec.get("title", "`echo hello`"))
        kind = str(spec.get("kind", "execute"))
        reason = str(spec.get("reason", "Not in allowlist: echo"))
        session_id = spec.get("sessionId")
        self.ask_permission(
            tcid,
            title,
            kind,
            reason,
            spec.get("options"),
            session_id=session_id if isinstance(session_id, str) else None,
        )

    def ask_permission(
        self,
        tcid: str,
        title: str,
        kind: str,
        reason: str,
        options: Any = None,
        session_id: str | None = None,
    ) -> str:
        """Send session/request_permission and wait; returns the optionId or "cancelled"."""
        tool = {
            "toolCallId": tcid,
            "title": title,
            "kind": kind,
            "status": "pending",
            "content": [{"type": "content", "content": {"type": "text", "text": reason}}],
        }
        params = {
            "sessionId": session_id or self.session.session_id,
            "toolCall": tool,
            "options": options if isinstance(options, list) else catalog.PERMISSION_OPTIONS,
        }
        reply = self.turn.wait_reply(self.request("session/request_permission", params))
        chosen = _selected_option(reply)
        self.turn.vars["permission"] = chosen
        if chosen == "allow-always":
            self.remember_rule(title)
        return chosen

    def remember_rule(self, title: str) -> None:
        # allow-always writes a global rule, which is why the worker must never pick it.
        if not self.host.home:
            return
        path = Path(self.host.home, ".cursor", "cli-config.json")
        try:
            config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            allow = config.setdefault("permissions", {}).setdefault("allow", [])
            allow.append(f"Shell({title.strip('`').split(' ')[0]})")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(config), encoding="utf-8")
        except (OSError, ValueError, AttributeError):
            pass

    # --- cursor/* extension requests (no sessionId, ids from the shared counter) -----------

    def do_ask_question(self, spec: JSON) -> None:
        tcid = self.new_tool_id()
        questions = spec.get("questions") or [
            {
                "id": "q1",
                "prompt": "Which approach should I take?",
                "options": [{"id": "a", "label": "Option A"}, {"id": "b", "label": "Option B"}],
                "allowMultiple": False,
            }
        ]
        params = {
            "toolCallId": tcid,
            "title": spec.get("title", "Question"),
            "questions": questions,
        }
        self.tool_start(tcid, str(params["title"]), "think", rawInput={"questions": questions})
        reply = self.turn.wait_reply(self.request("cursor/ask_question", params))
        if reply.error is not None and reply.error.get("code") == -32601:
            outcome = self.questions_via_permission(tcid, questions)
        else:
            outcome = _outcome(reply.result) or {"outcome": "cancelled"}
        self.turn.vars["question"] = json.dumps(outcome, separators=(",", ":"))
        self.turn.vars["answer"] = _answer_summary(outcome)
        self.tool_update(tcid, "completed", rawOutput=outcome)

    def questions_via_permission(self, tcid: str, questions: list[Any]) -> JSON:
        """Fallback when ask_question is unsupported: one permission per single-select."""
        answers = []
        for q in questions:
            if not isinstance(q, dict) or q.get("allowMultiple"):
                continue  # Multi-select questions are dropped (FACTS §9).
            options = [
                {"optionId": o.get("id"), "name": o.get("label"), "kind": "allow_once"}
                for o in q.get("options", [])
                if isinstance(o, dict)
            ]
            options.append({"optionId": "skip", "name": "Skip", "kind": "reject_once"})
            chosen = self.ask_permission(
                tcid, str(q.get("prompt", "Question")), "think", str(q.get("prompt", "")), options
            )
            if chosen not in ("skip", "cancelled"):
                answers.append({"questionId": q.get("id"), "selectedOptionIds": [chosen]})
        return {"outcome": "answered", "answers": answers}

    def do_create_plan(self, spec: JSON) -> None:
        tcid = self.new_tool_id()
        params = _plan_params(tcid, spec)
        self.tool_start(tcid, f"Create Plan: {params['name']}", "other", rawInput={})
        reply = self.turn.wait_reply(self.request("cursor/create_plan", params))
        # An error or an empty result is auto-accepted, as the real agent does (FACTS §9).
        outcome = _outcome(reply.result) if reply.error is None else None
        verdict = str((outcome or {"outcome": "accepted"}).get("outcome"))
        self.turn.vars["plan"] = verdict
        if verdict != "accepted":
            self.tool_update(tcid, "completed")
            return
        entries = [
            {
                "content": t.get("content", ""),
                "priority": "medium",
                "status": t.get("status", "pending"),
            }
            for t in params["todos"]
            if isinstance(t, dict)
        ]
        self.emit({"sessionUpdate": "plan", "entries": entries})
        uri = (outcome or {}).get("planUri") or self.save_plan(params)
        self.tool_update(
            tcid,
            content=[
                {"type": "content", "content": {"type": "text", "text": f"Plan saved to {uri}"}}
            ],
        )
        self.tool_update(tcid, "completed")

    def save_plan(self, params: JSON) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", str(params["name"]).lower()).strip("-") or "plan"
        tag = secrets.token_hex(4)
        if self.host.home:
            try:
                folder = Path(self.host.home, ".cursor", "plans")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{slug}-{tag}.plan.md").write_text(str(params["plan"]), encoding="utf-8")
            except OSError:
                pass
        return PLAN_LINK.format(slug=slug, tag=tag)

    def do_update_todos(self, spec: JSON) -> None:
        tcid = self.new_tool_id()
        todos = spec.get("todos") or [
            {"id": "inspect", "content": "Inspect the code", "status": "completed"},
            {"id": "change", "content": "Make the change", "status": "in_progress"},
        ]
        merge = bool(spec.get("merge", False))
        self.tool_start(tcid, "Update TODOs", "other", rawInput={"todos": todos, "merge": merge})
        # Fire and forget: Cursor never waits for these replies (FACTS §9).
        self.request("cursor/update_todos", {"toolCallId": tcid, "todos": todos, "merge": merge})
        self.tool_update(tcid, "completed")

    def do_generate_image(self, spec: JSON) -> None:
        tcid = self.new_tool_id()
        params = {
            "toolCallId": tcid,
            "description": spec.get("description", "A small red square"),
            "filePath": spec.get("filePath", str(self.resolve_path("generated.png"))),
            "referenceImagePaths": spec.get("referenceImagePaths", []),
        }
        self.tool_start(
            tcid,
            "Generate Image",
            "other",
            rawInput={k: v for k, v in params.items() if k != "toolCallId"},
        )
        self.request("cursor/generate_image", params)
        self.tool_update(tcid, "completed")

    def do_task(self, spec: JSON) -> None:
        tcid = self.new_tool_id()
        agent_id = str(spec.get("agentId") or uuid.uuid4())
        description = str(spec.get("description", "Explore the codebase"))
        prompt = str(spec.get("prompt", "List the files in the workspace."))
        subtype = spec.get("subagentType", {"custom": {"unspecified": {}}})
        raw_input = {
            "_toolName": "task",
            "prompt": prompt,
            "description": description,
            "subagentType": spec.get("toolSubagentType", {"unspecified": {}}),
        }
        self.tool_start(tcid, f"Task: {description}", "other", rawInput=raw_input)
        self.tool_update(tcid, "in_progress")
        if self.host.subagents:
            self.run_subagent(tcid, agent_id, prompt, spec)
        elif spec.get("childPermissions"):
            self.child_permissions(agent_id, spec)
        duration = int(spec.get("durationMs", 1234))
        background = bool(spec.get("isBackground", False))
        self.tool_update(
            tcid, "completed", rawOutput={"durationMs": duration, "isBackground": background}
        )
        params = {
            "toolCallId": tcid,
            "description": description,
            "prompt": prompt,
            "subagentType": subtype,
            "model": spec.get("model", self.host.picker.current),
            "agentId": agent_id,
            "durationMs": duration,
        }
        self.request("cursor/task", params)

    def run_subagent(self, tcid: str, agent_id: str, prompt: str, spec: JSON) -> None:
        """Spawn notice, the child's own stream on its sessionId, then a terminal state."""
        meta = {
            "cursor": {
                "toolCallId": tcid,
                "agentId": agent_id,
                "model": spec.get("model", self.host.picker.current),
            }
        }
        self.emit(
            {
                "sessionUpdate": "subagent_spawned",
                "subagentSessionId": agent_id,
                "name": spec.get("name", "generalPurpose"),
                "task": prompt,
                "capabilities": {},
                "_meta": meta,
            }
        )
        text = str(spec.get("childText", "Subagent finished."))
        child_updates = [
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": piece}}
            for piece in tokens(text)
        ]
        # The child's own stream (thoughts, plans, tools) goes out on its session id.
        extra = spec.get("childUpdates")
        child_updates += [u for u in extra if isinstance(u, dict)] if isinstance(extra, list) else []
        for update in child_updates:
            self.turn.check()
            self.host.transport.notify("session/update", {"sessionId": agent_id, "update": update})
        self.child_permissions(agent_id, spec)
        self.emit(
            {
                "sessionUpdate": "subagent_state_update",
                "subagentSessionId": agent_id,
                "state": spec.get("state", "completed"),
            }
        )

    def child_permissions(self, agent_id: str, spec: JSON) -> None:
        """The child's permission asks (FACTS Q8, reported): on its own session id, or with
        `onParent` on the parent's session id with the child's tool call id."""
        asks = spec.get("childPermissions")
        for ask in asks if isinstance(asks, list) else []:
            if not isinstance(ask, dict):
                continue
            self.turn.check()
            self.ask_permission(
                str(ask.get("toolCallId") or self.new_tool_id()),
                str(ask.get("title", "`ls`")),
                str(ask.get("kind", "execute")),
                str(ask.get("reason", "Not in allowlist: ls")),
                session_id=None if ask.get("onParent") else agent_id,
            )

    # --- raw wire and process control ------------------------------------------------------

    def do_plan(self, arg: Any) -> None:
        entries = arg.get("entries", []) if isinstance(arg, dict) else arg
        self.emit({"sessionUpdate": "plan", "entries": entries})

    def do_update(self, update: JSON) -> None:
        self.emit(update)

    def do_call(self, spec: JSON) -> None:
        """A client method (fs/*, terminal/*, …) the real agent never calls (FACTS §2);
        the reply goes to `{{reply}}` (JSON) and `{{reply_<key>}}` (top-level scalars)."""
        params = dict(spec.get("params") or {})
        params.setdefault("sessionId", self.session.session_id)
        reply = self.turn.wait_reply(self.request(str(spec.get("method")), params))
        value = reply.result if reply.error is None else {"error": reply.error}
        self.turn.vars["reply"] = json.dumps(value, separators=(",", ":"), sort_keys=True)
        for key, item in (value.items() if isinstance(value, dict) else []):
            if isinstance(item, (str, int, float, bool)):
                self.turn.vars[f"reply_{key}"] = str(item)

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


def _selected_option(reply: Pending) -> str:
    outcome = _outcome(reply.result)
    if outcome and outcome.get("outcome") == "selected":
        return str(outcome.get("optionId"))
    return "cancelled"  # Cancelled, malformed or an error all count as a rejection.


def _outcome(result: Any) -> JSON | None:
    if isinstance(result, dict) and isinstance(result.get("outcome"), dict):
        return result["outcome"]
    return None


def _answer_summary(outcome: JSON) -> str:
    if outcome.get("outcome") != "answered":
        return str(outcome.get("outcome"))
    answers = outcome.get("answers") or []
    first = answers[0] if answers and isinstance(answers[0], dict) else {}
    return ",".join(str(x) for x in first.get("selectedOptionIds", []))


def _plan_params(tcid: str, spec: JSON) -> JSON:
    todos = spec.get("todos") or [
        {"id": "find-usages", "content": "Find usages", "status": "pending"},
        {"id": "update-callers", "content": "Update callers", "status": "pending"},
    ]
    return {
        "toolCallId": tcid,
        "name": spec.get("name", "Refactor helper"),
        "overview": spec.get("overview", "Rename the helper and update its callers."),
        "plan": spec.get("plan", "# Plan\n\n1. Find usages\n2. Update callers\n"),
        "todos": todos,
        "isProject": bool(spec.get("isProject", False)),
        "phases": spec.get("phases", []),
    }


HANDLERS: dict[str, Callable[[Player, Any], None]] = {
    verb: getattr(Player, "do_" + verb.replace("-", "_"))
    for verb in (
        "say",
        "think",
        "error-text",
        "title",
        "tool",
        "write",
        "exec",
        "exec-gated",
        "permission",
        "ask-question",
        "create-plan",
        "update-todos",
        "generate-image",
        "task",
        "plan",
        "update",
        "call",
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
