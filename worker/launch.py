"""How an agent is started inside a sandbox: a fixed argv and a closed environment.

The pack's launch contract (argv template, environment, accepted credential names) is
all the worker needs. Nothing from the worker's own environment is inherited: the agent
gets the base environment below (private HOME/XDG dirs), the pack's variables, and only
the credentials the job bound and the pack accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.sandbox.base import HOME, PACK_ROOT, WORKSPACE

PLACEHOLDERS = {"{pack}": PACK_ROOT, "{home}": HOME, "{workspace}": WORKSPACE, "{tmp}": "/tmp"}

BASE_ENV: Mapping[str, str] = {
    "HOME": HOME,
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "XDG_CONFIG_HOME": f"{HOME}/.config",
    "XDG_CACHE_HOME": f"{HOME}/.cache",
    "XDG_DATA_HOME": f"{HOME}/.local/share",
    "XDG_STATE_HOME": f"{HOME}/.local/state",
}


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Exactly what runs: argv and the complete environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    dialect: str | None
    #: The ``authenticate`` method id the worker calls after ``initialize`` (the pack's
    #: ``launch.authenticate``); ``None``: the agent reads its credentials itself.
    authenticate: str | None = None
    #: The session mode the worker sets when the job names none (the pack's
    #: ``launch.mode``); ``None``: the agent's own default.
    default_mode: str | None = None
    #: Whether the agent exits on its own once its stdin closes (the pack's
    #: ``launch.exits_on_eof``); if not, the teardown signals it at once instead of
    #: waiting ``shutdown_eof_grace`` for an exit that does not come soon.
    exits_on_eof: bool = True
    #: Offer the agent the client's fs methods (the pack's ``launch.client_fs``).
    client_fs: bool = True


def expand(template: str) -> str:
    """Replace the fixed sandbox placeholders (``{pack}``, ``{home}``, …)."""
    for placeholder, value in PLACEHOLDERS.items():
        template = template.replace(placeholder, value)
    return template


def launch_plan(
    *,
    argv: Sequence[str],
    env: Mapping[str, str],
    dialect: str | None,
    credentials: Mapping[str, str],
    authenticate: str | None = None,
    client_fs: bool = True,
    endpoint_env: Mapping[str, str] | None = None,
    endpoint_url: str | None = None,
    default_mode: str | None = None,
    exits_on_eof: bool = True,
) -> LaunchPlan:
    """The plan for one job: base env, then the pack's, then (with a model endpoint)
    ``endpoint_env`` with ``{endpoint}`` as ``endpoint_url``, then the bound credentials."""
    full = dict(BASE_ENV)
    full.update({name: expand(value) for name, value in env.items()})
    if endpoint_url is not None:
        for name, value in (endpoint_env or {}).items():
            full[name] = expand(value).replace("{endpoint}", endpoint_url)
    full.update(credentials)
    return LaunchPlan(
        argv=tuple(expand(a) for a in argv),
        env=full,
        dialect=dialect,
        authenticate=authenticate,
        default_mode=default_mode,
        exits_on_eof=exits_on_eof,
        client_fs=client_fs,
    )
