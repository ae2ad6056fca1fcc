"""Canonical events v1: the envelope and the ``data`` of every event type.

These models are the public contract the control plane reads. Producers build them and
hand them to :meth:`worker.events.emitter.EventEmitter.emit`; the event's ``type`` is the
class's ``TYPE``, and :data:`EVENT_TYPES` (the one type → class registry) also drives the
JSON Schema export (``acp-worker schema``). Extend types, never rename.

What goes on the wire is :meth:`EventData.wire`: the fields the producer set, so a key a
producer leaves out stays absent (never a default filled in) and an explicit ``None``
stays ``null``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

EVENT_VERSION = 1


class _Data(BaseModel):
    # defer_build: a model's validator and serializer are built on its first use, not at
    # import; a job uses a dozen of these types, and building all of them took about a
    # third of this module's import (docs/figures.md, "One-shot overhead").
    model_config = ConfigDict(extra="forbid", defer_build=True)


class EventData(_Data):
    """The ``data`` of one event type; ``TYPE`` is the envelope's ``type``."""

    TYPE: ClassVar[str]

    def wire(self) -> dict[str, Any]:
        """The ``data`` object as sent: the fields set by the producer, none defaulted."""
        return self.__pydantic_serializer__.to_python(self, exclude_unset=True)  # type: ignore[no-any-return]


class ErrorInfo(_Data):
    code: str
    message: str
    details: dict[str, object] | None = None


class Bounded(_Data):
    """A text field cut to a bound; ``truncated`` says whether it was."""

    text: str
    truncated: bool
    bytes: int = Field(description="UTF-8 size of the full value before any cut.")


class JobAccepted(EventData):
    TYPE = "job.accepted"

    pack: str
    platform: str | None
    backend: str
    labels: dict[str, str]


class JobStarted(EventData):
    TYPE = "job.started"

    worker_id: str


class PackReady(EventData):
    TYPE = "pack.ready"

    name: str
    version: str
    provider: str
    platform: str
    closure_digest: str
    files: int
    bytes: int
    verify_ms: float = Field(description="Time to re-verify the closure before this launch.")


class SandboxReady(EventData):
    TYPE = "sandbox.ready"

    backend: str
    sandbox_id: str
    #: Set only for a warm slot's sandbox (``worker.job.warm``): a cold sandbox's event
    #: carries neither field.
    warm: bool = False
    #: Milliseconds the claim of the warm slot took.
    claim_ms: float | None = None


class AgentInitialized(EventData):
    TYPE = "agent.initialized"

    protocol_version: int
    agent_capabilities: dict[str, object]
    auth_methods: list[dict[str, object]]
    agent_info: dict[str, object] | None = None


class SessionStarted(EventData):
    TYPE = "session.started"

    session_id: str
    resumed: bool
    modes: dict[str, object] | None = None
    models: dict[str, object] | None = None
    config_options: list[dict[str, object]] | None = None


class Attributed(EventData):
    """Fields of events derived from one agent update: who said it, and whether it is
    history replayed by ``session/load`` rather than new output."""

    child_id: str | None = Field(
        default=None, description="The subagent session that produced it; null: the parent."
    )
    replay: bool = Field(default=False, description="Replayed history (session/load).")


class MessageDelta(Attributed):
    TYPE = "message.delta"

    role: Literal["assistant", "thought", "user"]
    text: str
    content: dict[str, object] | None = Field(
        default=None, description="The ACP content block when it is not plain text."
    )


class Location(_Data):
    path: str = Field(description="Relative to the workspace root.")
    line: int | None = None


class DiffBlock(_Data):
    path: str
    old_text: Bounded | None
    new_text: Bounded


class ToolContent(_Data):
    """A non-text content block of a tool (image, audio, resource, resource link), kept:
    its data inline while the update's inline budget lasts, else by reference only."""

    type: Literal["image", "audio", "resource", "resource_link"]
    inline: bool = Field(
        description="The block's content is here (`data` or whole `text`); false: only "
        "described (`bytes`, `sha256`), it was over the inline budget."
    )
    mime_type: str | None = None
    uri: str | None = None
    name: str | None = Field(default=None, description="A resource link's name.")
    title: str | None = None
    description: str | None = None
    bytes: int | None = Field(
        default=None, description="Decoded size (a link: the size the agent gave, if any)."
    )
    sha256: str | None = Field(default=None, description="Of the decoded bytes or UTF-8 text.")
    data: str | None = Field(default=None, description="Base64, as the agent sent it.")
    text: Bounded | None = Field(default=None, description="An embedded text resource.")


class ToolStarted(Attributed):
    TYPE = "tool.started"

    tool_call_id: str
    title: str | None
    kind: str | None
    status: str
    raw_input: Bounded | None = Field(
        description="The tool's arguments as JSON, secret-looking keys redacted, bounded."
    )
    locations: list[Location]
    content: list[ToolContent] | None = Field(
        default=None,
        description="Images, audio, resources and resource links the tool call carried; "
        "absent when it carried none.",
    )


class ToolUpdated(Attributed):
    TYPE = "tool.updated"

    tool_call_id: str
    status: str | None
    title: str | None = None
    output: Bounded | None = None
    exit_code: int | None = Field(
        default=None, description="A shell tool's exit code when the agent reported one."
    )
    raw_input: Bounded | None = None
    diffs: list[DiffBlock] = Field(default_factory=list)
    locations: list[Location] = Field(default_factory=list)
    content: list[ToolContent] | None = Field(
        default=None,
        description="Images, audio, resources and resource links the tool returned; "
        "absent when it returned none.",
    )


class ToolFailure(_Data):
    code: Literal["error", "rejected", "permission_denied", "exit_code"]
    message: str = Field(description="As the agent said it (bounded), or what the worker saw.")


class ToolCompleted(ToolUpdated):
    TYPE = "tool.completed"

    status: Literal["completed", "failed"]
    failure: ToolFailure | None = Field(
        default=None,
        description="Why a tool the agent reported `completed` failed: its `rawOutput` "
        "said so (an error, a rejection, a permission denial, a non-zero exit code), or "
        "the worker denied its permission ask; absent otherwise.",
    )


class PlanEntry(_Data):
    content: str
    priority: str | None = None
    status: str


class PlanUpdated(Attributed):
    TYPE = "plan.updated"

    revision: int = Field(ge=1)
    entries: list[PlanEntry]


class Todo(_Data):
    id: str = Field(description="The agent's own todo id (merge key).")
    content: str
    status: Literal["pending", "in_progress", "completed", "cancelled", "unknown"]
    native_status: str = Field(description="The status exactly as the agent sent it.")


class TodosUpdated(Attributed):
    """The complete merged checklist after one ``cursor/update_todos``."""

    TYPE = "todos.updated"

    revision: int = Field(ge=1)
    todos: list[Todo]
    merge: bool = Field(description="Whether the agent asked to merge (else: replace).")
    tool_call_id: str | None = None


class Delegation(Attributed):
    """A complete snapshot of one subagent task (every delegation.* event)."""

    # No TYPE: the producer picks started / updated / completed, the subclasses below.

    child_id: str | None = Field(
        default=None, description="The subagent session id; null until the agent names it."
    )
    tool_call_id: str | None = Field(default=None, description="The parent's Task tool call.")
    parent_id: str | None = Field(
        default=None, description="Session that spawned it: the root session or another child."
    )
    state: Literal["running", "completed", "failed", "cancelled"]
    reason: str | None = Field(default=None, description="Why it failed, e.g. disconnected.")
    role: str | None = Field(default=None, description="Agent name or subagent type.")
    model: str | None = None
    description: str | None = None
    task: Bounded | None = Field(default=None, description="The prompt given to the subagent.")
    subagent_type: str | None = None
    agent_id: str | None = None
    background: bool | None = None
    duration_ms: int | None = Field(
        default=None, description="As reported; for background children only the launch time."
    )


class DelegationStarted(Delegation):
    __doc__ = Delegation.__doc__  # one schema definition, "Delegation", for all three
    TYPE = "delegation.started"
    model_config = ConfigDict(title="Delegation")


class DelegationUpdated(Delegation):
    __doc__ = Delegation.__doc__  # one schema definition, "Delegation", for all three
    TYPE = "delegation.updated"
    model_config = ConfigDict(title="Delegation")


class DelegationCompleted(Delegation):
    __doc__ = Delegation.__doc__  # one schema definition, "Delegation", for all three
    TYPE = "delegation.completed"
    model_config = ConfigDict(title="Delegation")


class ArtifactReferenced(Attributed):
    """A file the agent pointed at, checked to be a regular file inside the workspace."""

    TYPE = "artifact.referenced"

    path: str = Field(description="Relative to the workspace root.")
    kind: Literal["generated_image", "reference_image", "tool_resource"]
    registered: Literal[False] = False
    bytes: int = Field(ge=0, description="Size when it was checked; the file is not read.")
    tool_call_id: str | None = None
    description: str | None = None


class QuestionOption(_Data):
    id: str
    label: str


class Question(_Data):
    id: str
    prompt: str
    options: list[QuestionOption]
    allow_multiple: bool


class QuestionRequest(_Data):
    title: str | None
    questions: list[Question]


class PlanTodo(_Data):
    id: str
    content: str
    status: str


class PlanPhase(_Data):
    name: str
    todos: list[PlanTodo]


class PlanRequest(_Data):
    revision: int = Field(ge=1, description="Answers may name it; a stale one is rejected.")
    name: str | None
    overview: str | None
    markdown: str = Field(description="The full plan document, never truncated.")
    todos: list[PlanTodo]
    phases: list[PlanPhase]
    is_project: bool


class PermissionOption(_Data):
    option_id: str
    name: str
    kind: str


class PermissionRequest(_Data):
    title: str | None
    kind: str | None
    reason: str | None
    options: list[PermissionOption] = Field(description="Never an allow-always option.")
    child_id: str | None = Field(
        default=None, description="The subagent session that asks; absent: the parent."
    )


InteractionKind = Literal["question", "plan", "permission"]


class Interaction(EventData):
    interaction_id: str


class InteractionRequested(Interaction):
    """Persisted in ``acpw:{J}:interactions`` before this event is emitted."""

    TYPE = "interaction.requested"

    kind: InteractionKind
    turn: int = Field(ge=1)
    tool_call_id: str | None
    expires_at: str = Field(description="RFC 3339 UTC; unanswered by then: declined.")
    question: QuestionRequest | None = None
    plan: PlanRequest | None = None
    permission: PermissionRequest | None = None


class InteractionResolved(Interaction):
    TYPE = "interaction.resolved"

    kind: InteractionKind
    outcome: Literal["answered", "skipped", "accepted", "rejected", "selected", "cancelled"]
    resolved_by: Literal["answer", "timeout", "turn_ended", "cancelled", "timed_out"]
    answer: dict[str, object] | None = Field(default=None, description="The accepted answer.")
    delivered: bool = Field(description="The reply was written to the agent.")


class InteractionAnswerRejected(Interaction):
    """An answer that was refused; the interaction stays open."""

    TYPE = "interaction.answer_rejected"

    code: Literal[
        "unknown_interaction",
        "closed",
        "wrong_job",
        "wrong_turn",
        "stale_revision",
        "invalid_answer",
    ]
    reason: str


class PermissionDecided(EventData):
    TYPE = "permission.decided"

    tool_call_id: str | None
    title: str | None
    kind: str | None
    policy: Literal["deny", "allow_reads", "allow_all", "ask"]
    decision: Literal["allowed", "denied"]
    option_id: str | None = Field(description="The option answered; null: cancelled.")
    interaction_id: str | None = None
    child_id: str | None = Field(
        default=None, description="The subagent session that asked; absent: the parent."
    )


class ModeChanged(Attributed):
    TYPE = "mode.changed"

    mode: str


class ModelSelected(EventData):
    TYPE = "model.selected"

    source: Literal["job", "default"] = Field(
        description="`job`: the job named the model and it was set; `default`: the job "
        "named none, and this is what the agent says it uses (nothing was set)."
    )
    model: str | None = Field(
        description="The model id; null when the job named none and the agent did not say."
    )
    params: dict[str, str] = Field(description="Parameters the job named, as echoed.")
    defaults: dict[str, str] = Field(
        default_factory=dict,
        description="Parameters the agent exposes that the job did not name: its defaults.",
    )
    picker: Literal["variant", "parameterized"]
    via: Literal["config_option", "set_model"] | None = Field(
        description="How the model was set (null for `source: default`)."
    )
    verified: bool = Field(
        description="The agent echoed exactly this selection (never for `set_model`, which "
        "returns nothing to compare, nor for a default)."
    )
    reasoning: str | None = Field(
        default=None,
        description="The job's thinking level, when it named one (its parameter and value "
        "are in `params`).",
    )


class ConfigUpdated(Attributed):
    TYPE = "config.updated"

    config_options: list[dict[str, object]]


class CommandsAvailable(Attributed):
    TYPE = "commands.available"

    commands: list[dict[str, object]]


class SessionTitled(Attributed):
    TYPE = "session.titled"

    title: str


class WorkspaceChanged(EventData):
    """What the agent changed, captured once its sandbox was destroyed (the fields in
    the order they are sent; ``worker.workspace.changes`` bounds the lists)."""

    TYPE = "workspace.changed"

    counts: dict[str, int] = Field(description="Changed paths by status.")
    total: int = Field(ge=0, description="Every changed path, listed or not.")
    truncated: bool = Field(description="`paths` lists fewer than `total`.")
    paths: list[dict[str, object]]
    patch: dict[str, object] | None = Field(
        description="The patch file's reference and what it left out; null: no change."
    )
    base: dict[str, object] | None = Field(
        default=None,
        description="What the changes are against: {kind: local}, {kind: git, commit} (the "
        "commit the clone checked out) or {kind: s3, sha256} (the snapshot's digest).",
    )


class UsageCost(_Data):
    amount: float
    currency: str


class TokenUsage(_Data):
    """Token counts as the agent reported them (ACP's prompt-result ``usage``)."""

    input: int = Field(ge=0)
    output: int = Field(ge=0)
    total: int = Field(ge=0)
    thought: int | None = Field(default=None, ge=0)
    cached_read: int | None = Field(default=None, ge=0)
    cached_write: int | None = Field(default=None, ge=0)


class UsageReported(Attributed):
    TYPE = "usage.reported"

    available: bool = Field(description="False when the agent reported no usage: never zero.")
    source: Literal["agent"] | None = None
    used: int | None = Field(default=None, description="Context tokens in use.")
    size: int | None = Field(default=None, description="Context window size.")
    cost: UsageCost | None = Field(
        default=None, description="The session's cumulative cost, as the agent reported it."
    )
    tokens: TokenUsage | None = Field(
        default=None, description="The turn's token counts (the agent's prompt result)."
    )


class AttemptUsage(_Data):
    """What one attempt used, from what its agent reported: never an estimate, never 0
    for unknown."""

    available: bool = Field(
        description="False: the agent reported neither a cost nor token counts in this attempt."
    )
    cost: UsageCost | None = Field(
        default=None,
        description="This attempt's cost: the last cumulative session cost the agent "
        "reported, less the cost it replayed for the session's earlier attempts (if any).",
    )
    tokens: TokenUsage | None = Field(
        default=None, description="The turn's token counts (the agent's prompt result)."
    )


class ProviderUnmapped(Attributed):
    TYPE = "provider.unmapped"

    kind: str
    raw: Bounded
    partial: bool = Field(
        default=False, description="The update was mapped; these fields of it were not."
    )


class Notice(EventData):
    TYPE = "notice"

    level: Literal["info", "warning", "error"]
    code: str
    message: str
    details: dict[str, object] | None = None


class ResultRef(_Data):
    """Where the result bundle's manifest is."""

    kind: Literal["s3"]
    bucket: str
    key: str
    sha256: str


class JobCompleted(EventData):
    TYPE = "job.completed"

    status: Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]
    stop_reason: str | None
    error: ErrorInfo | None
    duration_ms: float
    timings_ms: dict[str, float] = Field(default_factory=dict, description="Per phase.")
    result: ResultRef | None = Field(default=None, description="The uploaded result bundle.")
    result_error: ErrorInfo | None = Field(
        default=None,
        description="Present when a result bundle upload was attempted and failed, whatever "
        "the status (`result` is null then; a `notice` said so too).",
    )
    teardown_error: ErrorInfo | None = Field(
        default=None,
        description="Present when a step of the teardown failed (the first one): a job whose "
        "turn succeeded then settles `failed` with this error; another keeps its own.",
    )
    usage: AttemptUsage | None = Field(
        default=None,
        description="What the attempt used, as its agent reported it (absent when the job "
        "was settled by another party, e.g. a reaper's `lost`).",
    )


#: Every event type, in the order the schema lists them: the one type → class registry.
EVENT_TYPES: dict[str, type[EventData]] = {
    model.TYPE: model
    for model in (
        JobAccepted,
        JobStarted,
        PackReady,
        SandboxReady,
        AgentInitialized,
        SessionStarted,
        MessageDelta,
        ToolStarted,
        ToolUpdated,
        ToolCompleted,
        PlanUpdated,
        TodosUpdated,
        DelegationStarted,
        DelegationUpdated,
        DelegationCompleted,
        ArtifactReferenced,
        InteractionRequested,
        InteractionResolved,
        InteractionAnswerRejected,
        PermissionDecided,
        ModeChanged,
        ModelSelected,
        ConfigUpdated,
        CommandsAvailable,
        SessionTitled,
        WorkspaceChanged,
        UsageReported,
        ProviderUnmapped,
        Notice,
        JobCompleted,
    )
}

TERMINAL_TYPE = JobCompleted.TYPE


class Envelope(BaseModel):
    """Every event: ``seq`` starts at 1 and has no gaps within an attempt."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    v: Literal[1]
    job_id: str
    attempt: int = Field(ge=1)
    seq: int = Field(ge=1)
    ts: str = Field(description="RFC 3339 UTC with milliseconds.")
    type: str
    data: dict[str, object]


class UnknownData(EventData):
    """The ``data`` of an event this version cannot type (a newer worker's type, or a
    shape its model refuses), kept as it was sent: reading never drops an event."""

    TYPE = ""
    model_config = ConfigDict(extra="allow", defer_build=True)


def typed_data(event_type: object, data: Mapping[str, object]) -> EventData:
    """``data`` as its type's model (``EVENT_TYPES``). A field this version does not
    know (a newer worker's, which v1 may add: extend, never rename) is left out rather
    than failing the event; what still does not fit is ``UnknownData``."""
    model = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        return UnknownData.model_validate(data)
    try:
        return model.model_validate(data)
    except ValidationError:
        known = {key: value for key, value in data.items() if key in model.model_fields}
        try:
            return model.model_validate(known)
        except ValidationError:
            return UnknownData.model_validate(data)


class Event(BaseModel):
    """An event as the control plane reads it back: the envelope, its ``data`` typed by
    ``type`` (``isinstance(event.data, JobCompleted)``; ``UnknownData`` for what this
    version cannot type). Built from the stored JSON by ``Event.model_validate``."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    v: int
    job_id: str
    attempt: int
    seq: int
    ts: str
    type: str
    data: EventData

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, value: object) -> Any:
        if isinstance(value, Mapping) and isinstance(value.get("data"), Mapping):
            return {**value, "data": typed_data(value.get("type"), value["data"])}
        return value
