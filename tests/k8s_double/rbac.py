"""What RBAC permission each request the API double saw needs, as the API server's
authorizer reads it (group, resource/subresource, verb): a collection GET is ``list``,
a named one ``get``; an exec or attach WebSocket upgrade is a GET that API servers from
1.30 also authorize as ``create`` (so both are needed); a watch (recorded with a
``?watch`` suffix) is ``watch``."""

from __future__ import annotations

import re
from collections.abc import Iterable

Permission = tuple[str, str, str]

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/[^/]+/(?P<resource>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
_VERBS = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}


def needed(method: str, path: str) -> set[Permission]:
    """The permissions one request needs.

    Raises:
        ValueError: a path outside a namespace's resources (the backend makes none).
    """
    path, watch = path.removesuffix("?watch"), path.endswith("?watch")
    match = _PATH.match(path)
    if match is None:
        raise ValueError(f"not a namespaced resource path: {method} {path}")
    group = match.group("group") or ""
    resource, name, sub = match.group("resource"), match.group("name"), match.group("sub")
    if sub is not None:
        resource = f"{resource}/{sub}"
        if method == "GET" and sub in {"exec", "attach"}:
            return {(group, resource, "get"), (group, resource, "create")}
    if method == "GET":
        return {(group, resource, "watch" if watch else "get" if name else "list")}
    return {(group, resource, _VERBS[method])}


def route(method: str, path: str) -> str:
    """The route a request is (``"<verb> <resource>"``, as ``needed`` reads it: an exec
    is ``get pods/exec``), by which the double injects faults."""
    found = needed(method, path)
    _, resource, verb = min(found, key=lambda p: p[2] != "get")
    return f"{verb} {resource}"


def outside(requests: Iterable[tuple[str, str]], granted: set[Permission]) -> set[Permission]:
    """What the ``requests`` needed that ``granted`` does not give."""
    return {p for method, path in requests for p in needed(method, path)} - granted
