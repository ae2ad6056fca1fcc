"""What the kubernetes backend's allowlist side gives a spawn and a NetworkPolicy
(``worker.sandbox.kubernetes.netproxy``; no I/O: the front is not started). The proxy
itself, through real pods, is tests/integration/test_kubernetes_network.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.errors import SandboxError
from worker.network import FORWARDER_SOURCE, proxy_env
from worker.network.forward import CA_ENV, TOKEN_ENV, _parse
from worker.sandbox.base import ResourceLimits, SandboxSpec
from worker.sandbox.config import KubernetesConfig
from worker.sandbox.kubernetes.netproxy import PodNetwork

ENV = {"PATH": "/usr/bin"}


def _network(**config: object) -> PodNetwork:
    return PodNetwork(KubernetesConfig(k8s_proxy_address="fd00::7", **config))  # type: ignore[arg-type]


def _given_token(network: PodNetwork, pod: str) -> None:
    network._tokens[pod] = "t0ken"  # what open() records, without listening


def test_the_first_spawn_runs_behind_the_forwarder_with_the_token_later_ones_reuse_it() -> None:
    network = _network(k8s_proxy_port=4000)
    _given_token(network, "p")
    network.front.certificate = "PEM"  # what listening makes
    argv, env = network.wrap("p", ["agent", "--x"], ENV, [(3130, "model.internal:8080")])
    assert argv[:5] == ["/usr/bin/python3", "-I", "-S", "-c", FORWARDER_SOURCE.read_text()]
    assert argv[5:] == [
        "--upstream=[fd00::7]:4000", "--upstream-tls", "--tunnel=3130=model.internal:8080",
        "--", "agent", "--x",
    ]  # fmt: skip
    assert env == {**ENV, **proxy_env(), TOKEN_ENV: "t0ken", CA_ENV: "PEM"}
    again = network.wrap("p", ["tool"], ENV, [])
    assert again == (["tool"], {**ENV, **proxy_env()})  # no token, no second forwarder


def test_a_pod_without_allowlist_is_left_alone() -> None:
    assert _network().wrap("other", ["agent"], ENV, []) == (["agent"], ENV)


def test_the_forwarder_parses_the_upstream_it_is_given() -> None:
    upstream = ["--upstream=[fd00::7]:4000", "--tunnel=3130=m:80", "--", "a"]
    assert _parse(upstream) == ([(3130, "m:80")], ("fd00::7", 4000), False, ["a"])
    plain = ["--upstream=10.0.0.7:3129", "--", "a"]
    assert _parse(plain) == ([], ("10.0.0.7", 3129), False, ["a"])
    tls = ["--upstream=10.0.0.7:3129", "--upstream-tls", "--", "a"]
    assert _parse(tls) == ([], ("10.0.0.7", 3129), True, ["a"])


def test_no_peer_without_pod_labels_and_a_peer_on_the_configured_port() -> None:
    assert _network().peer() is None
    peer = _network(k8s_proxy_pod_labels={"app": "acp-worker"}, k8s_proxy_port=3999).peer()
    assert peer is not None
    assert (dict(peer.pod_labels), peer.namespace_labels, peer.port) == (
        {"app": "acp-worker"}, None, 3999,
    )  # fmt: skip


def test_allowlist_without_an_address_is_refused(tmp_path: Path) -> None:
    network = PodNetwork(KubernetesConfig())
    spec = SandboxSpec(
        job_id="j", attempt=1, workspace=tmp_path, pack_closure=tmp_path,
        limits=ResourceLimits(memory_bytes=1 << 28, cpus=1, pids=64), labels={},
        network="allowlist", network_allow=("example.com:443",),
    )  # fmt: skip
    with pytest.raises(SandboxError, match="k8s_proxy_address"):
        network.check(spec)
    asyncio.run(network.close("never-opened"))  # idempotent, nothing to close


@pytest.mark.parametrize("address", ["a b", "host;rm", "x" * 254, ""])
def test_a_malformed_proxy_address_is_refused(address: str) -> None:
    with pytest.raises(ValidationError):
        KubernetesConfig(k8s_proxy_address=address)
