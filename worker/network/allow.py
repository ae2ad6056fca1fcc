"""Allowlist entries: ``host:port`` with a hostname or an IP literal, compared exactly.

An entry names one destination: a DNS hostname (letters, digits, hyphens and dots,
lowercased; no wildcards, no trailing dot), an IPv4 literal, or an IPv6 literal in
brackets, followed by a port 1-65535. The same parser reads the job spec's list and the
authority of each ``CONNECT`` the proxy receives, so matching is equality of
:class:`Endpoint` values.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Bound on the job spec's list (and so on the proxy's table).
MAX_ALLOW = 64
_MAX_HOST = 253
_MAX_ENTRY = _MAX_HOST + len("[]:65535")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_PORT = re.compile(r"^[0-9]{1,5}$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One destination: ``host`` lowercased (an IP literal without brackets) and ``port``."""

    host: str
    port: int
    #: True when ``host`` is an IP literal (the allowlist may then name a private address).
    literal: bool

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` as an :class:`Endpoint`.

    Raises:
        ValueError: not a hostname or IP literal followed by a port 1-65535.
    """
    if len(text) > _MAX_ENTRY:
        raise ValueError(f"an entry is at most {_MAX_ENTRY} characters")
    host, port = _split(text.strip().lower())
    literal = _ip(host)
    if literal is None and not _hostname(host):
        raise ValueError(f"not a hostname or IP literal: {host!r}")
    return Endpoint(host if literal is None else str(literal), port, literal is not None)


def parse_allowlist(entries: Iterable[str]) -> frozenset[Endpoint]:
    """Every entry parsed; at most :data:`MAX_ALLOW`.

    Raises:
        ValueError: an entry is malformed or the list is too long.
    """
    parsed = [parse_endpoint(e) for e in entries]
    if len(parsed) > MAX_ALLOW:
        raise ValueError(f"at most {MAX_ALLOW} allowlist entries")
    return frozenset(parsed)


def _split(text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]:")
        if not sep or ":" not in host:
            raise ValueError(f"expected [ipv6]:port, got {text!r}")
    else:
        host, sep, rest = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"expected host:port, got {text!r}")
    if not _PORT.match(rest) or not 0 < int(rest) < 65536:
        raise ValueError(f"port must be 1-65535, got {rest!r}")
    return host, int(rest)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise ValueError("IPv6 zone ids are not allowed")
    return address


def _hostname(host: str) -> bool:
    if not host or len(host) > _MAX_HOST:
        return False
    labels = host.split(".")
    # An all-numeric last label would read as an IPv4 literal to some resolvers.
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()
