"""Operator-declared model endpoints: the configuration, the choice, the routes, and the
job's network they make (``worker.endpoints``, ``worker.network.endpoints``,
``worker.job.network``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from worker.endpoints import ModelEndpoint, check_endpoints, choose, parse_base_url
from worker.errors import EndpointRefused
from worker.job.network import network_plan
from worker.jobs.spec import parse_job
from worker.network.endpoints import TUNNEL_BASE_PORT, route
from worker.packs.manifest import load_pack
from worker.settings import Settings

PACKS = Path(__file__).resolve().parents[2] / "provider_packs"


def _endpoint(**kw: Any) -> ModelEndpoint:
    return ModelEndpoint.model_validate({"packs": ["claude-agent-acp"], **kw})


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"url": "http://10.0.0.5:8000"}, "set plain_http"),
        ({"url": "https://gw.example:8443", "plain_http": True}, "http:// URLs only"),
        ({"url": "ftp://gw.example"}, "http:// or https://"),
        ({"url": "https://user:pw@gw.example"}, "no user info"),
        ({"url": "https://gw.example/v1?key=x"}, "no user info, query"),
        ({"url": "https://gw.example", "hosts": ["no-port"]}, "host:port"),
        ({"url": "https://gw.example", "packs": ["Bad Name"]}, "not a pack name"),
    ],
)
def test_a_bad_endpoint_is_refused_with_the_reason(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        _endpoint(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"url": "ftp://ops:tok3n@gw.example"},
        {"url": "https://ops:tok3n@gw.example:8443/v1"},
        {"url": "https://gw.example/v1?key=tok3n#tok3n"},
        {"url": "http://ops:tok3n@gw.example:99999"},
        {"url": "http://gw.example/v1", "plain_http": False, "hosts": ["ops:tok3n@a:1"]},
    ],
)
def test_a_refusal_never_quotes_what_may_be_a_secret(fields: dict[str, Any]) -> None:
    """User info, a query, a fragment, a host entry: any may carry a credential, and the
    refusal's text reaches logs and the CLI's error line."""
    with pytest.raises(ValidationError) as refused:
        _endpoint(**fields)
    assert "tok3n" not in str(refused.value.errors(include_input=False, include_url=False))


def test_a_pack_has_at_most_one_default() -> None:
    one = _endpoint(url="https://a.example", default=True)
    two = _endpoint(url="https://b.example", default=True)
    with pytest.raises(ValueError, match="two default endpoints"):
        check_endpoints({"a": one, "b": two})


def test_settings_read_endpoints_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "ACPW_MODEL_ENDPOINTS",
        '{"gw": {"packs": ["claude-agent-acp"], "url": "https://gw.example", "default": true}}',
    )
    assert Settings().model_endpoints["gw"].default


def test_base_urls_get_an_explicit_port() -> None:
    assert parse_base_url("https://GW.example/v1/").authority == "gw.example:443"
    assert parse_base_url("http://[::1]:8000/x").authority == "[::1]:8000"
    assert parse_base_url("http://h.example/x/").path == "/x"


def test_a_job_picks_among_its_packs_endpoints_or_gets_the_default() -> None:
    endpoints = {
        "gw": _endpoint(url="https://gw.example", default=True),
        "other": ModelEndpoint(packs=["gemini-cli"], url="https://g.example"),
    }
    assert choose(endpoints, "claude-agent-acp", None) == ("gw", endpoints["gw"])
    assert choose(endpoints, "gemini-cli", None) is None  # no default for it
    with pytest.raises(LookupError, match="declared for it: gw"):
        choose(endpoints, "claude-agent-acp", "other")  # another pack's


def test_routes_https_by_connect_and_plain_http_by_a_tunnel() -> None:
    https = route(
        "gw", _endpoint(url="https://gw.example:8443/anthropic/", hosts=["a.example:443"])
    )
    assert https.agent_url == "https://gw.example:8443/anthropic"
    assert https.allow == ("gw.example:8443", "a.example:443")
    assert https.tunnels == ()
    assert https.private == ()
    plain = route("vllm", _endpoint(url="http://10.0.3.7:8000/v1", plain_http=True, private=True))
    assert plain.agent_url == f"http://127.0.0.1:{TUNNEL_BASE_PORT}/v1"
    assert plain.tunnels == ((TUNNEL_BASE_PORT, "10.0.3.7:8000"),)
    assert plain.private == ("10.0.3.7:8000",)


def _job(**kw: Any) -> Any:
    job = {
        "v": 1, "job_id": "j-1", "pack": {"name": "claude-agent-acp"},
        "workspace": {"kind": "local", "path": "/tmp"}, "prompt": "hi", **kw,
    }  # fmt: skip
    return parse_job(job)


def _plan(endpoints: dict[str, ModelEndpoint], pack: str = "claude-agent-acp", **job: Any) -> Any:
    settings = Settings(model_endpoints=endpoints)
    return network_plan(settings, _job(pack={"name": pack}, **job), load_pack(PACKS, pack))


def test_without_an_endpoint_none_stays_none_and_allowlist_adds_the_packs_hosts() -> None:
    assert _plan({}).mode == "none"
    plan = _plan({}, network={"mode": "allowlist", "allow": ["github.com:443"]})
    assert plan.allow == ("github.com:443", "api.anthropic.com:443")
    assert plan.endpoint is None


def test_an_endpoint_opens_a_none_job_to_it_alone() -> None:
    plan = _plan({"gw": _endpoint(url="https://gw.example", default=True)})
    assert (plan.mode, plan.allow, plan.source) == ("allowlist", ("gw.example:443",), "default")
    named = _plan({"gw": _endpoint(url="https://gw.example")}, model_endpoint="gw")
    assert named.source == "job"
    assert named.allow == ("gw.example:443",)  # not the vendor's host


def test_an_undeclared_endpoint_or_a_pack_that_cannot_use_one_is_refused() -> None:
    with pytest.raises(EndpointRefused, match="not declared"):
        _plan({}, model_endpoint="gw")
    # The emulator pack has no launch.endpoint: it cannot be pointed at one.
    emulator = ModelEndpoint(packs=["cursor-emulator"], url="https://gw.example", default=True)
    with pytest.raises(EndpointRefused, match=r"no launch\.endpoint"):
        _plan({"gw": emulator}, pack="cursor-emulator")
