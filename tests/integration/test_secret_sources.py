"""Pluggable secret sources for real: entry-point discovery from installed metadata, and
``aws-sm:`` against moto's Secrets Manager on loopback, down to a whole ``acp-worker run``
whose agent key comes from it and is found nowhere in what the run wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import S3_ENV
from worker.credentials.redact import MASK, Redactor
from worker.credentials.resolve import resolve_credentials, secret_sources
from worker.credentials.sources import SecretRegistry, SourceContext
from worker.errors import CredentialRefused
from worker.settings import Settings
from worker.store import keys

REPO = Path(__file__).resolve().parents[2]
ALLOWED = ["CURSOR_API_KEY", "CURSOR_AUTH_TOKEN"]


@pytest.fixture
def sm(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 Secrets Manager client on the moto server (same server as the S3 tests)."""
    import boto3

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    return boto3.client("secretsmanager", endpoint_url=s3_endpoint)


def _name() -> str:
    return f"acpw/test/{uuid.uuid4().hex[:12]}"


def _resolve(refs: dict[str, str], endpoint: str) -> tuple[dict[str, str], Redactor]:
    settings = Settings(secret_sources=("env", "aws-sm"), aws_sm_endpoint_url=endpoint)
    redactor = Redactor()
    sources = secret_sources(settings, dict(os.environ))
    return resolve_credentials(refs, allowed=ALLOWED, sources=sources, redactor=redactor), redactor


def _refusal(ref: str, endpoint: str) -> CredentialRefused:
    with pytest.raises(CredentialRefused) as info:
        _resolve({"CURSOR_API_KEY": ref}, endpoint)
    return info.value


# --- aws-sm against moto --------------------------------------------------------------


def test_plain_and_json_key_secrets_resolve(sm: Any, s3_endpoint: str) -> None:
    plain, doc = _name(), _name()
    sm.create_secret(Name=plain, SecretString="plain-secret-7a1c")
    sm.create_secret(Name=doc, SecretString=json.dumps({"api_key": "json-secret-93be", "n": 1}))
    arn = sm.describe_secret(SecretId=doc)["ARN"]
    refs = {"CURSOR_API_KEY": f"aws-sm:{plain}", "CURSOR_AUTH_TOKEN": f"aws-sm:{arn}#api_key"}
    values, redactor = _resolve(refs, s3_endpoint)
    assert values == {
        "CURSOR_API_KEY": "plain-secret-7a1c",
        "CURSOR_AUTH_TOKEN": "json-secret-93be",
    }
    assert redactor.scrub("plain-secret-7a1c json-secret-93be") == f"{MASK} {MASK}"


def test_a_changed_secret_is_read_fresh_per_job(sm: Any, s3_endpoint: str) -> None:
    name = _name()
    sm.create_secret(Name=name, SecretString="first-value-0001")
    assert _resolve({"CURSOR_API_KEY": f"aws-sm:{name}"}, s3_endpoint)[0]["CURSOR_API_KEY"] == (
        "first-value-0001"
    )
    sm.put_secret_value(SecretId=name, SecretString="second-value-0002")
    assert _resolve({"CURSOR_API_KEY": f"aws-sm:{name}"}, s3_endpoint)[0]["CURSOR_API_KEY"] == (
        "second-value-0002"
    )


def test_refusals_name_a_reason_and_never_the_value(sm: Any, s3_endpoint: str) -> None:
    doc, binary, big, deleted = _name(), _name(), _name(), _name()
    sm.create_secret(Name=doc, SecretString=json.dumps({"k": "doc-value-55aa", "n": 42}))
    sm.create_secret(Name=binary, SecretBinary=b"bin-value-66bb")
    sm.create_secret(Name=big, SecretString="big-value-77cc" * 5000)  # > 64 KiB
    sm.create_secret(Name=deleted, SecretString="gone-value-88dd")
    sm.delete_secret(SecretId=deleted)  # scheduled for deletion: a stale binding
    cases = {
        f"aws-sm:{_name()}": "not_found",
        f"aws-sm:{doc}#missing": "missing_key",
        f"aws-sm:{doc}#n": "not_a_string",
        f"aws-sm:{binary}": "not_a_string",
        f"aws-sm:{big}": "too_large",
        f"aws-sm:{deleted}": "unresolved",
        "aws-sm:bad id with spaces": "bad_reference",
    }
    for ref, reason in cases.items():
        refusal = _refusal(ref, s3_endpoint)
        said = json.dumps(refusal.to_dict())
        assert refusal.details["reason"] == reason, (ref, said)
        for value in ("doc-value-55aa", "bin-value-66bb", "big-value-77cc", "gone-value-88dd"):
            assert value not in said


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_endpoint_down_is_source_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    start = time.monotonic()
    refusal = _refusal("aws-sm:prod/cursor", f"http://127.0.0.1:{_closed_port()}")
    assert refusal.details["reason"] == "source_unavailable"
    assert "3 attempts" in refusal.message
    assert time.monotonic() - start < 10  # bounded: three quick attempts, short backoff


@pytest.fixture
def slammer() -> Iterator[tuple[str, list[int]]]:
    """An endpoint that accepts each connection and closes it at once (a flaky service)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    stop.set()
    thread.join()
    server.close()


def test_transient_failures_are_retried_a_bounded_number_of_times(
    slammer: tuple[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    endpoint, accepted = slammer
    refusal = _refusal("aws-sm:prod/cursor", endpoint)
    assert refusal.details["reason"] == "source_unavailable"
    assert len(accepted) == 3  # botocore's own retries are off: exactly our three attempts


def test_no_region_is_source_unavailable_not_a_crash(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    refusal = _refusal("aws-sm:prod/cursor", s3_endpoint)
    assert refusal.details["reason"] == "source_unavailable"
    assert "NoRegionError" in refusal.message


# --- entry-point discovery from installed metadata -------------------------------------

PLUGIN = """
class MemorySource:
    scheme = "memsecret"

    def __init__(self, context):
        self.environ = context.environ

    def resolve(self, where, *, name):
        return self.environ["MEMSECRET_" + where]
"""


def _install_plugin(root: Path, entry_points: str) -> None:
    """A distribution as pip would install it: a module and its .dist-info."""
    (root / "acpw_memsecret.py").write_text(PLUGIN)
    info = root / "acpw_memsecret-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acpw-memsecret\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_an_installed_entry_point_is_discovered_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_plugin(
        tmp_path,
        "[acp_worker.secret_sources]\n"
        "memsecret = acpw_memsecret:MemorySource\n"
        "env = acpw_memsecret:MemorySource\n"  # may not take over a shipped scheme
        "Bad_Name = acpw_memsecret:MemorySource\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = SecretRegistry({"env": lambda context: None})  # type: ignore[arg-type,return-value]
    assert registry.discover() == ("memsecret",)
    assert "acpw_memsecret" not in sys.modules  # loaded on first use, not at discovery
    context = SourceContext(settings=Settings(), environ={"MEMSECRET_k1": "plugin-value-1234"})
    sources = registry.for_job(context, ("memsecret",))
    redactor = Redactor()
    values = resolve_credentials(
        {"CURSOR_API_KEY": "memsecret:k1"}, allowed=ALLOWED, sources=sources, redactor=redactor
    )
    assert values == {"CURSOR_API_KEY": "plugin-value-1234"}
    with pytest.raises(CredentialRefused) as info:  # its KeyError names the key: not echoed
        sources.resolve("CURSOR_API_KEY", "memsecret:absent")
    assert info.value.details["reason"] == "source_failed"
    sys.modules.pop("acpw_memsecret", None)


# --- a whole run: the agent's key comes from aws-sm ------------------------------------

SECRET = "aws-sm-run-secret-2b7e91"


def _run(tmp_path: Path, endpoint: str, *, enabled: str, redis_url: str) -> Any:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "README.md").write_text("# hello\n")
    script = (
        "#!scenario\nexec echo key=$CURSOR_API_KEY\n"
        "exec sh -c 'echo err=$CURSOR_API_KEY >&2'\nsay {{exitCode}} done\n"
    )
    name = _name()
    job = {
        "v": 1,
        "job_id": f"sm-{uuid.uuid4().hex[:10]}",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "ws"},
        "prompt": script,
        "credentials": {"CURSOR_API_KEY": f"aws-sm:{name}#cursor"},
        "limits": {"timeout_s": 30, "memory_mb": 512, "pids": 128, "disk_mb": 64},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACPW_", "AWS_"))}
    env.update(S3_ENV)
    env.update(
        ACPW_CACHE_DIR=str(tmp_path / "cache"),
        ACPW_WORK_DIR=str(tmp_path / "work"),
        ACPW_RESULTS_DIR=str(tmp_path / "results"),
        ACPW_SHUTDOWN_EOF_GRACE="1",
        ACPW_SECRET_SOURCES=enabled,
        ACPW_AWS_SM_ENDPOINT_URL=endpoint,
    )
    return name, job["job_id"], env


def test_a_run_whose_key_comes_from_aws_sm_leaks_it_nowhere(
    sm: Any, s3_endpoint: str, tmp_path: Path, redis_url: str
) -> None:
    name, job_id, env = _run(tmp_path, s3_endpoint, enabled="env,file,aws-sm", redis_url=redis_url)
    sm.create_secret(Name=name, SecretString=json.dumps({"cursor": SECRET, "other": "x"}))
    events_out = tmp_path / "events.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"), "--json",
         "--events-out", str(events_out), "--redis", redis_url],
        capture_output=True, text=True, timeout=90, env=env, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[-1]["data"]["status"] == "succeeded"
    stored = redis.Redis.from_url(redis_url).xrange(keys.events(job_id))
    stream = "".join(f[b"event"].decode() for _, f in stored)
    outputs = result.stdout + result.stderr + events_out.read_text() + stream
    assert "key=[REDACTED]" in outputs  # the agent had it, and every output was scrubbed
    assert "err=[REDACTED]" in outputs
    assert SECRET not in outputs


def test_a_run_naming_a_disabled_source_is_refused_before_anything_starts(
    sm: Any, s3_endpoint: str, tmp_path: Path, redis_url: str
) -> None:
    name, _, env = _run(tmp_path, s3_endpoint, enabled="env,file", redis_url=redis_url)
    sm.create_secret(Name=name, SecretString=json.dumps({"cursor": SECRET}))
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", str(tmp_path / "job.json"), "--json"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    error = events[-1]["data"]["error"]
    assert error["code"] == "credential_refused"
    assert error["details"]["reason"] == "unknown_source"
    assert "sandbox.ready" not in [e["type"] for e in events]
    assert not (tmp_path / "cache").exists()  # not even the pack was prepared
