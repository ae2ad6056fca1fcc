"""One settings object, built at the entry point and passed down.

Values come from ``ACPW_*`` environment variables (or explicit keyword arguments in
tests). Nothing deeper in the package reads the environment, with one exception: a
sandbox backend's own settings are not here but in its typed config
(``worker.sandbox.config``), which ``worker.sandbox.backend_config`` builds from the same
``ACPW_*`` variables when a backend is built.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from worker.endpoints import ModelEndpoint, check_endpoints
from worker.errors import InvalidSettings

_REPO_PACKS = Path(__file__).resolve().parent.parent / "provider_packs"


def default_worker_id() -> str:
    """``<hostname>-<pid>``: unique per worker process on a host."""
    return f"{socket.gethostname()}-{os.getpid()}"


def default_cache_dir() -> Path:
    """The user's cache directory for acp-worker (platformdirs)."""
    return Path(platformdirs.user_cache_dir("acp-worker"))


class Settings(BaseSettings):
    """Worker configuration; every field can be set as ``ACPW_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="ACPW_", extra="forbid", frozen=True)

    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Content-addressed cache of materialized pack closures.",
    )
    pack_rehash_s: float = Field(
        default=86_400.0,
        ge=0,
        description="Seconds a closure's verified record stands in for re-hashing it before "
        "a launch (any change to a file still forces the re-hash); 0: re-hash every launch.",
    )
    packs_dir: Path = Field(
        default=_REPO_PACKS, description="Folder of pack declarations, one folder per pack."
    )
    work_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_state_dir("acp-worker")) / "work",
        description="Where per-job workspace copies are staged (removed after the job).",
    )
    session_dir: Path | None = Field(
        default=None,
        description="Store of agent sessions kept for `session.resume` (<dir>/<pack>/<id>/); "
        "default: `sessions` next to `work_dir`. Share it between workers that resume.",
    )
    session_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="Largest session kept (bytes)."
    )
    session_max_files: int = Field(
        default=10_000, gt=0, description="Most files and directories in a session kept."
    )
    session_settle_s: float = Field(
        default=2.0,
        ge=0,
        description="Most seconds the teardown waits for a pack that records a turn after "
        "answering it (`launch.sessions.recorded_after_answer`) to write the last one.",
    )
    session_keep_s: float = Field(
        default=30 * 24 * 3600.0,
        ge=0,
        description="How long the reaper keeps a recorded session after it was last saved "
        "or resumed; 0 keeps them forever.",
    )
    results_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("acp-worker")) / "results",
        description="Where captured patches are written (results/<job>/<attempt>/).",
    )
    results_keep_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="How long the reaper keeps a job attempt's captured patch in results_dir "
        "after it was written; 0 keeps them forever.",
    )
    patch_inline_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        description="Files larger than this are listed in workspace.changed, not inlined in "
        "the patch (`omitted_reason` `too_large`).",
    )
    patch_max_bytes: int = Field(
        default=16 * 1024 * 1024,
        gt=0,
        description="Largest patch: a file whose diff would take it past this is listed, not "
        "inlined (`patch_full`).",
    )
    capture_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Time budget of change capture: files not diffed by then are listed, not "
        "inlined (`time_budget`), and a `patch_incomplete` notice says so.",
    )
    changed_paths_max: int = Field(
        default=500, description="Paths listed in workspace.changed (counts stay exact)."
    )
    git_allowed_schemes: tuple[str, ...] = Field(
        default=("https", "git"),
        description="Transports a git workspace may use (add `file` only for local tests). "
        "`ssh` is not in the default: git runs with an empty HOME, no key and strict host "
        "key checking, and there is no way yet to give it a key or known hosts.",
    )
    git_timeout_s: float = Field(default=600.0, description="Bound on each git step.")
    workspace_max_bytes: int = Field(
        default=4 * 1024**3, description="Largest fetched workspace (git or S3)."
    )
    local_workspace_roots: tuple[Path, ...] | None = Field(
        default=None,
        description="Host directories a `local` workspace must lie within (links resolved); "
        "unset: anywhere the worker can read (for `acp-worker run`). A service taking jobs "
        "it does not fully trust sets it, `[]` refusing every local workspace (the worker "
        "image does).",
    )
    workspace_max_depth: int = Field(
        default=256,
        ge=1,
        description="Most directory levels a workspace may nest; a deeper one is refused "
        "(`workspace_unavailable`) before it is staged.",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for workspaces and result bundles (default AWS)."
    )
    results_bucket: str | None = Field(
        default=None, description="Upload result bundles here when a job names none."
    )
    results_prefix: str = Field(default="acp-worker", description="Key prefix of bundles.")
    bundle_max_bytes: int = Field(default=1024**3, description="Largest result bundle.")
    keep_workspace_s: float = Field(
        default=3600.0, description="How long a workspace a job asked to keep is kept."
    )
    secrets_dir: Path | None = Field(
        default=None,
        description="Root that `file:` credential references resolve under (required for them).",
    )
    secret_sources: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("env", "file"),
        description="Credential reference schemes jobs may use, comma-separated (`env,file,"
        "aws-sm`): built-ins `env`, `file`, and installed `acp_worker.secret_sources` entry "
        "points; a job naming any other is refused (`credential_refused`, `unknown_source`).",
    )
    aws_sm_endpoint_url: str | None = Field(
        default=None, description="Endpoint of AWS Secrets Manager for `aws-sm:` (default AWS)."
    )
    aws_sm_region: str | None = Field(
        default=None, description="Region for `aws-sm:` (default: boto3's, e.g. AWS_REGION)."
    )
    workspace_disk: Literal["loop", "off"] = Field(
        default="loop",
        description="How `limits.disk_mb` is enforced: `loop` stages each workspace on its own "
        "loop-mounted ext4 of that size (needs root and /dev/loop-control; without them jobs "
        "fail with `sandbox_failed`); `off` enforces no bound (the workspace shares work_dir's "
        "filesystem) and says so in a `notice`.",
    )

    @field_validator("secret_sources", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    redis_url: str | None = Field(
        default=None,
        description="Redis for events and state: `redis://`, `rediss://` (TLS; redis-py's "
        "`ssl_*` query parameters are honoured) or `sentinel://h:p;sentinel://h:p/DB` with "
        "`redis_sentinel_master` (docs/durability.md, Connecting to Redis).",
    )
    redis_tls: bool = Field(
        default=False,
        description="Reach the master behind `sentinel://` URLs over TLS (`rediss://` always is).",
    )
    redis_tls_ca: Path | None = Field(
        default=None, description="CA bundle (PEM) that signs the Redis server's certificate."
    )
    redis_tls_cert: Path | None = Field(
        default=None, description="Client certificate (PEM) for a Redis that asks for one."
    )
    redis_tls_key: Path | None = Field(default=None, description="The client certificate's key.")
    redis_tls_verify: bool = Field(
        default=True,
        description="Check the Redis server's certificate and name; `false` turns both off "
        "(logged as a warning on every connection setup).",
    )
    redis_username: str | None = Field(
        default=None, description="ACL user for Redis (store and broker); the URL's wins."
    )
    redis_password: str | None = Field(
        default=None,
        description="The ACL user's password as a secret reference (`env:NAME`, `file:PATH`).",
    )
    redis_wait_replicas: int | None = Field(
        default=None,
        ge=0,
        description="Replicas that must acknowledge the writes a failover must not lose "
        "(lease acquire and renewal, a job's terminal event and settling) before the worker "
        "goes on (Redis `WAIT`); default 1 with `sentinel://`, else 0 (no wait).",
    )
    redis_wait_ms: int = Field(
        default=1000,
        gt=0,
        description="The bound of each such `WAIT` in ms: past it the worker goes on and logs "
        "how many replicas had acknowledged.",
    )
    redis_sentinel_master: str | None = Field(
        default=None, description="The master's name the sentinels of a `sentinel://` URL watch."
    )
    redis_sentinel_tls: bool = Field(
        default=False, description="Talk to the sentinels themselves over TLS (same files)."
    )
    redis_sentinel_username: str | None = Field(
        default=None, description="ACL user on the sentinels (their own AUTH)."
    )
    redis_sentinel_password: str | None = Field(
        default=None,
        description="The sentinels' password as a secret reference (`env:NAME`, `file:PATH`).",
    )
    worker_id: str = Field(default_factory=default_worker_id, description="Labels sandboxes.")
    backend: str = Field(
        default="local",
        description="Sandbox backend (`local`, `docker`, `kubernetes`); its own settings are "
        "its config in `worker.sandbox.config`, read from the same `ACPW_*` variables.",
    )
    acp_line_limit: int = Field(default=8 * 1024 * 1024, description="Max bytes of one ACP line.")
    acp_request_timeout: float = Field(
        default=60.0, description="Seconds to wait for an agent's reply to one request."
    )
    shutdown_eof_grace: float = Field(default=3.0, description="Seconds after stdin EOF.")
    shutdown_term_grace: float = Field(default=2.0, description="Seconds after SIGTERM.")
    cancel_grace: float = Field(
        default=10.0, description="Seconds to wait for `cancelled` after session/cancel."
    )
    stderr_buffer_bytes: int = Field(default=64 * 1024, description="Agent stderr kept.")
    events_maxlen: int = Field(default=10_000, description="Approximate MAXLEN of a stream.")
    event_max_bytes: int = Field(default=196 * 1024, description="Max UTF-8 size of one event.")
    tool_output_bytes: int = Field(default=16 * 1024, description="Tool output kept per event.")

    # --- job service (Celery intake, leases, reaper, metrics) ---
    broker_url: str | None = Field(default=None, description="Celery broker; default: `redis_url`.")
    result_backend: str | None = Field(
        default=None, description="Celery result backend; default: none (events carry results)."
    )
    queue: str = Field(default="runs", description="Celery queue of run jobs.")
    lease_ttl: float = Field(default=30.0, gt=0, description="Seconds a lease lives unrenewed.")
    lease_renew: float = Field(default=10.0, gt=0, description="Seconds between renewals.")
    drain_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="Seconds `serve` lets running jobs finish after SIGTERM before it hands "
        "them back (cancelled, queued again as a new attempt); size it below the pod's "
        "terminationGracePeriodSeconds (docs/operating.md, Draining a worker).",
    )
    events_ttl: int = Field(
        default=24 * 3600, gt=0, description="Seconds a job's keys live after it settled."
    )
    settled_ttl: int | None = Field(
        default=None,
        gt=0,
        description="Seconds a job's settlement record lives after it settled; never less "
        "than the broker's visibility timeout plus an hour (the default) nor `events_ttl`.",
    )
    sink_buffer_events: int = Field(
        default=10_000, gt=0, description="Events buffered in memory while Redis is away."
    )
    sink_retry_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds the sink (and a lease acquire, a budget read) retries Redis.",
    )
    reaper_interval: float = Field(default=15.0, gt=0, description="Seconds between reaps.")
    requeue_stranded_after_s: float = Field(
        default=120.0,
        ge=0,
        description="The reaper requeues a job queued (its message published) at least this "
        "long ago, without a lease, whose message two passes found neither in the broker's "
        "queue nor delivered (`unacked`): a failover lost it (docs/durability.md); "
        "0: never.",
    )
    reap_backends: tuple[str, ...] = Field(
        default=("local",),
        description="Backends the reaper sweeps for orphans (names as for `backend`).",
    )
    warm_pools: dict[str, int] = Field(
        default_factory=dict,
        description="Warm pools (JSON object, pack name -> slots per pool process): that "
        "many sandboxes per pack kept started, their agent spawned and `initialize` "
        "answered, for the next job of the same launch identity; `{}`: off "
        "(docs/architecture.md, Warm pools).",
    )
    warm_max_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a warm slot waits unclaimed before it is destroyed.",
    )

    @field_validator("warm_pools")
    @classmethod
    def _warm_pools(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {name: n for name, n in value.items() if n < 0 or n > MAX_WARM_SLOTS}
        if bad:
            raise ValueError(f"slots per pack must be 0..{MAX_WARM_SLOTS}: {sorted(bad)}")
        return {name: n for name, n in value.items() if n > 0}

    model_params_required: bool = Field(
        default=False,
        description="Jobs must name a model and every parameter the agent exposes for it "
        "(none left to the agent's catalog defaults, e.g. Cursor's `fast=true`); others are "
        "refused with `model_unavailable` (`reason`: `model_required`, `params_required`).",
    )
    budget_label: str = Field(
        default="tenant",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$",
        description="The job label naming the tenant whose spend budget a job counts "
        "against (`acp-worker budget`); a job without it counts against `default`.",
    )
    metrics_port: int | None = Field(
        default=None, description="Port of the Prometheus endpoint; none: no endpoint."
    )
    model_endpoints: dict[str, ModelEndpoint] = Field(
        default_factory=dict,
        description="Model endpoints by name (JSON): where packs' agents find their model API "
        "(a gateway, a self-hosted server); jobs pick among them (see docs/endpoints.md).",
    )

    @field_validator("model_endpoints")
    @classmethod
    def _endpoints(cls, value: dict[str, ModelEndpoint]) -> dict[str, ModelEndpoint]:
        return check_endpoints(value)

    @property
    def session_root(self) -> Path:
        """``session_dir``, or ``sessions`` next to ``work_dir`` (both in the state dir by
        default)."""
        if self.session_dir is not None:
            return self.session_dir
        return self.work_dir.parent / "sessions"


MAX_WARM_SLOTS = 16  # per pack and pool process

_PARSING = re.compile(r'error parsing value for field "(\w+)"')


def invalid_settings(exc: ValidationError | SettingsError) -> InvalidSettings:
    """The typed error of settings pydantic refused: which ``ACPW_*`` variable and why,
    in one line, never the value (pydantic's own text quotes it: a secret may be in it)."""
    problems: list[dict[str, str]] = []
    if isinstance(exc, ValidationError):
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            field, *inside = [str(part) for part in error["loc"]] or ["?"]
            reason = str(error["msg"]).removeprefix("Value error, ")
            if inside:
                reason = f"{'.'.join(inside)}: {reason}"
            problems.append({"variable": f"ACPW_{field.upper()}", "reason": reason})
    else:  # a value pydantic-settings could not even decode (JSON, for a list or a dict)
        match = _PARSING.search(str(exc))
        field = match.group(1) if match else "?"
        problems.append({"variable": f"ACPW_{field.upper()}", "reason": "not valid JSON"})
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return InvalidSettings(
        f"invalid setting {first['variable']}: {first['reason']}{more}", settings=problems
    )


def load_settings() -> Settings:
    """The worker's :class:`Settings` from the environment.

    Raises:
        InvalidSettings: a variable holds a value refused (named, never quoted).
    """
    try:
        return Settings()
    except (ValidationError, SettingsError) as exc:
        raise invalid_settings(exc) from None  # pydantic's text quotes the value
