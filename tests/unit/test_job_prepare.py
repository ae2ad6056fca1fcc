"""The job's preparation pieces that ``agents probe`` shares: the closure hold and the
sandbox labels."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.errors import SandboxError
from worker.job import prepare
from worker.packs.cache import lock_path, open_lock
from worker.sandbox.base import LABEL_ATTEMPT, LABEL_JOB, LABEL_TOKEN, LABEL_WORKER
from worker.settings import Settings
from worker.store.owner import LABEL_STORE

DIGEST = "ab" * 32


def _preparing(monkeypatch: pytest.MonkeyPatch, closure: Path, *, appears_at: int) -> list[int]:
    """``prepare_pack`` stubbed: the closure exists from call ``appears_at`` on (a gc
    removed it before the hold until then)."""
    calls: list[int] = []

    def prepare_pack(
        settings: Settings, declaration: Any, platform: str | None, *, sandbox_uids: Any = None
    ) -> Any:
        calls.append(len(calls) + 1)
        if len(calls) >= appears_at:
            closure.mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(closure=closure)

    monkeypatch.setattr(prepare, "prepare_pack", prepare_pack)
    return calls


def _gc_could_take(cache: Path) -> bool:
    fd = open_lock(lock_path(cache, DIGEST))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


async def test_a_closure_removed_before_the_hold_is_prepared_again_and_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closure = tmp_path / "closures" / DIGEST
    calls = _preparing(monkeypatch, closure, appears_at=2)
    settings = Settings(cache_dir=tmp_path)
    pack, hold = await prepare.hold_pack(settings, object(), platform=None)
    try:
        assert calls == [1, 2]
        assert pack.closure == closure
        assert not _gc_could_take(tmp_path)
    finally:
        os.close(hold)
    assert _gc_could_take(tmp_path)


async def test_a_closure_that_keeps_disappearing_fails_the_preparation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closure = tmp_path / "closures" / DIGEST
    calls = _preparing(monkeypatch, closure, appears_at=prepare.PACK_ATTEMPTS + 1)
    with pytest.raises(SandboxError, match="kept disappearing") as info:
        await prepare.hold_pack(Settings(cache_dir=tmp_path), object(), platform=None)
    assert info.value.details == {"closure": str(closure)}
    assert len(calls) == prepare.PACK_ATTEMPTS
    assert _gc_could_take(tmp_path)


@pytest.mark.parametrize(
    ("token", "stored"), [({}, False), ({LABEL_TOKEN: "0"}, False), ({LABEL_TOKEN: "7"}, True)]
)
def test_sandbox_labels_name_the_store_only_of_a_leased_job(
    token: dict[str, str], stored: bool
) -> None:
    settings = Settings(worker_id="w-1", redis_url="redis://127.0.0.1:6379/3")
    labels = prepare.sandbox_labels(settings, job_id="j", attempt=2, labels=token)
    assert labels[LABEL_JOB] == "j"
    assert labels[LABEL_ATTEMPT] == "2"
    assert labels[LABEL_TOKEN] == token.get(LABEL_TOKEN, "0")
    assert labels[LABEL_WORKER] == "w-1"
    assert (LABEL_STORE in labels) is stored


# -- the pack's files in HOME ----------------------------------------------------------------

_REPO_PACKS = Path(__file__).resolve().parents[2] / "provider_packs"


def _codex_config(endpoint_url: str | None, model: str | None) -> str:
    from worker.job.home import home_files
    from worker.packs.manifest import load_pack

    launch = load_pack(_REPO_PACKS, "codex-acp").manifest.launch
    return home_files(launch, endpoint_url, model)[".codex/config.toml"]


@pytest.mark.parametrize("endpoint_url", [None, "http://127.0.0.1:41000/v1"])
def test_codex_starts_on_the_job_s_model(endpoint_url: str | None) -> None:
    """codex reads its model from ``config.toml`` before the worker selects one: a resumed
    session (``session/load``) would start on codex's default and warn that the session
    was recorded with another model. The file names the job's model."""
    import tomllib

    config = tomllib.loads(_codex_config(endpoint_url, "gpt-5.5"))
    assert config["model"] == "gpt-5.5"
    assert config["features"] == {"plugins": False}  # the pack's own settings still there
    if endpoint_url is not None:
        assert config["model_provider"] == "acpw-endpoint"
        assert config["model_providers"]["acpw-endpoint"]["base_url"] == endpoint_url


@pytest.mark.parametrize(
    "model",
    [
        None,  # the job names none: the agent's default
        'gpt-5.5"\n[mcp_servers.x]\ncommand = "sh',  # free text: never written
        "gpt-5.6-luna[reasoning=high]",  # a variant id: not a model the file can name
    ],
)
def test_a_model_the_file_cannot_name_plainly_is_not_written(model: str | None) -> None:
    import tomllib

    config = tomllib.loads(_codex_config("http://127.0.0.1:41000/v1", model))
    assert "model" not in config
    assert "mcp_servers" not in config
