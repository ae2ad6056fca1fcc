"""The verbs beyond streamed text and reported tools: the client requests (permission,
questions, plans, todos, images, tasks and subagents, `call`) and the workspace actions
(`write`, `exec`, `exec-gated`).

Imported by the player when a scenario first uses one of them, before it plays, so a
start (a hello job) compiles only the player's core (FACTS §6-§10 as in player.py).
"""

from __future__ import annotations

import json
import re

from . import catalog, ids
from .player import Player, tokens

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    from .rpc import Pending

    JSON = dict[str, Any]

PLAN_LINK = "file:///~/.cursor/plans/{slug}-{tag}.plan.md"


def resolve_path(player: Player, path: str) -> Path:
    from pathlib import Path  # Only the file verbs need it: not every start.

    return Path(player.session.cwd, path)


def do_write(player: Player, arg: tuple[str, str]) -> None:
    path, text = arg
    target = resolve_path(player, path)
    tcid = player.new_tool_id()
    player.tool_start(tcid, "Edit File", "edit", rawInput={}, locations=[{"path": str(target)}])
    player.tool_update(tcid, "in_progress")
    try:
        old = target.read_text(encoding="utf-8") if target.is_file() else ""
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        player.tool_update(tcid, "completed", rawOutput={"error": str(exc)})
        return
    diff = {"type": "diff", "path": str(target), "oldText": old, "newText": text}
    player.tool_update(tcid, "completed", content=[diff])


def do_exec(player: Player, command: str) -> None:
    tcid = player.new_tool_id()
    player.tool_start(tcid, f"`{command}`", "execute", rawInput={"command": command})
    run_exec(player, tcid, command)


def do_exec_gated(player: Player, command: str) -> None:
    tcid = player.new_tool_id()
    player.tool_start(tcid, f"`{command}`", "execute", rawInput={"command": command})
    first_word = command.split(maxsplit=1)[0] if command.split() else command
    chosen = ask_permission(
        player, tcid, f"`{command}`", "execute", f"Not in allowlist: {first_word}"
    )
    if chosen in ("allow-once", "allow-always"):
        run_exec(player, tcid, command)
    else:
        # A rejection is a bare `completed` with no rawOutput (FACTS §7).
        player.tool_update(tcid, "completed")


def run_exec(player: Player, tcid: str, command: str) -> None:
    player.tool_update(tcid, "in_progress")
    try:
        code, out, err = player.turn.run_shell(command, player.session.cwd)
    except OSError as exc:
        player.tool_update(tcid, "completed", rawOutput={"error": str(exc)})
        return
    player.turn.vars["exitCode"] = str(code)
    raw = {
        "exitCode": code,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
    }
    player.tool_update(tcid, "completed", rawOutput=raw)


# --- permission -----------------------------------------------------------------------


def do_permission(player: Player, spec: JSON) -> None:
    tcid = str(spec.get("toolCallId") or player.new_tool_id())
    title = str(spec.get("title", "`echo hello`"))
    kind = str(spec.get("kind", "execute"))
    reason = str(spec.get("reason", "Not in allowlist: echo"))
    session_id = spec.get("sessionId")
    ask_permission(
        player,
        tcid,
        title,
        kind,
        reason,
        spec.get("options"),
        session_id=session_id if isinstance(session_id, str) else None,
    )


def ask_permission(
    player: Player,
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
        "sessionId": session_id or player.session.session_id,
        "toolCall": tool,
        "options": options if isinstance(options, list) else catalog.PERMISSION_OPTIONS,
    }
    reply = player.turn.wait_reply(player.request("session/request_permission", params))
    chosen = _selected_option(reply)
    player.turn.vars["permission"] = chosen
    if chosen == "allow-always":
        remember_rule(player, title)
    return chosen


def remember_rule(player: Player, title: str) -> None:
    # allow-always writes a global rule, which is why the worker must never pick it.
    if not player.host.home:
        return
    from pathlib import Path  # Not every start: allow-always is rare.

    path = Path(player.host.home, ".cursor", "cli-config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        allow = config.setdefault("permissions", {}).setdefault("allow", [])
        allow.append(f"Shell({title.strip('`').split(' ')[0]})")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config), encoding="utf-8")
    except (OSError, ValueError, AttributeError):
        pass


# --- cursor/* extension requests (no sessionId, ids from the shared counter) -----------


def do_ask_question(player: Player, spec: JSON) -> None:
    tcid = player.new_tool_id()
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
    player.tool_start(tcid, str(params["title"]), "think", rawInput={"questions": questions})
    reply = player.turn.wait_reply(player.request("cursor/ask_question", params))
    if reply.error is not None and reply.error.get("code") == -32601:
        outcome = questions_via_permission(player, tcid, questions)
    else:
        outcome = _outcome(reply.result) or {"outcome": "cancelled"}
    player.turn.vars["question"] = json.dumps(outcome, separators=(",", ":"))
    player.turn.vars["answer"] = _answer_summary(outcome)
    player.tool_update(tcid, "completed", rawOutput=outcome)


def questions_via_permission(player: Player, tcid: str, questions: list[Any]) -> JSON:
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
        chosen = ask_permission(
            player,
            tcid,
            str(q.get("prompt", "Question")),
            "think",
            str(q.get("prompt", "")),
            options,
        )
        if chosen not in ("skip", "cancelled"):
            answers.append({"questionId": q.get("id"), "selectedOptionIds": [chosen]})
    return {"outcome": "answered", "answers": answers}


def do_create_plan(player: Player, spec: JSON) -> None:
    tcid = player.new_tool_id()
    params = _plan_params(tcid, spec)
    player.tool_start(tcid, f"Create Plan: {params['name']}", "other", rawInput={})
    reply = player.turn.wait_reply(player.request("cursor/create_plan", params))
    # An error or an empty result is auto-accepted, as the real agent does (FACTS §9).
    outcome = _outcome(reply.result) if reply.error is None else None
    verdict = str((outcome or {"outcome": "accepted"}).get("outcome"))
    player.turn.vars["plan"] = verdict
    if verdict != "accepted":
        player.tool_update(tcid, "completed")
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
    player.emit({"sessionUpdate": "plan", "entries": entries})
    uri = (outcome or {}).get("planUri") or save_plan(player, params)
    player.tool_update(
        tcid,
        content=[{"type": "content", "content": {"type": "text", "text": f"Plan saved to {uri}"}}],
    )
    player.tool_update(tcid, "completed")


def save_plan(player: Player, params: JSON) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", str(params["name"]).lower()).strip("-") or "plan"
    tag = ids.token_hex(4)
    if player.host.home:
        from pathlib import Path  # Not every start: plans are rare.

        try:
            folder = Path(player.host.home, ".cursor", "plans")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{slug}-{tag}.plan.md").write_text(str(params["plan"]), encoding="utf-8")
        except OSError:
            pass
    return PLAN_LINK.format(slug=slug, tag=tag)


def do_update_todos(player: Player, spec: JSON) -> None:
    tcid = player.new_tool_id()
    todos = spec.get("todos") or [
        {"id": "inspect", "content": "Inspect the code", "status": "completed"},
        {"id": "change", "content": "Make the change", "status": "in_progress"},
    ]
    merge = bool(spec.get("merge", False))
    player.tool_start(tcid, "Update TODOs", "other", rawInput={"todos": todos, "merge": merge})
    # Fire and forget: Cursor never waits for these replies (FACTS §9).
    player.request("cursor/update_todos", {"toolCallId": tcid, "todos": todos, "merge": merge})
    player.tool_update(tcid, "completed")


def do_generate_image(player: Player, spec: JSON) -> None:
    tcid = player.new_tool_id()
    params = {
        "toolCallId": tcid,
        "description": spec.get("description", "A small red square"),
        "filePath": spec.get("filePath", str(resolve_path(player, "generated.png"))),
        "referenceImagePaths": spec.get("referenceImagePaths", []),
    }
    player.tool_start(
        tcid,
        "Generate Image",
        "other",
        rawInput={k: v for k, v in params.items() if k != "toolCallId"},
    )
    player.request("cursor/generate_image", params)
    player.tool_update(tcid, "completed")


def do_task(player: Player, spec: JSON) -> None:
    tcid = player.new_tool_id()
    agent_id = str(spec.get("agentId") or ids.uuid4())
    description = str(spec.get("description", "Explore the codebase"))
    prompt = str(spec.get("prompt", "List the files in the workspace."))
    subtype = spec.get("subagentType", {"custom": {"unspecified": {}}})
    raw_input = {
        "_toolName": "task",
        "prompt": prompt,
        "description": description,
        "subagentType": spec.get("toolSubagentType", {"unspecified": {}}),
    }
    player.tool_start(tcid, f"Task: {description}", "other", rawInput=raw_input)
    player.tool_update(tcid, "in_progress")
    if player.host.subagents:
        run_subagent(player, tcid, agent_id, prompt, spec)
    elif spec.get("childPermissions"):
        child_permissions(player, agent_id, spec)
    duration = int(spec.get("durationMs", 1234))
    background = bool(spec.get("isBackground", False))
    player.tool_update(
        tcid, "completed", rawOutput={"durationMs": duration, "isBackground": background}
    )
    params = {
        "toolCallId": tcid,
        "description": description,
        "prompt": prompt,
        "subagentType": subtype,
        "model": spec.get("model", player.host.picker.current),
        "agentId": agent_id,
        "durationMs": duration,
    }
    player.request("cursor/task", params)


def run_subagent(player: Player, tcid: str, agent_id: str, prompt: str, spec: JSON) -> None:
    """Spawn notice, the child's own stream on its sessionId, then a terminal state."""
    meta = {
        "cursor": {
            "toolCallId": tcid,
            "agentId": agent_id,
            "model": spec.get("model", player.host.picker.current),
        }
    }
    player.emit(
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
        player.turn.check()
        player.host.transport.notify("session/update", {"sessionId": agent_id, "update": update})
    child_permissions(player, agent_id, spec)
    player.emit(
        {
            "sessionUpdate": "subagent_state_update",
            "subagentSessionId": agent_id,
            "state": spec.get("state", "completed"),
        }
    )


def child_permissions(player: Player, agent_id: str, spec: JSON) -> None:
    """The child's permission asks (FACTS Q8, reported): on its own session id, or with
    `onParent` on the parent's session id with the child's tool call id."""
    asks = spec.get("childPermissions")
    for ask in asks if isinstance(asks, list) else []:
        if not isinstance(ask, dict):
            continue
        player.turn.check()
        ask_permission(
            player,
            str(ask.get("toolCallId") or player.new_tool_id()),
            str(ask.get("title", "`ls`")),
            str(ask.get("kind", "execute")),
            str(ask.get("reason", "Not in allowlist: ls")),
            session_id=None if ask.get("onParent") else agent_id,
        )


def do_call(player: Player, spec: JSON) -> None:
    """A client method (fs/*, terminal/*, …) the real agent never calls (FACTS §2);
    the reply goes to `{{reply}}` (JSON) and `{{reply_<key>}}` (top-level scalars)."""
    params = dict(spec.get("params") or {})
    params.setdefault("sessionId", player.session.session_id)
    reply = player.turn.wait_reply(player.request(str(spec.get("method")), params))
    value = reply.result if reply.error is None else {"error": reply.error}
    player.turn.vars["reply"] = json.dumps(value, separators=(",", ":"), sort_keys=True)
    for key, item in value.items() if isinstance(value, dict) else []:
        if isinstance(item, (str, int, float, bool)):
            player.turn.vars[f"reply_{key}"] = str(item)


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
    "write": do_write,
    "exec": do_exec,
    "exec-gated": do_exec_gated,
    "permission": do_permission,
    "ask-question": do_ask_question,
    "create-plan": do_create_plan,
    "update-todos": do_update_todos,
    "generate-image": do_generate_image,
    "task": do_task,
    "call": do_call,
}
