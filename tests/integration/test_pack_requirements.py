"""``launch.runtime`` checked against real binaries, and a job and a probe refused by it.

The host's real ``/usr/bin/node`` is read as is; an old, broken or missing Node.js is
played by small shell scripts named ``node`` (no Node 18 exists on this machine, and the
check only runs ``<node> --version``). The refusals run ``acp-worker run`` and ``acp-worker
agents probe`` against a copy of the emulator pack that declares ``node >=99``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_run_job import REPO, _check_stream, _env, _events, _job, run_cli
from tests.unit.test_packs import _manifest
from worker.errors import RuntimeUnavailable
from worker.packs.manifest import Pack, parse_manifest
from worker.packs.requirements import check_runtime, host_node
from worker.sandbox.docker import DockerBackend
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import LocalBackend

ON_HOST_USR = LocalBackend.capabilities.runs_host_usr  # this machine runs local sandboxes

pytestmark = pytest.mark.integration


def _pack(tmp_path: Path, node: str, runtime: str = ">=20") -> Pack:
    launch = {**_manifest()["launch"], "argv": [node, "{pack}/index.js"]}
    data = _manifest(launch={**launch, "runtime": {"node": runtime}})
    return Pack(parse_manifest(data, path="pack.json"), tmp_path)


def _fake_node(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "node"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_hosts_node_is_read() -> None:
    said = subprocess.run(["/usr/bin/node", "--version"], capture_output=True, text=True)
    found = host_node("/usr/bin/node")
    assert found.version is not None
    assert "v" + ".".join(map(str, found.version)) == said.stdout.strip()
    npm_pack = Pack(parse_manifest(_pack_json("gemini-cli"), path="p"), REPO)
    check_runtime(npm_pack, host_usr=ON_HOST_USR)  # this machine runs the conformance suite


def _pack_json(name: str) -> Any:
    return json.loads((REPO / "provider_packs" / name / "pack.json").read_text())


@pytest.mark.parametrize(
    ("body", "reason", "found"),
    [
        ("echo v18.19.0", "too_old", "18.19.0"),
        ("echo v20.0.0-nightly", "unreadable", None),
        ("echo 'node: cannot open shared object file' >&2; exit 127", "unreadable", None),
    ],
)
def test_an_unfit_node_refuses(tmp_path: Path, body: str, reason: str, found: str) -> None:
    node = _fake_node(tmp_path, body)
    with pytest.raises(RuntimeUnavailable) as info:
        check_runtime(_pack(tmp_path, str(node)), host_usr=ON_HOST_USR)
    details = info.value.details
    assert (details["reason"], details["found"]) == (reason, found)
    assert (details["required"], details["path"]) == (">=20", str(node))
    assert info.value.message.startswith(f"pack cursor-emulator needs Node.js >=20 at {node}: ")


def test_a_missing_node_refuses(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="there is none on this worker") as info:
        check_runtime(
            _pack(tmp_path, str(tmp_path / "no" / "node")),
            host_usr=ON_HOST_USR,
        )
    assert info.value.details["reason"] == "missing"


def test_a_fit_node_passes_and_is_asked_once(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    node = _fake_node(tmp_path, f"echo run >> {calls}; echo v22.3.1")
    pack = _pack(tmp_path, str(node), ">=22.3")
    check_runtime(pack, host_usr=ON_HOST_USR)
    check_runtime(pack, host_usr=FakeBackend.capabilities.runs_host_usr)
    assert calls.read_text().count("run") == 1  # cached while the binary is the same
    node.write_text(node.read_text().replace("v22.3.1", "v22.2.9"))  # "upgraded" node
    with pytest.raises(RuntimeUnavailable, match=r"it is 22\.2\.9"):
        check_runtime(pack, host_usr=ON_HOST_USR)
    assert calls.read_text().count("run") == 2


def test_node_runs_with_an_empty_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NODE_OPTIONS=--require … would make a real node load a script: it never gets there.
    monkeypatch.setenv("NODE_OPTIONS", "--require /tmp/evil.js")
    seen = tmp_path / "env"
    node = _fake_node(tmp_path, f"env > {seen}; echo v20.1.0")
    check_runtime(_pack(tmp_path, str(node)), host_usr=ON_HOST_USR)
    assert "NODE_OPTIONS" not in seen.read_text()


def test_only_backends_on_the_hosts_usr_check(tmp_path: Path) -> None:
    pack = _pack(tmp_path, str(tmp_path / "no" / "node"))
    check_runtime(pack, host_usr=DockerBackend.capabilities.runs_host_usr)  # its image has node
    plain = Pack(parse_manifest(_manifest(), path="p"), tmp_path)
    check_runtime(plain, host_usr=ON_HOST_USR)  # nothing declared, nothing checked


def _packs_needing_node_99(tmp_path: Path) -> Path:
    packs = tmp_path / "packs"
    source = REPO / "provider_packs" / "cursor-emulator"
    shutil.copytree(source, packs / "cursor-emulator", ignore=shutil.ignore_patterns("src"))
    path = packs / "cursor-emulator" / "pack.json"
    data = json.loads(path.read_text())
    data["launch"]["runtime"] = {"node": ">=99"}  # argv[0] is python3: node from PATH
    path.write_text(json.dumps(data))
    return packs


def test_a_job_is_refused_before_anything_starts(tmp_path: Path) -> None:
    env = _env(tmp_path, ACPW_PACKS_DIR=str(_packs_needing_node_99(tmp_path)))
    result = run_cli(tmp_path, "run", str(_job(tmp_path, "hello")), "--json", "--quiet", env=env)
    assert result.returncode == 3, result.stderr
    events = _events(result.stdout)
    done = _check_stream(events)
    types = [e["type"] for e in events]
    assert types == ["job.accepted", "job.started", "usage.reported", "job.completed"]
    assert done["status"] == "failed"
    assert done["error"]["code"] == "runtime_unavailable"
    assert done["error"]["message"].startswith("pack cursor-emulator needs Node.js >=99 at ")
    assert done["error"]["details"]["reason"] == "too_old"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_probe_is_refused_too(tmp_path: Path) -> None:
    env = _env(tmp_path, ACPW_PACKS_DIR=str(_packs_needing_node_99(tmp_path)))
    result = run_cli(tmp_path, "agents", "probe", "cursor-emulator", "--json", env=env)
    assert result.returncode == 3
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "runtime_unavailable"
    assert error["details"]["required"] == ">=99"
    assert os.path.basename(error["details"]["path"]) == "node"
