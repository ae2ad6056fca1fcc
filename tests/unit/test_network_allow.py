"""Allowlist entries and the job spec's network policy (pure parsing)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.jobs.spec import Network
from worker.network import MAX_ALLOW, Endpoint, parse_allowlist, parse_endpoint, proxy_env


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("API.Example.com:443", Endpoint("api.example.com", 443, literal=False)),
        (" localhost:8080 ", Endpoint("localhost", 8080, literal=False)),
        ("10.0.0.7:22", Endpoint("10.0.0.7", 22, literal=True)),
        ("[::1]:80", Endpoint("::1", 80, literal=True)),
        ("[2001:DB8::1]:443", Endpoint("2001:db8::1", 443, literal=True)),
        ("a-b.c-d.io:65535", Endpoint("a-b.c-d.io", 65535, literal=False)),
    ],
)
def test_endpoints_parse_and_normalize(text: str, expected: Endpoint) -> None:
    assert parse_endpoint(text) == expected
    assert parse_endpoint(str(expected)) == expected  # str() round-trips


@pytest.mark.parametrize(
    "text",
    [
        "example.com",  # no port
        "example.com:0",
        "example.com:65536",
        "example.com:+1",
        "example.com:https",
        "*.example.com:443",  # no wildcards
        "example.com.:443",  # no trailing dot
        "-bad.example:443",
        "bad-.example:443",
        "under_score.example:443",
        "1.2.3:443",  # numeric last label: not a hostname, not an IPv4 literal
        "01.2.3.4:443",  # leading zeros are ambiguous
        "::1:80",  # IPv6 needs brackets
        "[::1]80",
        "[fe80::1%eth0]:80",  # no zone ids
        "[1.2.3.4]:80",
        "user@example.com:443",
        "example.com:443/path",
        ":443",
        "a" * 64 + ".example:443",  # a label of 64
        ("a" * 60 + ".") * 5 + "io:1",  # longer than 253
        "x" * 10_000 + ":1",
    ],
)
def test_malformed_endpoints_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"port|hostname|expected|zone|characters") as info:
        parse_endpoint(text)
    assert len(str(info.value)) < 400  # a hostile entry is never echoed unbounded


def test_allowlists_are_bounded_and_deduplicated() -> None:
    assert parse_allowlist(["A.io:1", "a.io:1"]) == {Endpoint("a.io", 1, literal=False)}
    with pytest.raises(ValueError, match=f"at most {MAX_ALLOW}"):
        parse_allowlist([f"h{i}.io:1" for i in range(MAX_ALLOW + 1)])


def test_network_model_normalizes_and_requires_entries_with_allowlist() -> None:
    net = Network(mode="allowlist", allow=["API.example.com:443", "[::1]:8080"])
    assert net.allow == ["api.example.com:443", "[::1]:8080"]
    assert Network().mode == "none"
    assert Network().allow == []
    with pytest.raises(ValidationError, match="required with mode allowlist"):
        Network(mode="allowlist")
    with pytest.raises(ValidationError, match="refused otherwise"):
        Network(allow=["a.io:1"])
    with pytest.raises(ValidationError, match="hostname"):
        Network(mode="allowlist", allow=["*.io:1"])
    with pytest.raises(ValidationError, match="at most 64"):
        Network(mode="allowlist", allow=[f"h{i}.io:1" for i in range(65)])


def test_proxy_env_points_every_spelling_at_the_forwarder() -> None:
    env = proxy_env()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
