"""A job's network: its own policy, plus its model endpoint or its pack's default hosts.

- With a model endpoint (the job's ``model_endpoint``, else its pack's default one in
  ``ACPW_MODEL_ENDPOINTS``), the endpoint's destinations join the job's allowlist, and a
  job whose policy is ``none`` gets ``allowlist`` with those alone: the agent reaches its
  model API and nothing else.
- Without one, an ``allowlist`` job also reaches the hosts its pack declares its agent
  contacts by default (``launch.hosts``, its vendor's API); ``none`` stays ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.endpoints import choose
from worker.errors import EndpointRefused
from worker.jobs.spec import JobSpec
from worker.network.endpoints import EndpointRoute, route
from worker.packs.manifest import Pack
from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class NetworkPlan:
    """What the job's ``SandboxSpec`` gets, and the endpoint (if any) it comes from."""

    mode: str
    allow: tuple[str, ...] = ()
    private: tuple[str, ...] = ()
    tunnels: tuple[tuple[int, str], ...] = ()
    endpoint: EndpointRoute | None = None
    #: ``job`` (the job named the endpoint) or ``default`` (the pack's default one).
    source: Literal["job", "default"] = "default"


def network_plan(settings: Settings, spec: JobSpec, declaration: Pack) -> NetworkPlan:
    """The job's network.

    Raises:
        EndpointRefused: the job names an endpoint not declared for its pack, or the
            job has one and its pack has no ``launch.endpoint``.
    """
    launch = declaration.manifest.launch
    pack = spec.pack.name
    try:
        chosen = choose(settings.model_endpoints, pack, spec.model_endpoint)
    except LookupError as exc:
        raise EndpointRefused(str(exc), pack=pack, endpoint=spec.model_endpoint) from exc
    allow = list(spec.network.allow)
    if chosen is None:
        if spec.network.mode == "allowlist":
            allow += launch.hosts or []
        allow = list(dict.fromkeys(allow))
        return NetworkPlan(mode="allowlist" if allow else "none", allow=tuple(allow))
    if launch.endpoint is None:
        raise EndpointRefused(
            f"pack {pack!r} cannot be pointed at a model endpoint (its manifest has no "
            f"launch.endpoint), so endpoint {chosen[0]!r} cannot be used",
            pack=pack,
            endpoint=chosen[0],
        )
    routed = route(*chosen)
    allow = list(dict.fromkeys([*allow, *routed.allow]))
    return NetworkPlan(
        mode="allowlist",
        allow=tuple(allow),
        private=routed.private,
        tunnels=routed.tunnels,
        endpoint=routed,
        source="job" if spec.model_endpoint is not None else "default",
    )
