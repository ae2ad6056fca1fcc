"""``acp-worker agents probe PACK``: what an agent advertises, from inside its sandbox.

The tool an operator uses when qualifying a new agent version. It prepares as a job
does, with the job's own parts (``worker.job.standalone``): the pack's runtime is checked, its
closure materialized, verified and held against a pack-cache gc until the sandbox is
gone, the agent starts in a sandbox with an empty workspace once admission passed again
in the sandbox's own view, and the worker runs ``initialize`` then ``session/new``.
Whatever the agent advertises is printed: protocol, agent info, capabilities, auth
methods and, when a session could be opened, its modes, models and config options. A
refused ``session/new`` (most agents want credentials first) is reported, not an error:
the probe exits 0 once ``initialize`` succeeded.

``--credential NAME=REF`` (repeatable) binds a credential as a job does: ``NAME`` must be
one the pack accepts, ``REF`` a reference of an enabled secret source (``env:VAR``,
``file:PATH`` under ``ACPW_SECRETS_DIR``, …), never the secret. Anything else refuses the
probe (``credential_refused``) before the agent starts. With a credential bound, the
pack's ``launch.authenticate`` method is called after ``initialize``, as in a job. The
values never reach the output: everything printed, errors included, is scrubbed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.acp.agent import AgentProcess
from worker.acp.client import AcpClient, ClientCapabilities
from worker.cli import add_json_flag
from worker.cli.packs import resolve_pack
from worker.credentials.redact import Redactor
from worker.credentials.resolve import resolve_credentials, secret_sources
from worker.errors import InvalidInput, WorkerError
from worker.job.standalone import StandaloneAgent, standalone_agent
from worker.packs.manifest import Pack
from worker.packs.names import PLATFORMS
from worker.packs.runtime import check_runtime
from worker.rpc.connection import StrayReply
from worker.rpc.oversize import OversizeLine
from worker.sandbox import backend_config, base, get_backend
from worker.sandbox.base import SandboxBackend
from worker.settings import Settings

PROBE_LIMITS = base.ResourceLimits(memory_bytes=2 * 1024**3, cpus=1.0, pids=512)
# Notifications are summarized by kind; a probe is not a transcript.
MAX_KINDS = 50
# A credential name, as a job spec allows it.
_CREDENTIAL_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``agents probe`` to the ``acp-worker`` parser."""
    agents = sub.add_parser("agents", help="inspect ACP agents through their packs")
    add_json_flag(agents)
    actions = agents.add_subparsers(dest="agents_command", required=True, metavar="ACTION")
    probe = actions.add_parser("probe", help="initialize an agent and print what it offers")
    probe.add_argument("pack", metavar="PACK", help="pack name or folder")
    probe.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
    probe.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds per request"
    )
    probe.add_argument("--no-session", action="store_true", help="stop after initialize")
    probe.add_argument(
        "--credential",
        action="append",
        default=[],
        metavar="NAME=REF",
        help="bind a credential the pack accepts, as a job does: REF is env:VAR, file:PATH "
        "(under ACPW_SECRETS_DIR) or another enabled source, never the secret; repeatable",
    )
    add_json_flag(probe)
    probe.set_defaults(handler=probe_command)


def probe_command(args: argparse.Namespace, settings: Settings) -> int:
    """``agents probe PACK``: exit 0 when ``initialize`` succeeded."""
    settings = settings.model_copy(update={"acp_request_timeout": args.timeout})
    pack = resolve_pack(args.pack, settings)
    redactor = Redactor()
    try:
        credentials = bind_credentials(args.credential, pack, settings, redactor)
        backend = get_backend(backend_config(settings))
        check_runtime(pack, host_usr=backend.capabilities.runs_host_usr)
        probe = run_probe(
            pack,
            settings,
            backend,
            platform=args.platform,
            session=not args.no_session,
            credentials=credentials,
        )
        report = asyncio.run(probe)
    except WorkerError as exc:
        raise scrubbed(exc, redactor) from None
    if getattr(args, "json", False):
        text = json.dumps(report, ensure_ascii=False, indent=2)
    else:
        text = render(report)
    print(redactor.scrub(text))
    return 0


def bind_credentials(
    pairs: list[str], pack: Pack, settings: Settings, redactor: Redactor
) -> dict[str, str]:
    """``NAME=REF`` pairs resolved as a job's credentials (each value registered with
    *redactor*); the pair itself is never echoed, it may be a secret typed by mistake.

    Raises:
        InvalidInput: not ``NAME=REF``, a malformed or repeated name.
        CredentialRefused: a name the pack does not accept, a source not enabled, or a
            reference that does not resolve.
    """
    refs: dict[str, str] = {}
    for pair in pairs:
        name, sep, ref = pair.partition("=")
        if not (sep and ref and _CREDENTIAL_NAME.match(name)):
            raise InvalidInput(
                "--credential takes NAME=REF with NAME like CURSOR_API_KEY and REF a "
                "reference such as env:MY_KEY or file:key, never the secret itself",
                field="credential",
            )
        if name in refs:
            raise InvalidInput(f"--credential {name} is given twice", field="credential")
        refs[name] = ref
    return resolve_credentials(
        refs,
        allowed=pack.credentials,
        sources=secret_sources(settings, os.environ),
        redactor=redactor,
    )


def scrubbed(exc: WorkerError, redactor: Redactor) -> WorkerError:
    """*exc* with every bound value masked in its message and details."""
    if not redactor:
        return exc
    exc.message = redactor.scrub(exc.message)
    exc.args = (exc.message,)
    exc.details = json.loads(redactor.scrub(json.dumps(exc.details, default=str)))
    return exc


@dataclass(slots=True)
class _Seen:
    """What the agent sent on its own while being probed."""

    kinds: dict[str, int] = field(default_factory=dict)
    notices: list[dict[str, object]] = field(default_factory=list)

    async def notification(self, method: str, params: object) -> None:
        update = params.get("update") if isinstance(params, Mapping) else None
        kind = update.get("sessionUpdate") if isinstance(update, Mapping) else None
        key = f"{method}:{kind}" if isinstance(kind, str) else method
        if key in self.kinds or len(self.kinds) < MAX_KINDS:
            self.kinds[key] = self.kinds.get(key, 0) + 1

    async def malformed(self, preview: str, reason: str) -> None:
        self.notices.append({"type": "malformed_line", "data": {"reason": reason}})

    async def stray_reply(self, reply: StrayReply) -> None:
        reason = "duplicate" if reply.duplicate else "unknown_id"
        self.notices.append({"type": "stray_reply", "data": {"reason": reason}})

    async def oversize(self, line: OversizeLine) -> None:
        data = {"bytes": line.size, "limit": line.limit, "kind": line.kind}
        self.notices.append({"type": "oversize_line", "data": data})


async def run_probe(
    pack: Pack,
    settings: Settings,
    backend: SandboxBackend,
    *,
    platform: str | None,
    session: bool,
    credentials: Mapping[str, str],
) -> dict[str, object]:
    """The probe's report: *pack*'s agent in a sandbox of its own, prepared with the
    job's parts (``worker.job.standalone``): initialize, then authenticate and a session
    as asked, then its shutdown."""
    seen = _Seen()
    async with standalone_agent(
        pack,
        settings,
        backend,
        platform=platform,
        credentials=credentials,
        limits=PROBE_LIMITS,
        on_notification=seen.notification,
        on_malformed=seen.malformed,
        on_oversize=seen.oversize,
        on_stray_reply=seen.stray_reply,
    ) as standalone:
        report: dict[str, object] = {
            "pack": standalone.pack.event_data().wire(),
            "credentials": sorted(credentials),
        }
        report.update(
            await _talk(standalone, settings, seen, session=session, bound=bool(credentials))
        )
    return report


async def _talk(
    standalone: StandaloneAgent,
    settings: Settings,
    seen: _Seen,
    *,
    session: bool,
    bound: bool,
) -> dict[str, object]:
    agent, plan = standalone.agent, standalone.plan
    client = AcpClient(agent.connection)
    agent.start()
    report: dict[str, object] = {}
    try:
        report.update(await _initialize(client))
        if bound and plan.authenticate is not None:
            # As a job does; without credentials the probe shows the unauthenticated view.
            report["authenticate"] = await _authenticate(
                client, plan.authenticate, report["auth_methods"]
            )
        if session:
            report["session"] = await _session(client)
    except WorkerError as exc:
        exc.details.setdefault("stderr_preview", agent.stderr.preview())
        raise
    finally:
        report["shutdown"] = await _shutdown(agent, settings)
    report["notifications"] = seen.kinds
    report["notices"] = seen.notices
    return report


async def _initialize(client: AcpClient) -> dict[str, object]:
    start = time.perf_counter()
    # What a plain job offers: no client fs/terminal, so the probe sees the default view.
    init = await client.initialize(ClientCapabilities())
    return {
        "initialize_ms": round((time.perf_counter() - start) * 1000, 1),
        "protocol_version": init.get("protocolVersion"),
        "agent_info": init.get("agentInfo"),
        "agent_capabilities": init.get("agentCapabilities"),
        "auth_methods": init.get("authMethods"),
        "extra": {k: v for k, v in init.items() if k not in _INIT_KEYS},
    }


_INIT_KEYS = frozenset({"protocolVersion", "agentInfo", "agentCapabilities", "authMethods"})
_SESSION_KEYS = ("modes", "models", "configOptions")


async def _authenticate(client: AcpClient, method: str, offered: Any) -> dict[str, object]:
    try:
        await client.authenticate(method, offered)
    except WorkerError as exc:
        return {"method": method, "ok": False, "error": exc.to_dict()}
    return {"method": method, "ok": True}


async def _session(client: AcpClient) -> dict[str, object]:
    try:
        result = await client.new_session(base.WORKSPACE)
    except WorkerError as exc:
        return {"opened": False, "error": exc.to_dict()}
    out: dict[str, object] = {"opened": True}
    out.update({key: result.get(key) for key in _SESSION_KEYS})
    out["extra"] = {k: v for k, v in result.items() if k not in {"sessionId", *_SESSION_KEYS}}
    return out


async def _shutdown(agent: AgentProcess, settings: Settings) -> dict[str, object]:
    """Close stdin and escalate; say how the agent ended (``eof``, ``term`` or ``kill``)."""
    start = time.perf_counter()
    code = await agent.shutdown(
        eof_grace=settings.shutdown_eof_grace, term_grace=settings.shutdown_term_grace
    )
    seconds = time.perf_counter() - start
    if seconds < settings.shutdown_eof_grace:
        how = "eof"
    elif seconds < settings.shutdown_eof_grace + settings.shutdown_term_grace:
        how = "term"
    else:
        how = "kill"
    return {"exit_code": code, "ended_by": how, "seconds": round(seconds, 2)}


# --- human output ------------------------------------------------------------------


def render(report: Mapping[str, Any]) -> str:
    """The probe report as a few readable lines."""
    pack, info = report["pack"], report.get("agent_info") or {}
    name = info.get("title") or info.get("name", "?")
    lines = [
        f"pack      {pack['name']} {pack['version']} ({pack['platform']})",
        f"closure   {pack['closure_digest']}",
        f"agent     {name} {info.get('version', '')}".rstrip(),
        f"protocol  {report['protocol_version']} (initialize {report['initialize_ms']} ms)",
        f"caps      {_flat(report.get('agent_capabilities') or {})}",
        f"auth      {_auth(report.get('auth_methods') or [])}",
    ]
    lines += _credential_lines(report)
    lines += _session_lines(report.get("session"), bool(report.get("credentials")))
    kinds = report.get("notifications") or {}
    if kinds:
        lines.append("sent      " + ", ".join(f"{k} x{n}" for k, n in kinds.items()))
    end = report["shutdown"]
    lines.append(f"shutdown  exit {end['exit_code']} after {end['ended_by']} ({end['seconds']} s)")
    return "\n".join(lines)


def _flat(value: object, prefix: str = "") -> str:
    if isinstance(value, Mapping) and value:
        return ", ".join(_flat(v, f"{prefix}{k}.") for k, v in value.items())
    shown = "{}" if isinstance(value, Mapping) else json.dumps(value)
    return f"{prefix.rstrip('.')}={shown}"


def _auth(methods: Iterable[object]) -> str:
    ids = [str(m.get("id")) for m in methods if isinstance(m, Mapping)]
    return ", ".join(ids) if ids else "(none advertised)"


def _credential_lines(report: Mapping[str, Any]) -> list[str]:
    names = report.get("credentials") or []
    if not names:
        return []
    lines = ["bound     " + ", ".join(names)]
    auth = report.get("authenticate")
    if auth is not None:
        error = auth.get("error") or {}
        outcome = "ok" if auth["ok"] else f"refused: {error.get('message')} [{error.get('code')}]"
        lines.append(f"authn     {auth['method']} {outcome}")
    return lines


def _session_lines(session: Mapping[str, Any] | None, bound: bool) -> list[str]:
    if session is None:
        return []
    if not session.get("opened"):
        error = session.get("error") or {}
        return [f"session   refused: {error.get('message')} [{error.get('code')}]"]
    how = "with the bound credentials" if bound else "without credentials"
    lines = [f"session   opened {how}"]
    modes = (session.get("modes") or {}).get("availableModes") or []
    if modes:
        lines.append("modes     " + ", ".join(str(m.get("id")) for m in modes))
    models = (session.get("models") or {}).get("availableModels") or []
    if models:
        lines.append("models    " + ", ".join(str(m.get("modelId")) for m in models))
    for option in session.get("configOptions") or []:
        values = [str(o.get("value")) for o in option.get("options") or [] if "value" in o]
        lines.append(
            f"option    {option.get('id')} = {option.get('currentValue')} ({', '.join(values)})"
        )
    return lines
