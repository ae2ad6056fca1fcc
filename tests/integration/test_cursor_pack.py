"""The real Cursor pack recipe (``provider_packs/cursor``), locked and run offline: its
archive is the emulator packaged as Cursor's download (``cursor_vendor``), served over
HTTPS on loopback by a server a test CA certified.

- the recipe as committed is unlocked: a job naming it is refused ``pack_unlocked``
  (exit 3) with the command that locks it;
- ``pack lock cursor`` (the recipe's URL) and ``pack lock cursor --url URL`` download,
  hash and inventory the archive, fill the pins and the lock, and a hello job through the
  worker then completes with that pack, its argv and environment the recipe's;
- a copy whose argv carries ``--yolo`` is refused ``launch_refused`` at ``pack lock``
  (before anything is downloaded) and, when the flag is added after locking, at launch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cursor_vendor import VERSION, TlsServer, tls_server, vendor_archive
from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job
from worker.packs.closure import read_lock
from worker.packs.names import current_platform
from worker.packs.sources import archive_path

ARCHIVE_PATH = "/lab/2026.09.26-emulator/linux/x64/agent-cli-package.tar.gz"
PLATFORM = current_platform()


@pytest.fixture(scope="module")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsServer, bytes]]:
    archive = vendor_archive()
    with tls_server(tmp_path_factory.mktemp("tls")) as server:
        server.server.files[ARCHIVE_PATH] = archive
        yield server, archive


def _packs(tmp_path: Path, url: str | None = None) -> Path:
    """A packs folder holding a copy of the repository's cursor recipe (its download
    pointed at *url* for this host's platform, when given)."""
    packs = tmp_path / "packs"
    shutil.copytree(REPO / "provider_packs" / "cursor", packs / "cursor")
    if url is not None:
        path = packs / "cursor" / "pack.json"
        data = json.loads(path.read_text())
        data["download"] = {PLATFORM: {"kind": "https", "url": url}}
        path.write_text(json.dumps(data, indent=2) + "\n")
    return packs


def _cli(
    tmp_path: Path, packs: Path, ca: Path | None, *args: str
) -> subprocess.CompletedProcess[str]:
    extra = {"ACPW_PACKS_DIR": str(packs)}
    if ca is not None:
        extra["SSL_CERT_FILE"] = str(ca)
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path, **extra), cwd=REPO,
    )  # fmt: skip


def _error(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    lines += [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    errors = [line["error"] for line in lines if "error" in line]
    if not errors:  # `run` ends its stream with the job's completion instead
        errors = [e["data"]["error"] for e in lines if e.get("type") == "job.completed"]
    assert errors, (result.stdout, result.stderr)
    return errors[-1]


def _run_hello(tmp_path: Path, packs: Path) -> subprocess.CompletedProcess[str]:
    job = _job(tmp_path, "scenario: hello", pack={"name": "cursor"})
    return _cli(tmp_path, packs, None, "run", str(job), "--json", "--quiet")


def test_the_committed_recipe_is_refused_unlocked_with_the_lock_command(tmp_path: Path) -> None:
    result = _run_hello(tmp_path, REPO / "provider_packs")
    assert result.returncode == 3, result.stderr
    error = _error(result)
    assert error["code"] == "pack_unlocked"
    recipe = json.loads((REPO / "provider_packs" / "cursor" / "pack.json").read_text())
    url = recipe["download"]["linux-x64"]["url"]
    assert url.startswith("https://downloads.cursor.com/")
    if PLATFORM == "linux-x64":
        assert f"acp-worker pack lock cursor --url {url}" in error["message"]
    assert error["details"]["command"] in error["message"]


def test_lock_from_the_recipes_url_then_a_hello_job_completes(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, archive = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    locked = _cli(tmp_path, packs, server.ca_file, "pack", "lock", "cursor", "--json")
    assert locked.returncode == 0, locked.stderr
    result = json.loads(locked.stdout)
    sha = hashlib.sha256(archive).hexdigest()
    assert (result["archive_sha256"], result["archive_size"]) == (sha, len(archive))
    assert result["source"] == server.url(ARCHIVE_PATH)
    pin = json.loads((packs / "cursor" / "pack.json").read_text())["platforms"][PLATFORM]
    assert pin["archive"] == {
        "source": {"kind": "https", "url": server.url(ARCHIVE_PATH)},
        "sha256": sha, "size": len(archive), "format": "tar.gz",
    }  # fmt: skip
    lock = read_lock(packs / "cursor" / "lock" / f"{PLATFORM}.json")
    assert lock.closure_digest == pin["closure"]["digest"] == result["closure_digest"]
    assert {"dist-package/node", "dist-package/index.js", "dist-package/cursor-agent"} <= {
        f.path for f in lock.files
    }
    # the download landed in the cache under its digest: the job fetches nothing more
    assert archive_path(tmp_path / "cache", sha).read_bytes() == archive
    hits = dict(server.server.hits)

    done = _run_hello(tmp_path, packs)
    assert done.returncode == 0, done.stderr
    events = _events(done.stdout)
    assert _check_stream(events)["status"] == "succeeded"
    ready = next(e["data"] for e in events if e["type"] == "pack.ready")
    assert (ready["name"], ready["closure_digest"]) == ("cursor", lock.closure_digest)
    text = "".join(
        e["data"]["text"] for e in events
        if e["type"] == "message.delta" and e["data"]["role"] == "assistant"
    )  # fmt: skip
    assert "Hello" in text
    assert server.server.hits == hits


def test_lock_with_an_explicit_url_needs_no_download_entry(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, archive = vendor
    packs = _packs(tmp_path)
    url = server.url(ARCHIVE_PATH)
    args = ("pack", "lock", "cursor", "--url", url, "--platform", PLATFORM, "--json")
    locked = _cli(tmp_path, packs, server.ca_file, *args)
    assert locked.returncode == 0, locked.stderr
    assert json.loads(locked.stdout)["archive_sha256"] == hashlib.sha256(archive).hexdigest()
    verified = _cli(tmp_path, packs, None, "pack", "verify", "cursor", "--json")
    assert verified.returncode == 0, verified.stderr
    lock = read_lock(packs / "cursor" / "lock" / f"{PLATFORM}.json")
    assert json.loads(verified.stdout)["files"] == len(lock.files)


def test_an_untrusted_certificate_is_refused(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, _ = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    result = _cli(tmp_path, packs, None, "pack", "lock", "cursor", "--json")
    assert result.returncode == 3
    assert "CERTIFICATE_VERIFY_FAILED" in _error(result)["message"]
    assert "platforms" not in json.loads((packs / "cursor" / "pack.json").read_text())


def _add_yolo(packs: Path) -> None:
    path = packs / "cursor" / "pack.json"
    data = json.loads(path.read_text())
    data["launch"]["argv"].insert(2, "--yolo")
    path.write_text(json.dumps(data, indent=2) + "\n")


def test_a_yolo_pack_is_refused_at_lock_before_any_download(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, _ = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    _add_yolo(packs)
    before = server.server.hits.get(ARCHIVE_PATH, 0)
    result = _cli(tmp_path, packs, server.ca_file, "pack", "lock", "cursor", "--json")
    assert result.returncode == 3
    error = _error(result)
    assert (error["code"], error["details"]["flag"]) == ("launch_refused", "--yolo")
    assert server.server.hits.get(ARCHIVE_PATH, 0) == before
    assert not (packs / "cursor" / "lock").exists()


def test_a_yolo_flag_added_after_locking_is_refused_at_launch(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, _ = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    locked = _cli(tmp_path, packs, server.ca_file, "pack", "lock", "cursor", "--json")
    assert locked.returncode == 0, locked.stderr
    _add_yolo(packs)
    result = _run_hello(tmp_path, packs)
    assert result.returncode == 3, result.stderr
    error = _error(result)
    assert (error["code"], error["details"]["flag"]) == ("launch_refused", "--yolo")
    types = [e["type"] for e in _events(result.stdout)]
    assert "sandbox.ready" not in types  # refused before anything started


QUALIFY = REPO / "scripts" / "qualify-cursor.sh"


def test_qualify_without_a_key_says_it_skipped_and_records_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in _env(tmp_path).items() if k != "CURSOR_API_KEY"}
    env["CURSOR_QUALIFY_OUT"] = str(tmp_path / "out.json")
    done = subprocess.run([str(QUALIFY)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "SKIPPED" in done.stdout
    assert "CURSOR_API_KEY is not set" in done.stdout
    assert not (tmp_path / "out.json").exists()


def test_qualify_records_agent_version_from_the_locked_pack(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, _ = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    locked = _cli(tmp_path, packs, server.ca_file, "pack", "lock", "cursor", "--json")
    assert locked.returncode == 0, locked.stderr
    out = tmp_path / "out.json"
    env = _env(tmp_path, ACPW_PACKS_DIR=str(packs), CURSOR_QUALIFY_OUT=str(out))
    env["CURSOR_API_KEY"] = "qualify-fake-key"  # the emulator takes any key
    # Only the version: the emulator cannot do the real turns (it echoes prompts).
    done = subprocess.run(
        [str(QUALIFY), "-k", "agent_version"], capture_output=True, text=True, env=env,
        timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["agent_version"] == VERSION
    assert results["closure_digest"] == json.loads(locked.stdout)["closure_digest"]
    assert results["pack"] == "cursor"


def test_a_download_over_max_bytes_is_refused_and_leaves_nothing(
    tmp_path: Path, vendor: tuple[TlsServer, bytes]
) -> None:
    server, archive = vendor
    packs = _packs(tmp_path, server.url(ARCHIVE_PATH))
    args = ("pack", "lock", "cursor", "--max-bytes", str(len(archive) - 1), "--json")
    result = _cli(tmp_path, packs, server.ca_file, *args)
    assert result.returncode == 3
    assert _error(result)["code"] == "archive_refused"
    assert list((tmp_path / "cache" / "archives").iterdir()) == []
    assert "platforms" not in json.loads((packs / "cursor" / "pack.json").read_text())


@pytest.mark.parametrize("url", ["http://example.com/a.tar.gz", "ftp://example.com/a.tar.gz"])
def test_lock_refuses_a_url_that_is_not_https(tmp_path: Path, url: str) -> None:
    args = ("pack", "lock", "cursor", "--url", url, "--json")
    result = _cli(tmp_path, _packs(tmp_path), None, *args)
    assert result.returncode == 2
    assert _error(result)["code"] == "invalid_input"
