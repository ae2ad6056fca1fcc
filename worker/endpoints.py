"""Model endpoints an operator declares: where a pack's agent finds its model API.

A deployment names its endpoints in ``ACPW_MODEL_ENDPOINTS`` (JSON, name → endpoint):

    {"gateway": {"packs": ["claude-agent-acp"], "url": "https://llm-gw.corp:8443",
                 "private": true, "default": true},
     "local-vllm": {"packs": ["codex-acp"], "url": "http://10.0.3.7:8000/v1",
                    "plain_http": true, "private": true}}

A job picks one by name (``model_endpoint``) among those declared for its pack, or gets
its pack's ``default`` one; it can never name a URL. The agent reaches the endpoint only
through the job's proxy (``worker.network``): an ``https`` endpoint by ``CONNECT`` to its
host, a ``plain_http`` one through a tunnel the sandbox's forwarder opens on its own
loopback; an address that is private, loopback or link-local only when the operator set
``private``. ``hosts`` are further ``host:port`` destinations the agent needs with this
endpoint (an auth server, say), reached by ``CONNECT`` under the same rules.

This module is configuration only (pure: parse and check); ``worker.network.endpoints``
turns a chosen endpoint into the sandbox's routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Endpoint and pack names: the pack name pattern.
NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_PATH = re.compile(r"^[A-Za-z0-9._~/%+-]*$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$")


@dataclass(frozen=True, slots=True)
class BaseUrl:
    """An endpoint URL taken apart: scheme, ``host:port`` (port made explicit) and path
    (no trailing slash)."""

    scheme: str
    authority: str
    path: str

    def with_authority(self, scheme: str, authority: str) -> str:
        return f"{scheme}://{authority}{self.path}"


def shown(url: str) -> str:
    """``url`` as a message may quote it: its scheme, host and path, without user info,
    port, query or fragment (a credential or a token may be in any of them)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "an unparsable URL"
    cut = "…" if parts.netloc != (parts.hostname or "") or parts.query or parts.fragment else ""
    return repr(f"{parts.scheme}://{parts.hostname or ''}{parts.path}{cut}")


def parse_base_url(url: str) -> BaseUrl:
    """``http(s)://host[:port][/path]``: no user info, query or fragment. The messages
    quote the URL only as :func:`shown` does.

    Raises:
        ValueError: anything else.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        raise ValueError(f"an endpoint URL is http:// or https://, got {shown(url)}")
    if parts.username or parts.password or parts.query or parts.fragment or not parts.hostname:
        raise ValueError(
            f"an endpoint URL has a host and no user info, query or fragment: {shown(url)}"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError(f"bad port in {shown(url)}") from exc
    if not _PATH.match(parts.path):
        # The URL goes into environment variables and config files (TOML, JSON) verbatim.
        raise ValueError(
            f"an endpoint URL's path is letters, digits and ._~/%+- only: {shown(url)}"
        )
    host = parts.hostname.lower()
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BaseUrl(parts.scheme, authority, parts.path.rstrip("/"))


class ModelEndpoint(BaseModel):
    """One operator-declared model endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    packs: list[str] = Field(min_length=1, description="Packs whose agents may use it.")
    url: str = Field(max_length=2048, description="Base URL the agent is given.")
    plain_http: bool = Field(
        default=False, description="Allow an http:// URL (reached through a tunnel)."
    )
    private: bool = Field(
        default=False, description="It may resolve to private, loopback or link-local addresses."
    )
    hosts: list[str] = Field(
        default_factory=list, max_length=16, description="Further `host:port` the agent needs."
    )
    default: bool = Field(
        default=False, description="The endpoint of its packs' jobs that name none."
    )

    @field_validator("packs")
    @classmethod
    def _pack_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(NAME, name):
                raise ValueError(f"not a pack name: {name!r}")
        return value

    @field_validator("hosts")
    @classmethod
    def _host_ports(cls, value: list[str]) -> list[str]:
        for index, entry in enumerate(value):
            if not _HOST_PORT.match(entry):  # not quoted: it may hold user info
                raise ValueError(f"hosts[{index}] is not host:port")
        return value

    @model_validator(mode="after")
    def _scheme_matches(self) -> Self:
        base = parse_base_url(self.url)
        if base.scheme == "http" and not self.plain_http:
            raise ValueError(f"{shown(self.url)} is plain http: set plain_http to allow it")
        if base.scheme == "https" and self.plain_http:
            raise ValueError(f"{shown(self.url)} is https: plain_http applies to http:// URLs only")
        return self

    @property
    def base(self) -> BaseUrl:
        return parse_base_url(self.url)


def check_endpoints(endpoints: dict[str, ModelEndpoint]) -> dict[str, ModelEndpoint]:
    """Names are slugs; at most one default per pack.

    Raises:
        ValueError: a bad name, or two defaults for one pack.
    """
    defaults: dict[str, str] = {}
    for name, endpoint in endpoints.items():
        if not re.match(NAME, name):
            raise ValueError(f"not an endpoint name: {name!r}")
        for pack in endpoint.packs if endpoint.default else ():
            if pack in defaults:
                raise ValueError(
                    f"pack {pack!r} has two default endpoints: {defaults[pack]!r}, {name!r}"
                )
            defaults[pack] = name
    return endpoints


def choose(
    endpoints: dict[str, ModelEndpoint], pack: str, asked: str | None
) -> tuple[str, ModelEndpoint] | None:
    """The endpoint a job of ``pack`` uses: ``asked`` when it is declared for the pack,
    else the pack's default; None when the job asked none and the pack has no default.

    Raises:
        LookupError: ``asked`` is not declared, or not for this pack (the message lists
            the pack's endpoints).
    """
    mine = {name: e for name, e in endpoints.items() if pack in e.packs}
    if asked is not None:
        if asked not in mine:
            offered = ", ".join(sorted(mine)) or "none"
            raise LookupError(
                f"model endpoint {asked!r} is not declared for pack {pack!r} "
                f"(declared for it: {offered})"
            )
        return asked, mine[asked]
    return next(((n, e) for n, e in sorted(mine.items()) if e.default), None)
