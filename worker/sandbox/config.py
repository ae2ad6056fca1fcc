"""One typed config per sandbox backend, told apart by ``type``.

Each config carries the settings only its backend reads, out of the worker-wide
``Settings``. Each is also a pydantic-settings model with the worker's ``ACPW_`` prefix,
so the variables that set these values before (``ACPW_BWRAP``, ``ACPW_DOCKER_HOST``, …)
still do; ``type`` is never read from the environment (the backend's name picks the
class, see ``worker.sandbox.registry``). What every backend needs from the worker itself
(``worker_id``, which labels its sandboxes) is passed in by :meth:`from_settings`.

A new backend adds its config here with its own ``type`` literal, joins
:data:`BackendConfig`, and registers its name in ``worker.sandbox.registry``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from worker.images.engine import EngineConfig, host_apt_mirror
from worker.sandbox.k8s_values import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    Toleration,
    affinity,
    extra_annotations,
    extra_labels,
    object_names,
    selector_labels,
)
from worker.settings import Settings, default_cache_dir, default_worker_id, invalid_settings


class _EnvWithoutType(EnvSettingsSource):
    """The ``ACPW_*`` environment, minus ``type``: ``ACPW_TYPE`` must not pick a class."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name == "type":
            return None, field_name, False
        return super().get_field_value(field, field_name)


class _BackendSettings(BaseSettings):
    """Frozen, no unknown keyword, ``ACPW_`` variables for every field but ``type``."""

    model_config = SettingsConfigDict(env_prefix="ACPW_", extra="forbid", frozen=True)

    worker_id: str = Field(
        default_factory=default_worker_id,
        description="Labels this worker's sandboxes; the worker's own `worker_id`.",
    )
    sandbox_host_uid: int = Field(
        default=61000,
        ge=1,
        description=(
            "Host uid that owns what the sandbox writes when the worker is root (for "
            "`local`, the uid bubblewrap runs as: the sandbox's uid 1000 maps to it); "
            "unused when the worker is not root."
        ),
    )
    sandbox_host_gid: int = Field(
        default=61000,
        ge=1,
        description="Host gid that goes with sandbox_host_uid.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        del env_settings, dotenv_settings, file_secret_settings
        return (init_settings, _EnvWithoutType(settings_cls))

    @classmethod
    def _loaded(cls, **values: Any) -> Self:
        """``cls(**values)``, the rest from the ``ACPW_*`` environment.

        Raises:
            InvalidSettings: a variable holds a value refused (named, never quoted).
        """
        try:
            return cls(**values)
        except (ValidationError, SettingsError) as exc:
            raise invalid_settings(exc) from None  # pydantic's text quotes the value

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """This backend's config: the worker's identity from ``settings``, the rest from
        the ``ACPW_*`` environment (or defaults)."""
        return cls._loaded(worker_id=settings.worker_id)

    def host_owner(self) -> tuple[int, int]:
        """The host (uid, gid) that owns what the sandbox writes, and must own what is
        staged for it: ``sandbox_host_uid``/``gid`` when the worker is root, else the
        worker's own."""
        if os.geteuid() == 0:
            return self.sandbox_host_uid, self.sandbox_host_gid
        return os.getuid(), os.getgid()


class LocalConfig(_BackendSettings):
    """The bubblewrap backend (``local``), the embedded default."""

    type: Literal["local"] = "local"
    bwrap: str = Field(default="bwrap", description="bubblewrap executable.")
    cgroup_root: Path = Field(default=Path("/sys/fs/cgroup"), description="cgroupfs mount.")
    cgroup_parent: str = Field(default="acpw", description="Parent cgroup for sandboxes.")
    cgroup_favordynmods: bool = Field(
        default=False,
        description="A root worker remounts cgroup2 with favordynmods at its first sandbox.",
    )
    cgroup_prime: bool = Field(
        default=True,
        description=(
            "Without favordynmods, keep cgroup migrations cheap while a sandbox starts "
            "(the worker rewrites its own cgroup membership every 2 ms)."
        ),
    )


class DockerConfig(_BackendSettings):
    """The container backend (``docker``), on any Docker-API engine (Docker, Podman).

    Also what ``acp-worker image`` builds and resolves pack images with.
    """

    type: Literal["docker"] = "docker"
    docker_host: str | None = Field(
        default=None, description="Docker API URL for the docker backend (default DOCKER_HOST)."
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="The worker's pack cache: a closure under `cache_dir/closures` runs from "
        "its pack image; the worker's own `cache_dir`.",
    )
    images_dir: Path | None = Field(
        default=None, description="Base-image rootfs and image pins (default cache_dir/images)."
    )
    apt_mirror: str | None = Field(
        default=None, description="Where mmdebstrap fetches the base rootfs (default: the host's)."
    )
    image_suite: str = Field(default="bookworm", description="Debian suite of the base image.")
    image_registry: str | None = Field(default=None, description="Push pack images here.")

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls._loaded(worker_id=settings.worker_id, cache_dir=settings.cache_dir)

    def engine(self) -> EngineConfig:
        """The engine connection and image settings ``worker.images`` works with.

        Raises:
            SandboxError: no ``apt_mirror`` is set and this host's apt names none.
        """
        return EngineConfig(
            docker_host=self.docker_host,
            images_dir=self.images_dir or self.cache_dir / "images",
            apt_mirror=self.apt_mirror or host_apt_mirror(),
            suite=self.image_suite,
            registry=self.image_registry,
        )


class FakeConfig(_BackendSettings):
    """The test double (``fake``): plain host subprocesses, no isolation; never offered
    for selection by settings (see ``worker.sandbox.registry``)."""

    type: Literal["fake"] = "fake"


class DaytonaConfig(_BackendSettings):
    """The Daytona backend (``daytona``): a snapshot per pack image, a sandbox per job
    attempt, through the official SDK (docs/daytona.md). Its variables are
    ``ACPW_DAYTONA_*``; the API key is never logged (a ``SecretStr``)."""

    type: Literal["daytona"] = "daytona"
    daytona_api_url: str = Field(
        default="https://app.daytona.io/api", description="Daytona's API URL."
    )
    daytona_api_key: SecretStr | None = Field(
        default=None,
        description="The API key (`ACPW_DAYTONA_API_KEY`); or daytona_api_key_file.",
    )
    daytona_api_key_file: Path | None = Field(
        default=None,
        description="A file holding the API key (a mounted secret); read when the backend "
        "is built, used when daytona_api_key is unset.",
    )
    daytona_target: str | None = Field(
        default=None, description="Region of sandboxes and snapshots (default: the org's)."
    )
    daytona_image_registry: str | None = Field(
        default=None,
        description="The registry the pack images were pushed to (`acp-worker image build "
        "--push`): a snapshot is made from `<registry>/acpw-pack:<identity hex>`.",
    )
    daytona_base_image_id: str | None = Field(
        default=None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="The base image id the pushed pack images were built on: with the "
        "closure's digest it gives each pack image's identity.",
    )
    daytona_registry_username: str | None = Field(
        default=None,
        description="The user Daytona pulls the pack images from daytona_image_registry as "
        "(a private registry); with daytona_registry_password.",
    )
    daytona_registry_password: SecretStr | None = Field(
        default=None,
        description="That user's password or token (`ACPW_DAYTONA_REGISTRY_PASSWORD`); or "
        "daytona_registry_password_file.",
    )
    daytona_registry_password_file: Path | None = Field(
        default=None,
        description="A file holding it (a mounted secret), read when the variable is unset.",
    )
    daytona_os_user: str | None = Field(
        default=None, description="The sandbox's OS user (default: the snapshot's)."
    )
    daytona_auto_stop_minutes: int = Field(
        default=15, ge=0, description="Daytona stops a sandbox idle this long (0: never)."
    )
    daytona_auto_delete_minutes: int = Field(
        default=0, ge=-1, description="Deleted this long after it stops (0: at once, -1: never)."
    )
    daytona_ttl_minutes: int = Field(
        default=24 * 60,
        ge=0,
        description="Hard time to live since creation, whatever its state (0: none): the "
        "last line of cleanup behind the leases and the reaper.",
    )
    daytona_snapshot_timeout_s: float = Field(
        default=900.0, gt=0, description="A snapshot still pending after this fails."
    )
    daytona_snapshot_rebuilds: int = Field(
        default=2,
        ge=0,
        description="A snapshot whose build failed is deleted and built again this many "
        "times, with back-off, before snapshot_failed.",
    )
    daytona_snapshot_rebuild_backoff_s: float = Field(
        default=10.0,
        ge=0,
        description="The first rebuild's wait; each next one waits twice as long.",
    )
    daytona_start_timeout_s: float = Field(
        default=120.0, gt=0, description="A sandbox not started after this fails."
    )
    daytona_retry_attempts: int = Field(
        default=5, ge=1, description="Attempts of a call Daytona answers 429 or 5xx."
    )
    daytona_max_concurrent_calls: int = Field(
        default=16,
        ge=1,
        description="Most Daytona API calls in flight at once from this process for one "
        "organisation (API URL and key), however many jobs it runs.",
    )
    daytona_input_frame_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Most bytes of the agent's stdin sent in one input call.",
    )
    daytona_sync_max_bytes: int = Field(
        default=1024**3, ge=1, description="Most bytes of workspace brought back."
    )
    daytona_sync_max_entries: int = Field(
        default=200_000, ge=1, description="Most files and directories brought back."
    )
    daytona_activity_every_s: float = Field(
        default=30.0,
        gt=0,
        description="Least interval between two activity refreshes the lease heartbeat sends.",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="The worker's pack cache (a closure of it runs from its pack image).",
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls._loaded(worker_id=settings.worker_id, cache_dir=settings.cache_dir)

    def api_key(self) -> str | None:
        """The API key: the setting, else the file's first line; ``None`` when neither.

        Raises:
            OSError: the key file cannot be read.
        """
        if self.daytona_api_key is not None:
            return self.daytona_api_key.get_secret_value()
        if self.daytona_api_key_file is None:
            return None
        return self.daytona_api_key_file.read_text().strip() or None

    def registry_password(self) -> str | None:
        """The registry password: the setting, else the file's first line.

        Raises:
            OSError: the password file cannot be read.
        """
        if self.daytona_registry_password is not None:
            return self.daytona_registry_password.get_secret_value()
        if self.daytona_registry_password_file is None:
            return None
        return self.daytona_registry_password_file.read_text().strip() or None


class KubernetesConfig(_BackendSettings):
    """The Kubernetes backend (``kubernetes``): a pod per job attempt in one namespace.

    Its variables are ``ACPW_K8S_*`` (docs/kubernetes.md).
    """

    type: Literal["kubernetes"] = "kubernetes"
    k8s_namespace: str = Field(
        default="acp-sandboxes",
        pattern=DNS_LABEL,
        description="Namespace of the sandbox pods and of their NetworkPolicies.",
    )
    k8s_runtime_class_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="RuntimeClass of the sandbox pods (gVisor `gvisor`, Kata `kata`); none: "
        "the nodes' default runtime.",
    )
    k8s_image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent",
        description="Pull policy of the pack image; the image is named by digest, so "
        "`IfNotPresent` never runs other content than `Always` would.",
    )
    k8s_owner_pod_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="The worker's own pod (downward API `metadata.name`) when it runs in "
        "the cluster, in the sandbox namespace: sandbox pods get an ownerReference to it, "
        "so the garbage collector deletes them with it. Set with k8s_owner_pod_uid.",
    )
    k8s_owner_pod_uid: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        description="That pod's `metadata.uid` (downward API). Set with k8s_owner_pod_name.",
    )
    k8s_owner_pod_namespace: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        description="That pod's namespace (downward API `metadata.namespace`). Set with "
        "k8s_owner_pod_name; it must be k8s_namespace: an owner reference cannot cross "
        "namespaces (the garbage collector would delete the sandbox pod at once).",
    )
    k8s_node_selector: Annotated[dict[str, str], AfterValidator(selector_labels)] = Field(
        default_factory=dict,
        description="nodeSelector of the sandbox pods (JSON object): the nodes untrusted "
        "code may run on.",
    )
    k8s_tolerations: list[Toleration] = Field(
        default_factory=list,
        description="tolerations of the sandbox pods (JSON list, as a pod spec writes them): "
        "the taints of dedicated sandbox nodes.",
    )
    k8s_affinity: Annotated[dict[str, object] | None, AfterValidator(affinity)] = Field(
        default=None,
        description="affinity of the sandbox pods (JSON object: nodeAffinity, podAffinity, "
        "podAntiAffinity; the API server validates what is inside).",
    )
    k8s_priority_class_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="PriorityClass of the sandbox pods.",
    )
    k8s_image_pull_secrets: Annotated[list[str], AfterValidator(object_names)] = Field(
        default_factory=list,
        description="Names of Secrets in k8s_namespace the kubelet pulls the pack images "
        "with (JSON list).",
    )
    k8s_service_account_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN,
        max_length=253,
        description="ServiceAccount of the sandbox pods (for a node or mesh policy keyed "
        "on it); its token is never mounted (automountServiceAccountToken false).",
    )
    k8s_pod_labels: Annotated[dict[str, str], AfterValidator(extra_labels)] = Field(
        default_factory=dict,
        description="More labels of the sandbox pods (JSON object); not Kubernetes' "
        "(kubernetes.io, k8s.io) nor the backend's own (acpw.*).",
    )
    k8s_pod_annotations: Annotated[dict[str, str], AfterValidator(extra_annotations)] = Field(
        default_factory=dict,
        description="More annotations of the sandbox pods (JSON object); not Kubernetes' "
        "nor the backend's (acpw.io/), at most 64 KiB.",
    )
    k8s_disruption_annotations: bool = Field(
        default=True,
        description='Sandbox pods carry `karpenter.sh/do-not-disrupt: "true"` and '
        '`cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`: consolidation and '
        "scale-down do not evict a running job.",
    )
    k8s_network_policies: Literal["create", "external"] = Field(
        default="create",
        description="`create`: the backend creates the sandbox namespace's NetworkPolicies "
        "(its Role needs `create` on them); `external`: they are in place already (the "
        "chart renders them) and the backend creates none.",
    )
    k8s_ephemeral_storage_bytes: int = Field(
        default=10 * 1024**3,
        ge=16 * 1024**2,
        description="Workspace size (its emptyDir's sizeLimit and the container's "
        "ephemeral-storage) of a job that gives no disk limit.",
    )
    k8s_pids_limit_supported: bool = Field(
        default=False,
        description="The sandbox nodes' kubelet bounds the pids of each pod (`podPidsLimit`). "
        "A pod spec has no field for it, so the job's `limits.pids` is only recorded on the "
        "pod (annotation `acpw.io/pids-limit`); true says the node bounds it.",
    )

    k8s_kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig file of the cluster; none: in-cluster configuration when "
        "the worker runs in a pod (`KUBERNETES_SERVICE_HOST`), else `$KUBECONFIG` or "
        "`~/.kube/config`.",
    )
    k8s_start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a sandbox pod may take to run once scheduled, outside the "
        "waits for a node (k8s_unschedulable_timeout_s) and an image pull that fails "
        "(k8s_image_pull_timeout_s), and to be gone after its deletion.",
    )
    k8s_unschedulable_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a sandbox pod may stay `Unschedulable` (the scheduler finds "
        "no node: cluster-autoscaler or Karpenter may be adding one, which takes minutes) "
        "before the job fails `sandbox_unschedulable`.",
    )
    k8s_image_pull_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long the kubelet may fail to pull the pack image (`ErrImagePull`, "
        "`ImagePullBackOff`: it retries with back-off), counted from the first failure, "
        "before the job fails `image_pull_failed`.",
    )
    k8s_copy_out_max_bytes: int = Field(
        default=4 * 1024**3,
        ge=1024**2,
        description="The most bytes the copy-outs of this worker process (every job's "
        "workspace and session store, together) may spool on the worker's own disk at "
        "once; a copy-out that would pass it fails `worker_disk_exceeded` as the bytes "
        "arrive. Size it under the state volume's limit (the worker pod's emptyDir), so "
        "that the kubelet never evicts the worker pod and every job on it.",
    )
    k8s_active_deadline_s: int = Field(
        default=6 * 3600,
        ge=1,
        description="Cap on `activeDeadlineSeconds` of sandbox pods (the job's timeout "
        "plus a margin for setup and teardown): the kubelet stops a pod after it even if "
        "every worker is gone (a backstop behind the lease).",
    )
    k8s_proxy_address: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[0-9A-Za-z.:-]+$",
        description="Address (IP or DNS name) at which sandbox pods reach this worker's "
        "allowlist proxy: the worker pod's IP (downward API `status.podIP`) in a cluster. "
        "Network `allowlist` is refused without it.",
    )
    k8s_proxy_listen_host: str = Field(
        default="0.0.0.0",  # noqa: S104 - sandbox pods reach it from the pod network
        description="Where the worker listens for its sandbox pods' proxy connections "
        "(each must start with its job's token).",
    )
    k8s_proxy_port: int = Field(
        default=3129,
        ge=0,
        le=65535,
        description="TCP port of that listener (0: any free port, for tests: a "
        "NetworkPolicy needs a fixed one).",
    )
    k8s_proxy_pod_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the worker pods (the proxy's): set, the backend creates the "
        "NetworkPolicy letting `allowlist` sandbox pods reach them on k8s_proxy_port alone "
        "(`acpw-sandbox-proxy-only`); empty, that policy is the chart's or the operator's.",
    )
    k8s_proxy_namespace_labels: dict[str, str] | None = Field(
        default=None,
        description="Labels of the worker pods' namespace when it is not the sandbox "
        "namespace (that policy's namespaceSelector).",
    )
    k8s_exec_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Deadline of every short exec in a sandbox pod (its handshake, a "
        "file operation, a look-up, a signal, a view read): past it the exec is abandoned "
        "and its operation fails.",
    )
    k8s_copy_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Deadline of copying the workspace and the state mounts into or out "
        "of a sandbox pod (tar over exec).",
    )
    k8s_exec_ping_s: float = Field(
        default=5.0,
        gt=0,
        description="Period of the WebSocket pings on every exec stream, so that an idle "
        "agent's stream outlives a load balancer's idle cut-off (kubectl pings every 5 s).",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="The worker's pack cache: a closure under `cache_dir/closures` runs "
        "from its pack image (resolved on the docker backend's engine settings, "
        "`ACPW_DOCKER_HOST`…); the worker's own `cache_dir`.",
    )

    k8s_base_image_id: str | None = Field(
        default=None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="Id of the sandbox base image the pack images were built on (what "
        "`acp-worker image base` prints). Set: a pack image is found in the pin store "
        "(`images_dir/pins`, written by `acp-worker image build` with a registry) with no "
        "engine at all, and must have been pushed. Unset: it is resolved (or built) on "
        "the docker backend's engine.",
    )
    images_dir: Path | None = Field(
        default=None, description="Base-image rootfs and image pins (default cache_dir/images)."
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls._loaded(worker_id=settings.worker_id, cache_dir=settings.cache_dir)

    @model_validator(mode="after")
    def _owner_pod_whole(self) -> Self:
        owner = (self.k8s_owner_pod_name, self.k8s_owner_pod_uid, self.k8s_owner_pod_namespace)
        if any(part is None for part in owner) and any(part is not None for part in owner):
            msg = (
                "k8s_owner_pod_name, k8s_owner_pod_uid and k8s_owner_pod_namespace are set "
                "together or not at all"
            )
            raise ValueError(msg)
        if self.k8s_owner_pod_namespace not in (None, self.k8s_namespace):
            msg = (
                f"the owner pod's namespace {self.k8s_owner_pod_namespace!r} is not the sandbox "
                f"namespace {self.k8s_namespace!r}: an owner reference cannot cross namespaces "
                "(unset k8s_owner_pod_*, or run the worker in the sandbox namespace)"
            )
            raise ValueError(msg)
        return self


#: Every backend's config class: the one list of them (the registry's entries and the
#: discriminated union below are typed from it).
AnyBackendConfig = LocalConfig | DockerConfig | KubernetesConfig | DaytonaConfig | FakeConfig

BackendConfig = Annotated[AnyBackendConfig, Field(discriminator="type")]
"""Any backend's config; pydantic picks the class from ``type``."""
