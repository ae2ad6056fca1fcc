"""``launch.runtime`` in a pack manifest: what it accepts and what it means (no I/O)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_packs import _manifest
from worker.errors import InvalidInput, Refused, RuntimeUnavailable
from worker.packs.manifest import parse_manifest
from worker.packs.requirements import node_binary
from worker.sandbox.docker import DockerBackend
from worker.sandbox.fake import FakeBackend
from worker.sandbox.local import LocalBackend

REPO = Path(__file__).resolve().parents[2]
NODE_ARGV = ["/usr/bin/node", "{pack}/node_modules/agent/index.js"]


def _launch(**overrides: Any) -> dict[str, Any]:
    return {**_manifest()["launch"], **overrides}


def test_runtime_is_optional_and_dumps_as_written() -> None:
    plain = parse_manifest(_manifest(), path="p")
    assert plain.launch.runtime is None
    assert "runtime" not in plain.launch.model_dump(by_alias=True)

    data = _manifest(launch=_launch(argv=NODE_ARGV, runtime={"node": ">=20"}))
    manifest = parse_manifest(data, path="p")
    assert manifest.launch.runtime is not None
    assert manifest.launch.runtime.node_minimum == (20, 0, 0)
    assert manifest.model_dump(by_alias=True)["launch"] == data["launch"]


@pytest.mark.parametrize(
    ("spec", "minimum"),
    [
        (">=20", (20, 0, 0)),
        (">=20.11", (20, 11, 0)),
        (">=18.19.1", (18, 19, 1)),
        (">=0", (0, 0, 0)),
    ],
)
def test_node_minimum(spec: str, minimum: tuple[int, int, int]) -> None:
    data = _manifest(launch=_launch(argv=NODE_ARGV, runtime={"node": spec}))
    runtime = parse_manifest(data, path="p").launch.runtime
    assert runtime is not None
    assert runtime.node_minimum == minimum


@pytest.mark.parametrize(
    "runtime",
    [
        {"node": "20"},  # only a minimum, spelled >=
        {"node": "^20"},
        {"node": ">=20.x"},
        {"node": ">= 20"},
        {"node": ">=20.1.2.3"},
        {"node": ">=020"},
        {"node": ">=20 <22"},
        {},  # node is what a runtime is
        {"node": ">=20", "python": ">=3.11"},  # no other runtime is known
        {"node": 20},
    ],
)
def test_runtime_refuses_what_it_cannot_check(runtime: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_manifest(_manifest(launch=_launch(argv=NODE_ARGV, runtime=runtime)), path="p")
    assert info.value.details["field"].startswith("launch.runtime")


@pytest.mark.parametrize("first", ["{pack}/bin/node", "node_modules/.bin/node", "node"])
def test_node_from_the_closure_is_never_a_checked_runtime(first: str) -> None:
    # Checking would run pack code on the host; the closure's digest pins it anyway.
    data = _manifest(launch=_launch(argv=[first, "x.js"], runtime={"node": ">=20"}))
    with pytest.raises(InvalidInput, match="host path such as /usr/bin/node"):
        parse_manifest(data, path="p")


def test_which_node_is_checked() -> None:
    assert node_binary("/usr/bin/node") == "/usr/bin/node"
    assert node_binary("/opt/node-20/bin/nodejs") == "/opt/node-20/bin/nodejs"
    # A launch through something else (a shell, python) finds node on the sandbox PATH.
    assert node_binary("/usr/bin/python3") in {
        "/usr/local/bin/node",
        "/usr/bin/node",
        "/bin/node",
    }


def test_runtime_unavailable_is_a_refusal() -> None:
    error = RuntimeUnavailable("x", reason="too_old")
    assert isinstance(error, Refused)
    assert (error.code, error.exit_code) == ("runtime_unavailable", 3)


def test_the_backends_on_the_hosts_usr_say_so() -> None:
    # The runtime check reads the host's node only for these (requirements.check_runtime).
    assert LocalBackend.capabilities.runs_host_usr
    assert FakeBackend.capabilities.runs_host_usr
    assert not DockerBackend.capabilities.runs_host_usr


@pytest.mark.parametrize("pack", ["claude-agent-acp", "codex-acp", "gemini-cli"])
def test_npm_packs_declare_the_host_node_they_run(pack: str) -> None:
    path = REPO / "provider_packs" / pack / "pack.json"
    launch = parse_manifest(json.loads(path.read_text()), path=path).launch
    assert launch.argv[0] == "/usr/bin/node"
    assert launch.runtime is not None
    assert launch.runtime.node_minimum >= (20, 0, 0)
