"""A human view of a job's events for a terminal (stderr), as an ``EventSink``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, Any


def _short(digest: str) -> str:
    return digest[:19] + "…" if len(digest) > 20 else digest


_LINES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "job.accepted": lambda d: f"job accepted: pack {d['pack']} on backend {d['backend']}",
    "pack.ready": lambda d: (
        f"pack {d['name']} {d['version']} ({d['platform']}) verified: {d['files']} files, "
        f"{_short(d['closure_digest'])} in {d['verify_ms']:.0f} ms"
    ),
    "sandbox.ready": lambda d: (
        f"sandbox {d['sandbox_id']} ready ({d['backend']}{', warm' if d.get('warm') else ''})"
    ),
    "agent.initialized": lambda d: f"agent speaks ACP v{d['protocol_version']}",
    "session.started": lambda d: f"session {d['session_id']}",
    "session.titled": lambda d: f"title: {d['title']}",
    "tool.started": lambda d: f"tool {d.get('kind') or '?'}: {d.get('title') or ''}",
    "tool.completed": lambda d: f"tool done ({d['status']})",
    "plan.updated": lambda d: f"plan r{d['revision']}: {len(d['entries'])} steps",
    "mode.changed": lambda d: f"mode: {d['mode']}",
    "notice": lambda d: f"{d['level']}: {d['message']}",
    "provider.unmapped": lambda d: f"(kept unmapped: {d['kind']})",
    "usage.reported": lambda d: (
        "usage: " + ("reported" if d["available"] else "not reported by the agent")
    ),
    "interaction.requested": lambda d: (
        f"{d['kind']} {d['interaction_id']} waits for an answer "
        f"(acp-worker answer {d['job']} {d['interaction_id']} ANSWER.json) until {d['expires_at']}"
    ),
    "interaction.resolved": lambda d: (
        f"{d['kind']} {d['interaction_id']}: {d['outcome']} (by {d['resolved_by']})"
    ),
    "interaction.answer_rejected": lambda d: (
        f"answer to {d['interaction_id']} refused ({d['code']}): {d['reason']}"
    ),
    "permission.decided": lambda d: f"permission {d['decision']}: {d.get('title') or ''}",
    "todos.updated": lambda d: (
        f"todos r{d['revision']}: "
        + ", ".join(f"{t['content']} [{t['status']}]" for t in d["todos"])
    ),
    "delegation.started": lambda d: f"subagent started: {d.get('description') or d.get('role')}",
    "delegation.completed": lambda d: (
        f"subagent {d['state']}: {d.get('description') or d.get('role')}"
    ),
    "artifact.referenced": lambda d: f"artifact: {d['path']} ({d['kind']}, not uploaded)",
    "model.selected": lambda d: f"model: {d['model']} {d['params']} (defaults {d['defaults']})",
}


class ProgressSink:
    """Readable progress lines; assistant text is streamed as it arrives."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._streaming: str | None = None

    async def write(self, event: Mapping[str, Any], line: str) -> None:
        type_, data = event["type"], event["data"]
        if type_ == "message.delta" and data.get("text"):
            self._delta(data["role"], data["text"])
            return
        render = _LINES.get(type_)
        if type_ == "job.completed":
            self._line(_completed(data))
        elif render is not None:
            self._line(render({**data, "job": event.get("job_id")}))

    def _delta(self, role: str, text: str) -> None:
        if self._streaming != role:
            self._end_stream()
            self._stream.write("  " + ("thinking: " if role == "thought" else "agent: "))
            self._streaming = role
        self._stream.write(text)
        self._stream.flush()

    def _end_stream(self) -> None:
        if self._streaming is not None:
            self._stream.write("\n")
            self._streaming = None

    def _line(self, text: str) -> None:
        self._end_stream()
        self._stream.write(f"▸ {text}\n")
        self._stream.flush()

    async def close(self) -> None:
        self._end_stream()
        self._stream.flush()


def _completed(data: Mapping[str, Any]) -> str:
    text = f"job {data['status']}"
    if data.get("stop_reason"):
        text += f" ({data['stop_reason']})"
    if data.get("error"):
        text += f": {data['error']['message']} [{data['error']['code']}]"
    return text + f" in {data['duration_ms']:.0f} ms"
