"""The one error tree of acp-worker.

Every anticipated failure is a :class:`WorkerError` with a stable ``code`` string, a
human ``message`` and keyword-only context in ``details``. The same
``{code, message, details}`` triple goes into ``job.completed`` events and into the CLI's
``{"error": {...}}`` line, so a control plane can branch on ``code`` alone.

    WorkerError                      code                    exit
    ├── InvalidInput                 invalid_input            2
    │   ├── InvalidJobSpec           invalid_job_spec         2
    │   ├── PackNotFound             pack_not_found           2
    │   ├── WorkspaceUnavailable     workspace_unavailable    2
    │   ├── JobNotFound              job_not_found            2
    │   ├── JobConflict              job_conflict             2
    │   ├── InteractionNotFound      interaction_not_found    2
    │   ├── InteractionClosed        interaction_closed       2
    │   ├── InvalidAnswer            invalid_answer           2
    │   └── InvalidSettings          invalid_settings         2
    ├── LeaseRefusedError            lease_refused            2
    ├── Refused                      refused                  3
    │   ├── DigestMismatch           digest_mismatch          3
    │   ├── ArchiveRefused           archive_refused          3
    │   │   └── UnsupportedFormat    unsupported_format       3
    │   ├── PlatformUnsupported      platform_unsupported     3
    │   ├── CredentialRefused        credential_refused       3
    │   ├── AdmissionRefused         admission_refused        3
    │   ├── ModelUnavailable         model_unavailable        3
    │   │   └── ModeUnavailable      model_unavailable        3
    │   ├── EndpointRefused          endpoint_refused         3
    │   ├── ImageMismatch            image_mismatch           3
    │   ├── BudgetRefused            budget_exceeded          3
    │   ├── RuntimeUnavailable       runtime_unavailable      3
    │   ├── PackUnlocked             pack_unlocked            3
    │   ├── LaunchRefused            launch_refused           3
    │   ├── PromptRefused            prompt_refused           3
    │   ├── PathRefused              path_refused             3   (sandbox/files.py)
    │   └── OverBound                over_bound               3   (safetree/bounds.py)
    ├── SandboxError                 sandbox_failed           1
    │   ├── BackendAuthFailed        backend_auth_failed      1
    │   ├── BackendQuotaExceeded     backend_quota_exceeded   1
    │   ├── BackendRateLimited       backend_rate_limited     1
    │   ├── SnapshotFailed           snapshot_failed          1
    │   ├── SandboxStartTimeout      sandbox_start_timeout    1
    │   ├── ImagePullFailed          image_pull_failed        1
    │   ├── SandboxUnschedulable     sandbox_unschedulable    1
    │   ├── SandboxEvicted           sandbox_evicted          1
    │   ├── SandboxConnectionLost    sandbox_connection_lost  1
    │   ├── SandboxOomKilled         oom_killed               1
    │   ├── SandboxDeadlineExceeded  sandbox_deadline_exceeded 1
    │   ├── WorkerDiskExceeded       worker_disk_exceeded     1
    │   └── StageError               stage_failed             1   (sandbox/staging.py)
    ├── AgentError                   agent_error              1
    │   ├── AgentExited              agent_exited             1
    │   │   └── OomKilled            oom_killed               1
    │   ├── AuthRequired             auth_required            1
    │   ├── AgentTimeout             agent_timeout            1
    │   ├── SessionNotFound          session_not_found        1
    │   ├── Unsupported              unsupported              1
    │   ├── ExpectationUnmet         expectation_unmet        1
    │   └── ProtocolError            protocol_error           1
    │       └── LineTooLong          acp_line_too_long        1
    ├── BudgetExceeded               budget_exceeded          1
    ├── ResultUploadFailed           result_upload_failed     1
    ├── EventTooLarge                event_too_large          1
    ├── SinkUnavailable              sink_unavailable         1
    ├── ServiceUnavailable           service_unavailable      1
    │   └── StoreRefused             redis_refused            1
    ├── EventsTrimmed                events_trimmed           1
    ├── HandedBack                   handed_back              4
    ├── LeaseError                   lease_error              1
    ├── RpcError                     rpc_error                1   (rpc/connection.py)
    ├── RequestInvalid               request_invalid          1   (interactions/requests.py)
    ├── AnswerInvalid                answer_invalid           1   (interactions/answers.py)
    └── delegations.Refused          delegation_refused       1   (events/delegations.py)
        └── LeaseLost                lease_lost               1

Classes marked with a module are defined there (beside the code that raises them), and
derive from this tree all the same: a library user catches ``WorkerError`` alone
(``tests/unit/test_error_root.py`` keeps it so). Third-party exceptions (redis, OS errors
from bubblewrap) are translated at their seam with ``raise ... from exc``; nothing else
escapes the runner untyped.
"""

from __future__ import annotations

from typing import ClassVar

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_REFUSED = 3
EXIT_CANCELLED = 4
EXIT_TIMED_OUT = 5


class WorkerError(Exception):
    """Root of every anticipated failure; ``code`` is stable API."""

    code: ClassVar[str] = "worker_error"
    exit_code: ClassVar[int] = EXIT_FAILED

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = details

    def to_dict(self) -> dict[str, object]:
        """The ``{code, message, details}`` triple used in events and CLI errors."""
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.details:
            out["details"] = self.details
        return out


class InvalidInput(WorkerError):
    code = "invalid_input"
    exit_code = EXIT_INVALID


class InvalidJobSpec(InvalidInput):
    code = "invalid_job_spec"


class PackNotFound(InvalidInput):
    code = "pack_not_found"


class WorkspaceUnavailable(InvalidInput):
    code = "workspace_unavailable"


class JobNotFound(InvalidInput):
    """The control plane asked about a job id this Redis has no state for."""

    code = "job_not_found"


class JobConflict(InvalidInput):
    """A submit reused a job id whose job has another spec (``details``: ``job_id``,
    ``attempt``, ``status``, ``existing_digest``, ``submitted_digest``)."""

    code = "job_conflict"


class InteractionNotFound(InvalidInput):
    """An answer names an interaction the job never opened."""

    code = "interaction_not_found"


class InteractionClosed(InvalidInput):
    """An answer for an interaction that was already resolved (or a settled job)."""

    code = "interaction_closed"


class InvalidAnswer(InvalidInput):
    """An answer that does not fit its interaction; ``details.reason`` says why."""

    code = "invalid_answer"


class InvalidSettings(InvalidInput):
    """An ``ACPW_*`` variable holds a value the worker (or its sandbox backend) refuses:
    ``details.settings`` lists ``{variable, reason}``. A value is never quoted: one may
    hold a secret (a URL's user info, a key)."""

    code = "invalid_settings"


class Refused(WorkerError):
    code = "refused"
    exit_code = EXIT_REFUSED


class DigestMismatch(Refused):
    code = "digest_mismatch"


class ArchiveRefused(Refused):
    code = "archive_refused"


class UnsupportedFormat(ArchiveRefused):
    """An archive in a format that is not read (zip, xz, …): only tar and tar.gz are."""

    code = "unsupported_format"


class PlatformUnsupported(Refused):
    code = "platform_unsupported"


class RuntimeUnavailable(Refused):
    """This host lacks what a pack's launch needs outside its closure (``launch.runtime``):
    ``details`` ``runtime``, ``required``, ``path``, ``found``, ``reason``."""

    code = "runtime_unavailable"


class PackUnlocked(Refused):
    """The pack is a recipe whose pins were never filled (``platforms`` is empty): its
    bytes are unknown, so nothing of it runs. ``details``: ``pack``, ``platform``,
    ``command`` (the one command that locks it, on a machine with internet)."""

    code = "pack_unlocked"


class LaunchRefused(Refused):
    """The pack's launch breaks its dialect's launch contract (``worker.packs.contract``):
    a flag that widens what the agent may do (``--force``, ``--yolo``, ``--trust``, …),
    an endpoint or credential the operator did not bind, or a private setting missing.
    ``details``: ``pack``, ``dialect``, ``flag`` or ``variable``, ``reason``."""

    code = "launch_refused"


class CredentialRefused(Refused):
    code = "credential_refused"


class AdmissionRefused(Refused):
    code = "admission_refused"


class ModelUnavailable(Refused):
    code = "model_unavailable"


class ModeUnavailable(ModelUnavailable):
    """The job's ``mode`` is not among the modes the agent offered in its session
    (``details``: ``mode``, ``available``). Same code as a model or config option the
    agent does not offer: what the job asked of the session cannot be had."""


class EndpointRefused(Refused):
    """The job names a model endpoint the operator did not declare for its pack, or its
    pack cannot be pointed at one."""

    code = "endpoint_refused"


class ImageMismatch(Refused):
    """The engine's image for a pack is not the one pinned (id, labels or layers differ)."""

    code = "image_mismatch"


class PromptRefused(Refused):
    """A prompt block the worker will not send: a linked workspace file that is missing,
    not a regular file, or reached through a link (``details``: ``block``, ``path``,
    ``reason``)."""

    code = "prompt_refused"


class BudgetRefused(Refused):
    """The tenant's budget is spent: the job is refused before anything starts."""

    code = "budget_exceeded"


class SandboxError(WorkerError):
    code = "sandbox_failed"


class BackendAuthFailed(SandboxError):
    """A remote sandbox service (Daytona) refused the worker's credentials (401/403)."""

    code = "backend_auth_failed"


class BackendQuotaExceeded(SandboxError):
    """A remote sandbox service refused for the account's quota (CPU, memory, disk,
    sandbox count)."""

    code = "backend_quota_exceeded"


class BackendRateLimited(SandboxError):
    """A remote sandbox service kept answering 429 after every retry allowed."""

    code = "backend_rate_limited"


class SnapshotFailed(SandboxError):
    """A remote snapshot of a pack image failed to build, stayed pending past its bound,
    or is not the pack image it is named for (``details``: ``snapshot``, ``reason``)."""

    code = "snapshot_failed"


class SandboxStartTimeout(SandboxError):
    """A remote sandbox did not reach ``started`` (a pod ``Running``) within its bound."""

    code = "sandbox_start_timeout"


class ImagePullFailed(SandboxError):
    """The cluster cannot have the sandbox's image (``details.reason``: the kubelet's,
    ``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``, ``ErrImageNeverPull``)."""

    code = "image_pull_failed"


class SandboxUnschedulable(SandboxError):
    """No node can run the sandbox (its requests, the nodes' taints or selectors)."""

    code = "sandbox_unschedulable"


class SandboxEvicted(SandboxError):
    """The node evicted the sandbox (its pressure: memory, disk, pids)."""

    code = "sandbox_evicted"


class SandboxConnectionLost(SandboxError):
    """The stream to a program in the sandbox ended without its exit status (the
    connection broke: a load balancer's idle cut-off, an API server restart) and the
    sandbox itself was intact: what the program did is unknown."""

    code = "sandbox_connection_lost"


class SandboxOomKilled(SandboxError):
    """The sandbox as a whole ran out of memory (not one agent process of it:
    :class:`OomKilled`); ``details.memory_limit`` is its bound."""

    code = "oom_killed"


class SandboxDeadlineExceeded(SandboxError):
    """The sandbox outlived its hard deadline (a pod's ``activeDeadlineSeconds``: the
    job's timeout plus the setup and teardown margin) and was stopped."""

    code = "sandbox_deadline_exceeded"


class WorkerDiskExceeded(SandboxError):
    """What a sandbox sends back (its workspace, its session store) would pass the disk
    the worker may give it (``ACPW_K8S_COPY_OUT_MAX_BYTES``): refused as the bytes
    arrive, before the worker's own volume fills."""

    code = "worker_disk_exceeded"


class AgentError(WorkerError):
    code = "agent_error"


class AgentExited(AgentError):
    """The agent ended (its connection closed) before the job was done with it.

    ``details`` carry its ``exit_code`` or ``signal`` when its sandbox could tell.
    """

    code = "agent_exited"


class OomKilled(AgentExited):
    """The kernel's OOM killer ended the agent: its sandbox hit ``limits.memory_mb``."""

    code = "oom_killed"


class AuthRequired(AgentError):
    code = "auth_required"


class AgentTimeout(AgentError):
    code = "agent_timeout"


class SessionNotFound(AgentError):
    """The agent does not know the session the job asked to resume."""

    code = "session_not_found"


class Unsupported(AgentError):
    """The agent answered method-not-found for an optional method (fork, resume, load),
    or does not advertise a capability the job needs (``details.capability``, e.g.
    ``promptCapabilities.image``)."""

    code = "unsupported"


class ExpectationUnmet(AgentError):
    """The agent ended its turn without what the job's ``expect`` names (tool calls,
    workspace changes, files written); ``details.unmet`` lists which."""

    code = "expectation_unmet"


class ProtocolError(AgentError):
    code = "protocol_error"


class LineTooLong(ProtocolError):
    code = "acp_line_too_long"


class BudgetExceeded(WorkerError):
    """The attempt's reported cost went over its tenant's budget (``per_job`` or
    ``limit``) mid-turn: the turn was cancelled."""

    code = "budget_exceeded"


class ResultUploadFailed(WorkerError):
    code = "result_upload_failed"


class EventTooLarge(WorkerError):
    code = "event_too_large"


class SinkUnavailable(WorkerError):
    code = "sink_unavailable"


class ServiceUnavailable(WorkerError):
    """Redis or the Celery broker did not answer (control-plane side)."""

    code = "service_unavailable"


class StoreRefused(ServiceUnavailable):
    """Redis answered but refused the connection: its TLS certificate is not trusted or
    does not name the host (``reason``: ``certificate_unverified``,
    ``server_name_mismatch``, ``tls_failed``), or its ACL refused the user
    (``auth_failed``, ``not_permitted``). Retrying does not help; the configuration must
    change."""

    code = "redis_refused"


class EventsTrimmed(WorkerError):
    """Events a reader has not seen were trimmed off the job's bounded stream.

    ``details``: ``job_id``; ``after``, the reader's cursor (``0-0`` from the start);
    ``trimmed_until``, the id of the last event removed (resuming after it reads on from
    the oldest kept); ``first_available``, that oldest event's id.
    """

    code = "events_trimmed"


class HandedBack(WorkerError):
    """A draining worker stopped the attempt and queued the job again as the next attempt:
    the error of the handed-back attempt's ``job.completed`` (status ``cancelled``), not
    an outcome of the job. ``details``: ``next_attempt``, ``worker_id``, ``drain_grace_s``.
    """

    code = "handed_back"
    exit_code = EXIT_CANCELLED


class LeaseError(WorkerError):
    code = "lease_error"


class LeaseLost(LeaseError):
    """Another owner holds the job now: this worker must not write anything more."""

    code = "lease_lost"
