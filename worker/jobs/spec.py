"""Job spec v1: the JSON a control plane submits, validated strictly.

Unknown fields are refused (``extra="forbid"``), secrets never travel inline: a
credential is a *reference* (``env:NAME``, ``file:PATH`` or ``<scheme>:<where>`` of a
pluggable secret source, e.g. ``aws-sm:prod/cursor#api_key``) resolved by the worker.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from worker.errors import InvalidJobSpec
from worker.jobs.prompt import ImageBlock, ResourceLinkBlock, check_prompt

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: A session id a job may resume (``worker.sessions`` holds agent-chosen ids to it too).
SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
_CRED_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# `env:NAME`, `file:PATH`, or `<scheme>:<where>` for a pluggable source (which ones a
# worker enables is its setting, checked when the job runs, not here).
_CRED_REF = re.compile(
    r"^(env:[A-Za-z_][A-Za-z0-9_]{0,127}"
    r"|file:[^\x00]{1,1024}"
    r"|(?!env:|file:)[a-z][a-z0-9+.-]{0,31}:[^\x00-\x1f\x7f]{1,2048})$"
)


class _Strict(BaseModel):
    # strict: a JSON string is not a number, 1 is not true; JSON is validated as JSON.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PackRef(_Strict):
    """Which provider pack runs the agent."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$", description="Pack folder name.")
    platform: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]+-[a-z0-9_]+$",
        description="e.g. linux-x64; default: this worker's platform.",
    )


class LocalWorkspace(_Strict):
    """A directory on the worker host; the agent works on a private copy of it."""

    kind: Literal["local"] = "local"
    path: str = Field(min_length=1, max_length=4096, description="Absolute or job-relative path.")


class GitWorkspace(_Strict):
    """A Git repository cloned by the worker (shallow, no submodules by default, never LFS)."""

    kind: Literal["git"]
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="https:// or git:// URL (see ACPW_GIT_ALLOWED_SCHEMES).",
    )
    ref: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$", description="Branch or tag."
    )
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")
    depth: int | None = Field(default=1, ge=1, le=1_000_000, description="None: full history.")
    submodules: bool = False
    lfs: bool = Field(
        default=False,
        description="Must be false: this worker does not fetch LFS objects (LFS pointer files "
        "are checked out as they are).",
    )
    credential: str | None = Field(
        default=None,
        pattern=r"^[A-Z][A-Z0-9_]{0,63}$",
        description="Name in `credentials` whose value authenticates HTTPS to `url` (and below) "
        "only: never stored, never sent to other repositories (submodules) or redirects.",
    )

    @field_validator("lfs")
    @classmethod
    def _no_lfs(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "LFS fetch is not supported by this worker (LFS pointer files are checked "
                "out as they are); set it to false"
            )
        return value


class S3Workspace(_Strict):
    """A tar archive in S3, extracted with the same safety rules as pack archives."""

    kind: Literal["s3"]
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    key: str = Field(min_length=1, max_length=1024)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$", description="Pin.")


Workspace = Annotated[LocalWorkspace | GitWorkspace | S3Workspace, Field(discriminator="kind")]


class ResultsTarget(_Strict):
    """Where the result bundle (patch + changed files + manifest) is uploaded."""

    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field(default="acp-worker", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str = Field(max_length=1_000_000)

    def wire(self) -> dict[str, object]:
        return {"type": "text", "text": self.text}


#: One block of a prompt given as a list (images and links: ``worker.jobs.prompt``).
PromptBlock = Annotated[TextBlock | ImageBlock | ResourceLinkBlock, Field(discriminator="type")]


def _prompt_form(value: object) -> str:
    return "text" if isinstance(value, str) else "blocks"


#: A prompt: text, or blocks. Tagged so that an error names ``prompt.blocks.0.image.data``
#: rather than the union's internals.
Prompt = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[PromptBlock], Tag("blocks")],
    Discriminator(_prompt_form),
]


class ModelSpec(_Strict):
    """The model and every parameter the job wants, stated explicitly.

    Cursor offers two disjoint id spaces: variant ids that encode their parameters
    (``gpt-5.6-luna[context=272k,reasoning=medium,fast=false]``) and base ids whose
    parameters are separate options (``gpt-5.6-luna`` + ``{"context": "272k", …}``).
    Parameters the job omits stay the agent's defaults and are reported as such.
    """

    id: str = Field(min_length=1, max_length=200)
    params: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description="e.g. context, reasoning, effort, reasoning_effort, thinking, fast.",
    )
    picker: Literal["auto", "variant", "parameterized"] = Field(
        default="auto",
        description="auto: variant ids (with `[...]`) use the variant picker, others the "
        "parameterized one.",
    )
    reasoning: Literal["off", "low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None,
        description="The thinking level, mapped to the parameter the model exposes for it "
        "(`reasoning`, `effort`, `reasoning_effort`, boolean `thinking`): only to a value its "
        "catalog offers, never a higher one (see docs/contracts.md).",
    )

    @model_validator(mode="after")
    def _one_id_space(self) -> ModelSpec:
        if (self.params or self.reasoning) and self.variant:
            raise ValueError("a variant id (`base[k=v,…]`) already fixes its parameters")
        return self

    @property
    def variant(self) -> bool:
        """Whether this selection uses the variant-id picker."""
        if self.picker != "auto":
            return self.picker == "variant"
        return "[" in self.id


class Permissions(_Strict):
    """How ``session/request_permission`` is answered (never with allow-always)."""

    policy: Literal["deny", "allow_reads", "allow_all", "ask"] = Field(
        default="deny",
        description="deny; allow_reads (read/search tools); allow_all; ask (an interaction).",
    )


class Interactions(_Strict):
    """Questions, plans and permission asks answered by the control plane."""

    answer_timeout_s: float = Field(
        default=600, gt=0, le=24 * 3600, description="Unanswered by then: declined."
    )


class SessionRef(_Strict):
    """Resume a session this agent recorded earlier (``session/load``)."""

    resume: str = Field(pattern=SESSION_ID)


class Limits(_Strict):
    """Resource limits for the sandbox and the job."""

    timeout_s: float = Field(default=600, gt=0, le=24 * 3600, description="Wall clock, seconds.")
    memory_mb: int = Field(default=2048, ge=64, le=256 * 1024, description="Memory incl. swap.")
    cpus: float = Field(default=1.0, gt=0, le=64, description="CPU quota in cores.")
    pids: int = Field(default=512, ge=8, le=65536, description="Max tasks in the sandbox.")
    disk_mb: int = Field(
        default=10240,
        ge=16,
        le=1024 * 1024,
        description="Size of the workspace's own filesystem in MiB (the staged copy included): "
        "writes past it fail with ENOSPC inside the sandbox (see ACPW_WORKSPACE_DISK).",
    )


class Network(_Strict):
    """Network policy: ``none`` (no route out), or ``allowlist``: still no route out, but
    a per-job proxy reachable from inside the sandbox relays HTTP CONNECT to exactly the
    listed ``host:port`` entries (see ``worker.network``)."""

    mode: Literal["none", "allowlist"] = "none"
    allow: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="`host:port` (hostname, IPv4 or [IPv6] literal; no wildcards); "
        "lowercased. Private addresses are reachable only when named literally.",
    )

    @field_validator("allow")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        from worker.network.allow import parse_endpoint

        return [str(parse_endpoint(entry)) for entry in value]

    @model_validator(mode="after")
    def _allow_matches_mode(self) -> Network:
        if (self.mode == "allowlist") != bool(self.allow):
            raise ValueError("`allow` is required with mode allowlist and refused otherwise")
        return self


class Expect(_Strict):
    """What a successful turn must have done, checked once the agent ended its turn on
    its own: a turn that did not settles ``failed`` (``expectation_unmet``). Facts only
    (tool calls seen, changes captured), never the agent's text: a refusal, an
    entitlement or auth error, can arrive as ordinary assistant text."""

    tool_calls: int = Field(
        default=0, ge=0, le=10_000, description="At least this many tool calls started."
    )
    changes: bool = Field(default=False, description="At least one change in the workspace.")
    files: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Workspace paths (relative, POSIX) the turn must have added or modified.",
    )

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, value: list[str]) -> list[str]:
        from worker.safetree.names import path_problem

        for path in value:
            problem = path_problem(path)
            if problem is not None:
                raise ValueError(f"{path[:64]!r}: {problem}")
        return value


class JobSpec(_Strict):
    """A run job, version 1."""

    v: Literal[1]
    job_id: str = Field(pattern=_ID)
    pack: PackRef
    workspace: Workspace
    prompt: Prompt = Field(
        description="Prompt text, or ACP content blocks: text, image, resource_link."
    )
    model: ModelSpec | None = None
    mode: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$",
        description="An ACP session mode id the agent offers (`modes.availableModes` of"
        " `session/new`), e.g. Cursor's `plan`, claude's `acceptEdits`, codex's `read-only`;"
        " checked against the offer before `session/set_mode`.",
    )
    model_endpoint: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$",
        description="An operator-declared model endpoint for the pack, by name "
        "(`ACPW_MODEL_ENDPOINTS`); default: the pack's default endpoint, if any.",
    )
    credentials: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Credential name -> reference (`env:NAME`, `file:PATH` or `<scheme>:<where>`"
        " of an enabled secret source, e.g. `aws-sm:<secret-id>[#<json-key>]`), never a secret.",
    )
    session: SessionRef | None = None
    permissions: Permissions = Field(default_factory=Permissions)
    interactions: Interactions = Field(default_factory=Interactions)
    limits: Limits = Field(default_factory=Limits)
    network: Network = Field(default_factory=Network)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    keep_workspace: bool = Field(
        default=False,
        description="Keep the staged workspace after the job (ACPW_KEEP_WORKSPACE_S), "
        "then the reaper removes it.",
    )
    results: ResultsTarget | None = Field(
        default=None, description="Export a result bundle to S3 (default: the worker's bucket)."
    )
    expect: Expect | None = Field(
        default=None,
        description="What success requires beyond the agent's own stop reason (see Expect).",
    )

    @field_validator("credentials")
    @classmethod
    def _references_only(cls, value: dict[str, str]) -> dict[str, str]:
        for name, ref in value.items():
            if not _CRED_NAME.match(name):
                raise ValueError(f"credential name {name!r} must match [A-Z][A-Z0-9_]*")
            if not _CRED_REF.fullmatch(ref):
                # Never echo the value: it may be a secret pasted inline by mistake.
                raise ValueError(
                    f"credential {name} must be a reference `env:NAME`, `file:PATH` or "
                    "`<scheme>:<where>`, never the secret itself"
                )
        return value

    @model_validator(mode="after")
    def _workspace_credential_bound(self) -> JobSpec:
        name = getattr(self.workspace, "credential", None)
        if name is not None and name not in self.credentials:
            # Cloning without it would fail later, or silently fetch a public mirror.
            raise ValueError(
                f"workspace.credential names {name}, which `credentials` does not bind"
            )
        return self

    @field_validator("prompt")
    @classmethod
    def _bounded_prompt(cls, value: str | list[object]) -> str | list[Any]:
        if isinstance(value, list):
            check_prompt(value)
        return value

    @field_validator("labels")
    @classmethod
    def _bounded_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$", key) or len(item) > 256:
                raise ValueError(f"label {key[:64]!r}: keys [A-Za-z0-9._/-]{{1,63}}, values ≤ 256")
        return value

    def prompt_blocks(self) -> list[dict[str, Any]]:
        """The prompt as ACP content blocks."""
        if isinstance(self.prompt, str):
            return [{"type": "text", "text": self.prompt}]
        return [block.wire() for block in self.prompt]


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(root)"
    more = exc.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{loc}: {first['msg']}{suffix}"


def parse_job(raw: str | bytes | dict[str, object]) -> JobSpec:
    """Validate a job from JSON text or a decoded mapping.

    Raises:
        InvalidJobSpec: the text is not JSON, or a field is missing, unknown or of the
            wrong type; the message names the first offending field.
    """
    try:
        data = raw if isinstance(raw, dict) else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidJobSpec(f"job is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidJobSpec("job must be a JSON object")
    try:
        # Validated as JSON even when handed a mapping (a Celery payload), so the strict
        # rules are the JSON ones: objects become the nested models, "60" is not 60.
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJobSpec(f"job is not JSON data: {exc}", job_id=_peek_id(data)) from None
    try:
        return JobSpec.model_validate_json(text)
    except ValidationError as exc:
        fields = [".".join(str(p) for p in e["loc"]) for e in exc.errors()]
        raise InvalidJobSpec(_describe(exc), fields=fields, job_id=_peek_id(data)) from None


def _peek_id(data: dict[str, object]) -> str | None:
    job_id = data.get("job_id")
    return job_id if isinstance(job_id, str) and re.match(_ID, job_id) else None
