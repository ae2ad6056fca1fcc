"""Backend configs: typed per backend, built from the same ACPW_* variables as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from worker.errors import InvalidInput, SandboxError
from worker.sandbox import (
    BACKENDS,
    BackendConfig,
    DaytonaConfig,
    DockerConfig,
    FakeConfig,
    LocalConfig,
    backend_config,
    get_backend,
    registry,
)
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import LocalBackend
from worker.settings import Settings


def test_the_selectable_backends_leave_the_test_double_out() -> None:
    assert "fake" in registry.REGISTRY
    assert tuple(name for name in registry.REGISTRY if name != "fake") == BACKENDS
    assert BACKENDS[0] == "local"  # the default comes first in every listing


def test_each_backends_variables_still_set_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACPW_BWRAP", "/opt/bwrap")
    monkeypatch.setenv("ACPW_CGROUP_PARENT", "acpw-env")
    monkeypatch.setenv("ACPW_CGROUP_ROOT", "/sys/fs/cgroup/unified")
    monkeypatch.setenv("ACPW_SANDBOX_HOST_UID", "62000")
    monkeypatch.setenv("ACPW_DOCKER_HOST", "unix:///run/podman.sock")
    monkeypatch.setenv("ACPW_IMAGE_REGISTRY", "registry.example:5000")
    monkeypatch.setenv("ACPW_WORKER_ID", "w-env")
    local = backend_config(Settings())
    assert isinstance(local, LocalConfig)
    assert (local.bwrap, local.cgroup_parent) == ("/opt/bwrap", "acpw-env")
    assert (local.cgroup_root, local.sandbox_host_uid) == (Path("/sys/fs/cgroup/unified"), 62000)
    assert local.worker_id == "w-env"
    docker = backend_config(Settings(), "docker")
    assert isinstance(docker, DockerConfig)
    assert (docker.docker_host, docker.image_registry) == (
        "unix:///run/podman.sock",
        "registry.example:5000",
    )


def test_the_worker_gives_its_identity_and_cache(tmp_path: Path) -> None:
    settings = Settings(worker_id="w-7", cache_dir=tmp_path, backend="docker")
    config = backend_config(settings)
    assert isinstance(config, DockerConfig)
    assert (config.worker_id, config.cache_dir) == ("w-7", tmp_path)
    assert config.engine().images_dir == tmp_path / "images"


def test_the_backend_variable_picks_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACPW_BACKEND", "docker")
    assert isinstance(backend_config(Settings()), DockerConfig)
    monkeypatch.setenv("ACPW_TYPE", "docker")  # never a class's own discriminator
    assert backend_config(Settings(), "local").type == "local"


@pytest.mark.parametrize("name", ["fake", "gvisor", ""])
def test_an_unselectable_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="unknown sandbox backend") as info:
        backend_config(Settings(), name)
    assert info.value.details["available"] == list(BACKENDS)


def test_a_config_refuses_what_its_backend_does_not_read() -> None:
    with pytest.raises(ValidationError):
        LocalConfig(docker_host="tcp://x")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(bwrap="/opt/bwrap")  # type: ignore[call-arg]


def test_the_discriminator_picks_the_class() -> None:
    adapter: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)
    assert isinstance(adapter.validate_python({"type": "docker"}), DockerConfig)
    parsed = adapter.validate_python({"type": "local", "bwrap": "/x/bwrap"})
    assert isinstance(parsed, LocalConfig)
    assert parsed.bwrap == "/x/bwrap"
    with pytest.raises(ValidationError):
        adapter.validate_python({"type": "nope"})


def test_get_backend_builds_the_configured_backend() -> None:
    local = get_backend(LocalConfig(cgroup_parent="acpw-test", worker_id="w-1"))
    assert isinstance(local, LocalBackend)
    assert local.config.worker_id == "w-1"
    assert isinstance(get_backend(FakeConfig()), FakeBackend)


def test_a_backend_whose_module_is_missing_is_a_sandbox_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = registry.REGISTRY["fake"]
    missing = dataclasses.replace(entry, backend="acpw_no_such_sdk.backend:Backend")
    monkeypatch.setitem(registry.REGISTRY, "fake", missing)
    with pytest.raises(SandboxError) as info:
        get_backend(FakeConfig())
    assert info.value.details["missing"] == "acpw_no_such_sdk"
    assert "acp-worker[fake]" in info.value.message


def test_the_kubernetes_backend_is_built_from_its_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Built without a call to any cluster: the API client is made on first use."""
    from worker.sandbox.kubernetes.backend import KubernetesBackend

    monkeypatch.setenv("ACPW_K8S_NAMESPACE", "sandboxes-a")
    monkeypatch.setenv("ACPW_K8S_KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("ACPW_K8S_START_TIMEOUT_S", "30")
    config = backend_config(Settings(worker_id="w-k", cache_dir=tmp_path), "kubernetes")
    assert isinstance(config, KubernetesConfig)
    assert (config.k8s_namespace, config.k8s_kubeconfig) == ("sandboxes-a", tmp_path / "kubeconfig")
    assert (config.worker_id, config.cache_dir, config.k8s_start_timeout_s) == ("w-k", tmp_path, 30)
    backend = get_backend(config)
    assert isinstance(backend, KubernetesBackend)
    assert backend.name == "kubernetes"


def test_the_daytona_config_from_its_variables_and_the_key_kept_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = "dtn_unit_" + "9" * 24
    monkeypatch.setenv("ACPW_DAYTONA_API_KEY", key)
    monkeypatch.setenv("ACPW_DAYTONA_API_URL", "https://daytona.example/api")
    monkeypatch.setenv("ACPW_DAYTONA_TTL_MINUTES", "90")
    config = backend_config(Settings(worker_id="w-d", cache_dir=tmp_path), "daytona")
    assert isinstance(config, DaytonaConfig)
    assert (config.daytona_api_url, config.daytona_ttl_minutes) == (
        "https://daytona.example/api",
        90,
    )
    assert (config.worker_id, config.cache_dir) == ("w-d", tmp_path)
    assert config.api_key() == key
    for shown in (repr(config), str(config), config.model_dump_json()):
        assert key not in shown
    backend = get_backend(config)
    assert backend.name == "daytona"
    assert not backend.capabilities.runs_host_usr


def test_the_daytona_key_from_a_file_and_bad_values_refused(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("dtn_from_file\n")
    assert DaytonaConfig(daytona_api_key_file=tmp_path / "key").api_key() == "dtn_from_file"
    assert DaytonaConfig().api_key() is None
    with pytest.raises(ValidationError):
        DaytonaConfig(daytona_base_image_id="latest")
    with pytest.raises(ValidationError):
        DaytonaConfig(daytona_auto_stop_minutes=-1)
    adapter: TypeAdapter[BackendConfig] = TypeAdapter(BackendConfig)
    assert isinstance(adapter.validate_python({"type": "daytona"}), DaytonaConfig)
