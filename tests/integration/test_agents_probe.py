"""``acp-worker agents probe`` against the Cursor emulator in a real bubblewrap sandbox.

The emulator opens a session only with ``CURSOR_API_KEY``: without one the probe shows the
refusal, with ``--credential CURSOR_API_KEY=<reference>`` it shows the modes and models,
and the key's value is nowhere in what the probe prints.

The probe prepares with the job's own phases: its pack closure is held against a
pack-cache gc while the agent runs, and admission runs again in the sandbox's view right
before the agent is spawned (a config that appeared after staging refuses the probe).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_run_job import _env, run_cli
from worker.admission.result import AdmissionResult
from worker.cli.agents import run_probe
from worker.errors import AdmissionRefused
from worker.packs.gc import gc
from worker.packs.runtime import load_declaration
from worker.sandbox.base import (
    LABEL_JOB,
    Sandbox,
    SandboxBackend,
    SandboxInfo,
    SandboxProcess,
    SandboxSpec,
)
from worker.sandbox.config import LocalConfig
from worker.sandbox.local import LocalBackend
from worker.settings import Settings

pytestmark = pytest.mark.integration
SECRET = "probe-secret-3f9a1c77e2"
REPO = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(tmp_path, "agents", "probe", "cursor-emulator", *args, env=_env(tmp_path, **env))


def test_without_a_credential_the_session_is_refused(tmp_path: Path) -> None:
    result = _probe(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["credentials"] == []
    assert "authenticate" not in report
    assert report["session"]["opened"] is False
    assert report["session"]["error"]["code"] == "auth_required"


@pytest.mark.parametrize(
    ("ref", "env"),
    [
        ("env:PROBE_KEY", {"PROBE_KEY": SECRET}),
        ("file:cursor-key", {"ACPW_SECRETS_DIR": "secrets"}),
    ],
)
def test_a_bound_credential_opens_the_session(
    tmp_path: Path, ref: str, env: dict[str, str]
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "cursor-key").write_text(SECRET + "\n")
    env = {k: str(tmp_path / v) if k == "ACPW_SECRETS_DIR" else v for k, v in env.items()}
    as_json = _probe(tmp_path, "--credential", f"CURSOR_API_KEY={ref}", "--json", **env)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["credentials"] == ["CURSOR_API_KEY"]
    session = report["session"]
    assert session["opened"] is True
    assert [m["id"] for m in session["modes"]["availableModes"]] == ["agent", "plan", "ask"]
    assert session["models"]["availableModels"]
    assert any(o["category"] == "model" for o in session["configOptions"])

    text = _probe(tmp_path, "--credential", f"CURSOR_API_KEY={ref}", **env)
    assert text.returncode == 0, text.stderr
    assert "session   opened with the bound credentials" in text.stdout
    assert "\nmodes     agent, plan, ask\n" in text.stdout
    assert "\nmodels    " in text.stdout
    for result in (as_json, text):
        assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("arg", "code", "exit_code"),
    [
        (SECRET, "invalid_input", 2),  # the secret itself, not NAME=REF
        (f"CURSOR_API_KEY={SECRET}", "credential_refused", 3),  # the secret as a reference
        ("OPENAI_API_KEY=env:PROBE_KEY", "credential_refused", 3),  # not the pack's
        ("CURSOR_API_KEY=env:PROBE_UNSET", "credential_refused", 3),  # does not resolve
        ("CURSOR_API_KEY=aws-sm:some/secret", "credential_refused", 3),  # source not enabled
    ],
)
def test_a_credential_that_cannot_bind_refuses_the_probe(
    tmp_path: Path, arg: str, code: str, exit_code: int
) -> None:
    result = _probe(tmp_path, "--credential", arg, "--json", PROBE_KEY=SECRET)
    assert result.returncode == exit_code, result.stderr
    assert json.loads(result.stderr)["error"]["code"] == code
    assert result.stdout == ""  # nothing was started
    assert SECRET not in result.stderr


# --- the job's preparation ---------------------------------------------------------------


class _Watched:
    """The real backend behind the seam, watched: the admission asked for, and what a
    pack-cache gc (ignoring mounts) would do with the closure when the agent is spawned.
    With ``plant``, a symlink replaces a masked config file once the sandbox exists:
    after staging, before launch."""

    def __init__(self, inner: SandboxBackend, cache: Path, *, plant: bool = False) -> None:
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.seen: list[tuple[str, str]] = []
        self.created: list[SandboxSpec] = []
        self._inner = inner
        self._cache = cache
        self._plant = plant

    def stage_owner(self) -> tuple[int, int]:
        return self._inner.stage_owner()

    async def create(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await self._inner.create(spec)
        self.created.append(spec)
        if self._plant:
            hooks = spec.workspace / ".cursor" / "hooks.json"
            hooks.parent.mkdir(exist_ok=True)
            hooks.unlink(missing_ok=True)
            hooks.symlink_to("/etc/passwd")
        return _WatchedSandbox(sandbox, self)

    async def destroy(self, sandbox_id: str) -> None:
        await self._inner.destroy(sandbox_id)

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        return await self._inner.list(labels)

    def gc_would(self, closure: Path) -> str:
        result = gc(self._cache, 0, dry_run=True, mounted=lambda _path: False)
        return next(d.action for d in result.decisions if d.entry.path == closure)


class _WatchedSandbox:
    def __init__(self, inner: Sandbox, backend: _Watched) -> None:
        self._inner = inner
        self._backend = backend

    @property
    def sandbox_id(self) -> str:
        return self._inner.sandbox_id

    @property
    def spec(self) -> SandboxSpec:
        return self._inner.spec

    def admission_view(self, *, provider: str) -> AdmissionResult | None:
        self._backend.seen.append(("admission", provider))
        return self._inner.admission_view(provider=provider)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = "/workspace",
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> SandboxProcess:
        self._backend.seen.append(("spawn", self._backend.gc_would(self.spec.pack_closure)))
        return await self._inner.spawn(argv, env=env, cwd=cwd, stdout_limit=stdout_limit)


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        work_dir=tmp_path / "work",
        secrets_dir=tmp_path / "secrets",
        packs_dir=REPO / "provider_packs",
        worker_id="w-probe",
        shutdown_eof_grace=1,
    )


async def _run(tmp_path: Path, backend: _Watched) -> dict[str, Any]:
    settings = _settings(tmp_path)
    pack = load_declaration(settings, "cursor-emulator")
    return await run_probe(pack, settings, backend, platform=None, session=True, credentials={})


async def test_the_probe_holds_its_closure_and_is_admitted_in_the_sandbox_view(
    tmp_path: Path,
) -> None:
    backend = _Watched(
        LocalBackend(LocalConfig.from_settings(_settings(tmp_path))), tmp_path / "cache"
    )
    report = await _run(tmp_path, backend)
    assert report["protocol_version"] == 1
    # Admission in the sandbox's view came first; at the spawn, a gc had to keep the
    # closure (locked), as it does for a job's.
    assert backend.seen == [("admission", "cursor"), ("spawn", "kept")]
    closure = backend.created[0].pack_closure
    assert backend.gc_would(closure) == "would_remove"  # the hold ended with the probe
    assert backend.created[0].labels[LABEL_JOB].startswith("probe-")
    assert list((tmp_path / "work").iterdir()) == []


async def test_a_config_that_appeared_before_launch_refuses_the_probe(tmp_path: Path) -> None:
    backend = _Watched(
        LocalBackend(LocalConfig.from_settings(_settings(tmp_path))), tmp_path / "cache", plant=True
    )
    with pytest.raises(AdmissionRefused) as info:
        await _run(tmp_path, backend)
    findings = info.value.details["findings"]
    assert [(f["path"], f["rule"]) for f in findings] == [(".cursor/hooks.json", "config.symlink")]
    assert backend.seen == [("admission", "cursor")]  # the agent was never spawned
    job_id = backend.created[0].labels[LABEL_JOB]
    assert await backend.list({LABEL_JOB: job_id}) == []
    assert list((tmp_path / "work").iterdir()) == []
    closure = backend.created[0].pack_closure
    assert backend.gc_would(closure) == "would_remove"
