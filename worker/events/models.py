"""Canonical events v1: the envelope and the ``data`` of every event type.

These models are the public contract the control plane reads. They are used to export
the JSON Schema (``acp-worker events schema``) and to check golden files; the hot path
builds plain dicts and the tests hold it to this schema. Extend types, never rename.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EVENT_VERSION = 1


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _OpenData(BaseModel):
    """Data of event types whose producers are still growing: extra keys allowed."""

    model_config = ConfigDict(extra="allow")


class ErrorInfo(_Data):
    code: str
    message: str
    details: dict[str, Any] | None = None


class Bounded(_Data):
    """A text field cut to a bound; ``truncated`` says whether it was."""

    text: str
    truncated: bool
    bytes: int = Field(description="UTF-8 size of the full value before any cut.")


class JobAccepted(_Data):
    pack: str
    platform: str | None
    backend: str
    labels: dict[str, str]


class JobStarted(_Data):
    worker_id: str


class PackReady(_Data):
    name: str
    version: str
    provider: str
    platform: str
    closure_digest: str
    files: int
    bytes: int
    verify_ms: float = Field(description="Time to re-verify the closure before this launch.")


class SandboxReady(_Data):
    backend: str
    sandbox_id: str


class AgentInitialized(_Data):
    protocol_version: int
    agent_capabilities: dict[str, Any]
    auth_methods: list[dict[str, Any]]
    agent_info: dict[str, Any] | None = None


class SessionStarted(_Data):
    session_id: str
    resumed: bool
    modes: dict[str, Any] | None = None
    models: dict[str, Any] | None = None
    config_options: list[dict[str, Any]] | None = None


class MessageDelta(_Data):
    role: Literal["assistant", "thought", "user"]
    text: str
    content: dict[str, Any] | None = Field(
        default=None, description="The ACP content block when it is not plain text."
    )
    replay: bool = False


class Location(_Data):
    path: str = Field(description="Relative to the workspace root.")
    line: int | None = None


class DiffBlock(_Data):
    path: str
    old_text: Bounded | None
    new_text: Bounded


class ToolStarted(_Data):
    tool_call_id: str
    title: str | None
    kind: str | None
    status: str
    raw_input: Bounded | None
    locations: list[Location]


class ToolUpdated(_Data):
    tool_call_id: str
    status: str | None
    title: str | None = None
    output: Bounded | None = None
    diffs: list[DiffBlock] = Field(default_factory=list)
    locations: list[Location] = Field(default_factory=list)


class ToolCompleted(ToolUpdated):
    status: Literal["completed", "failed"]


class PlanEntry(_Data):
    content: str
    priority: str | None = None
    status: str


class PlanUpdated(_Data):
    revision: int = Field(ge=1)
    entries: list[PlanEntry]


class TodosUpdated(_OpenData):
    revision: int = Field(ge=1)
    todos: list[dict[str, Any]]


class Delegation(_OpenData):
    child_id: str


class ArtifactReferenced(_OpenData):
    path: str
    registered: Literal[False] = False


class Interaction(_OpenData):
    interaction_id: str


class ModeChanged(_Data):
    mode: str


class ModelSelected(_OpenData):
    model: str


class CommandsAvailable(_Data):
    commands: list[dict[str, Any]]


class SessionTitled(_Data):
    title: str


class WorkspaceChanged(_OpenData):
    paths: list[dict[str, Any]]


class UsageReported(_OpenData):
    available: bool = Field(description="False when the agent reported no usage: never zero.")


class ProviderUnmapped(_Data):
    kind: str
    raw: Bounded


class Notice(_Data):
    level: Literal["info", "warning", "error"]
    code: str
    message: str
    details: dict[str, Any] | None = None


class JobCompleted(_Data):
    status: Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]
    stop_reason: str | None
    error: ErrorInfo | None
    duration_ms: float
    timings_ms: dict[str, float] = Field(default_factory=dict, description="Per phase.")


EVENT_TYPES: dict[str, type[BaseModel]] = {
    "job.accepted": JobAccepted,
    "job.started": JobStarted,
    "pack.ready": PackReady,
    "sandbox.ready": SandboxReady,
    "agent.initialized": AgentInitialized,
    "session.started": SessionStarted,
    "message.delta": MessageDelta,
    "tool.started": ToolStarted,
    "tool.updated": ToolUpdated,
    "tool.completed": ToolCompleted,
    "plan.updated": PlanUpdated,
    "todos.updated": TodosUpdated,
    "delegation.started": Delegation,
    "delegation.updated": Delegation,
    "delegation.completed": Delegation,
    "artifact.referenced": ArtifactReferenced,
    "interaction.requested": Interaction,
    "interaction.resolved": Interaction,
    "mode.changed": ModeChanged,
    "model.selected": ModelSelected,
    "commands.available": CommandsAvailable,
    "session.titled": SessionTitled,
    "workspace.changed": WorkspaceChanged,
    "usage.reported": UsageReported,
    "provider.unmapped": ProviderUnmapped,
    "notice": Notice,
    "job.completed": JobCompleted,
}

TERMINAL_TYPE = "job.completed"


class Envelope(BaseModel):
    """Every event: ``seq`` starts at 1 and has no gaps within an attempt."""

    model_config = ConfigDict(extra="forbid")

    v: Literal[1]
    job_id: str
    attempt: int = Field(ge=1)
    seq: int = Field(ge=1)
    ts: str = Field(description="RFC 3339 UTC with milliseconds.")
    type: str
    data: dict[str, Any]
