"""Redis over TLS with an ACL user, as operators run it: a real ``redis-server`` (Debian's,
built with TLS) on a loopback port with a CA, server and client certificates made here,
and the least-privilege user docs/durability.md gives operators (read from that page, so
the page and the test cannot disagree). Jobs run end to end through it (``run --redis``
and a served job), a wrong CA and a wrong server name are refused with ``redis_refused``,
and the password shows nowhere."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.test_run_job import _check_stream, _env, _events, _job, run_cli
from tests.redis_servers import Certs, Server, make_certs, start_redis
from worker.metrics import readiness
from worker.settings import Settings

pytestmark = pytest.mark.integration

PASSWORD = "acl-pw-9b27f3e1c5"
ACP_WORKER = str(Path(sys.executable).with_name("acp-worker"))


def operators_acl() -> str:
    """The ``user acpw ...`` line of docs/durability.md's operator's ACL."""
    text = (REPO / "docs" / "durability.md").read_text()
    section = text.split("### An operator's ACL", 1)[1]
    line = re.search(r"^user acpw .*$", section, re.MULTILINE)
    assert line is not None
    return line.group(0).removeprefix("user ").replace(">PASSWORD", f">{PASSWORD}")


@pytest.fixture(scope="module")
def tls_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="acpw-tls-") as where:
        yield Path(where)


@pytest.fixture(scope="module")
def certs(tls_dir: Path) -> Certs:
    return make_certs(tls_dir / "certs")


@pytest.fixture(scope="module")
def server(tls_dir: Path, certs: Certs) -> Iterator[Server]:
    running = start_redis(tls_dir / "redis", certs=certs, users=[operators_acl()])
    yield running
    running.stop()


@pytest.fixture
def clean(server: Server, certs: Certs) -> Iterator[Server]:
    admin = server.admin(certs)
    admin.flushall()
    admin.execute_command("ACL", "LOG", "RESET")
    yield server
    admin.close()


def _acl_denials(server: Server, certs: Certs) -> list[Any]:
    admin = server.admin(certs)
    try:
        return list(admin.execute_command("ACL", "LOG"))
    finally:
        admin.close()


def _user_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return _env(
        tmp_path,
        ACPW_REDIS_USERNAME="acpw",
        ACPW_REDIS_PASSWORD="env:ACPW_TEST_REDIS_PW",
        ACPW_TEST_REDIS_PW=PASSWORD,
        **extra,
    )


def test_run_redis_over_tls_with_the_operators_acl(
    tmp_path: Path, clean: Server, certs: Certs
) -> None:
    """redis-py's own query parameters in a rediss:// URL, the ACL user from settings."""
    job = _job(tmp_path, "scenario: hello")
    url = f"rediss://localhost:{clean.port}/0?ssl_ca_certs={certs.ca}"
    out = run_cli(
        tmp_path, "run", str(job), "--json", "--quiet", "--redis", url, env=_user_env(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    events = _events(out.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    admin = clean.admin(certs)
    try:
        stored = [
            json.loads(f[b"event"])
            for _, f in admin.xrange(f"acpw:{{{events[0]['job_id']}}}:events")
        ]
    finally:
        admin.close()
    assert stored == events
    assert _acl_denials(clean, certs) == []
    assert PASSWORD not in out.stdout + out.stderr


def _cli(env: dict[str, str], *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ACP_WORKER, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_served_job_over_tls_with_the_operators_acl(
    tmp_path: Path, clean: Server, certs: Certs
) -> None:
    """Store and broker over TLS (CA and client certificate from the settings), the
    operator's ACL user, the reaper running: submit --follow, status, cancel, ready."""
    env = _user_env(
        tmp_path,
        ACPW_REDIS_URL=f"rediss://localhost:{clean.port}/0",
        ACPW_BROKER_URL=f"rediss://localhost:{clean.port}/1",
        ACPW_REDIS_TLS_CA=str(certs.ca),
        ACPW_REDIS_TLS_CERT=str(certs.client_cert),
        ACPW_REDIS_TLS_KEY=str(certs.client_key),
        ACPW_SECRETS_DIR=str(REPO / "examples" / "secrets"),
        ACPW_LEASE_TTL="3",
        ACPW_LEASE_RENEW="1",
        ACPW_REAPER_INTERVAL="1",
    )
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        serve = subprocess.Popen(
            [ACP_WORKER, "serve", "--concurrency", "1", "--loglevel", "INFO"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while " ready." not in log.read_text():
            assert serve.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        follow = _cli(env, "submit", "examples/hello.json", "--follow", "--json")
        assert follow.returncode == 0, follow.stderr
        lines = [json.loads(line) for line in follow.stdout.splitlines()]
        events = [line["event"] for line in lines[1:]]
        assert [e["data"]["status"] for e in events if e["type"] == "job.completed"] == [
            "succeeded"
        ]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        status = _cli(env, "status", "hello-0001", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["status"] == "succeeded"
        cancel = _cli(env, "cancel", "hello-0001", "--json")
        assert cancel.returncode == 0, cancel.stderr
        ready = _cli(env, "ready", "--json")
        report = json.loads(ready.stdout)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        assert report["redis"] == "ok"
        assert report["redis_at"] == {
            "url": f"rediss://localhost:{clean.port}/0",
            "tls": True,
            "verify": True,
            "username": "acpw",
        }
        time.sleep(2)  # a few reaper passes and broker polls under the ACL user
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
    assert _acl_denials(clean, certs) == []
    outputs = [follow.stdout, follow.stderr, status.stdout, ready.stdout, ready.stderr]
    assert not [text for text in [*outputs, log.read_text()] if PASSWORD in text]


def _error(stderr: str) -> dict[str, Any]:
    """The CLI's ``{"error": ...}`` line (``--json``: the last line on stderr)."""
    error: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])["error"]
    return error


@pytest.mark.parametrize(
    ("host", "ca", "reason"),
    [
        ("localhost", "other_ca", "certificate_unverified"),
        ("127.0.0.1", "ca", "server_name_mismatch"),  # the certificate names localhost only
    ],
)
def test_a_wrong_ca_or_server_name_is_refused(
    tmp_path: Path, clean: Server, certs: Certs, host: str, ca: str, reason: str
) -> None:
    url = f"rediss://acpw:{PASSWORD}@{host}:{clean.port}/0"  # credentials in the URL
    env = _user_env(tmp_path, ACPW_REDIS_TLS_CA=str(getattr(certs, ca)))
    status = _cli(env, "status", "some-job", "--json", "--redis", url)
    assert status.returncode == 1
    error = _error(status.stderr)
    assert (error["code"], error["details"]["reason"]) == ("redis_refused", reason)
    assert PASSWORD not in status.stdout + status.stderr
    settings = Settings(redis_tls_ca=getattr(certs, ca))
    report = readiness(url, lambda: None, settings)
    assert report["redis"] == f"error: redis_refused ({reason})"
    assert not report["ready"]
    assert report["redis_at"]["url"] == f"rediss://acpw:***@{host}:{clean.port}/0"
    assert PASSWORD not in json.dumps(report)


def test_run_redis_refuses_an_unverified_server(
    tmp_path: Path, clean: Server, certs: Certs
) -> None:
    url = f"rediss://localhost:{clean.port}/0?ssl_ca_certs={certs.other_ca}"
    job = _job(tmp_path, "scenario: hello")
    run = run_cli(
        tmp_path, "run", str(job), "--json", "--quiet", "--redis", url, env=_user_env(tmp_path)
    )
    assert run.returncode == 1
    assert _error(run.stderr)["details"]["reason"] == "certificate_unverified"


def test_turning_verification_off_is_explicit_and_logged(
    tmp_path: Path, clean: Server, certs: Certs
) -> None:
    """A wrong name and an untrusted CA (both refused above) pass only when told so."""
    url = f"rediss://127.0.0.1:{clean.port}/0"
    env = _user_env(tmp_path, ACPW_REDIS_TLS_CA=str(certs.other_ca), ACPW_REDIS_TLS_VERIFY="false")
    unverified = _cli(env, "status", "some-job", "--json", "--redis", url)
    assert unverified.returncode == 2  # it reached Redis: the job is not there
    assert _error(unverified.stderr)["code"] == "job_not_found"
    assert "Redis TLS verification is OFF" in unverified.stderr
