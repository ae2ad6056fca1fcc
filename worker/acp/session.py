"""One job's ACP session: wiring, initialize, new or resumed session, mode and model.

    initialize (capabilities we can honour) → session/new | session/load (history
    replayed, marked ``replay``) → session/set_mode → model selection (exact, echoed)

Inbound requests are wired here: ``session/request_permission`` (the job's policy),
``cursor/*`` (the Cursor dialect), ``fs/*`` (only when the sandbox gives its workspace
files, and then advertised), ``terminal/*`` (run in the job's own sandbox).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.acp.client import AcpClient, ClientCapabilities
from worker.acp.cursor import CursorDialect, LookUp
from worker.acp.fs import FileService
from worker.acp.permissions import PermissionPolicy
from worker.acp.prompt import check_capabilities
from worker.acp.selection import ModelSelector, cost_raising, default_selection
from worker.acp.terminal import Terminals
from worker.errors import ModelUnavailable, ModeUnavailable, Unsupported
from worker.events import notices
from worker.events.emitter import Emit
from worker.events.models import (
    AgentInitialized,
    EventData,
    ModelSelected,
    PermissionDecided,
    SessionStarted,
)
from worker.events.normalizer import Normalizer
from worker.interactions.broker import InteractionBroker
from worker.jobs.spec import JobSpec
from worker.rpc.connection import Connection
from worker.rpc.wire import JsonValue
from worker.sandbox.base import WORKSPACE, Sandbox
from worker.sandbox.files import WorkspaceFiles

FS_READ_LIMIT = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SessionWiring:
    """What the session needs from the job."""

    spec: JobSpec
    dialect: str | None
    emit: Emit
    normalizer: Normalizer
    broker: InteractionBroker
    sandbox: Sandbox
    #: The workspace's files for ``fs/*`` (``None``: not offered, the agent uses its own).
    files: WorkspaceFiles | None
    terminal_output_bytes: int
    #: The pack's ``authenticate`` method id, called right after ``initialize``.
    authenticate: str | None = None
    #: The pack's session mode for jobs that name none (``launch.mode``).
    default_mode: str | None = None
    #: The operator's ``ACPW_MODEL_PARAMS_REQUIRED``: every parameter the agent exposes
    #: for the job's model must be named by the job (none left to the agent's default).
    params_required: bool = False
    #: Looks up the paths a notification names before their artifacts are checked (the
    #: sandbox's ``WorkspaceFiles.look_up``, offered or not to the agent as ``fs/*``).
    look_up: LookUp | None = None


class AcpSession:
    """The worker's side of one agent connection."""

    def __init__(self, connection: Connection, wiring: SessionWiring) -> None:
        self.client = AcpClient(connection)
        self._wiring = wiring
        self._spec = wiring.spec
        self._emit = wiring.emit
        self.terminals = Terminals(wiring.sandbox, output_limit=wiring.terminal_output_bytes)
        #: Set once ``session.started`` went out: the session the agent may have recorded.
        self.session_id: str | None = None
        self.capabilities = ClientCapabilities(
            fs=wiring.files is not None,
            terminal=True,
            subagents=True,
            parameterized_models=self._parameterized(),
        )
        self._register(connection)

    def _parameterized(self) -> bool:
        return parameterized_models(self._spec, self._wiring.dialect)

    def _register(self, connection: Connection) -> None:
        wiring = self._wiring
        policy = PermissionPolicy(
            self._spec.permissions.policy,
            emit=self._permission_event,
            broker=wiring.broker,
            attribute=wiring.normalizer.permission_source,
        )
        connection.route("session/request_permission", policy)
        if wiring.dialect == "cursor":
            CursorDialect(
                connection,
                emit=self._emit,
                normalizer=wiring.normalizer,
                broker=wiring.broker,
                look_up=wiring.look_up,
            )
        if wiring.files is not None:
            FileService(wiring.files, read_limit=FS_READ_LIMIT).register(connection)
        self.terminals.register(connection)

    async def _permission_event(self, event: EventData) -> None:
        """A permission decision, also told to the normalizer (a tool denied there and
        then ended without output failed)."""
        if isinstance(event, PermissionDecided) and event.tool_call_id is not None:
            denied = event.decision == "denied"
            self._wiring.normalizer.permission_decided(event.tool_call_id, denied=denied)
        await self._emit(event)

    async def open(
        self,
        mark: Callable[[str], None] = lambda phase: None,
        *,
        initialized: Mapping[str, JsonValue] | None = None,
    ) -> str:
        """Initialize, then start or resume the session; returns its id.

        ``mark`` is called after ``initialize`` and after ``session_new``/``session_load``.
        ``initialized``: the agent's answer to an ``initialize`` already made on this
        connection with these very capabilities (a warm slot, ``worker.job.warm``): it is
        not asked again.

        Raises:
            AuthRequired, SessionNotFound, Unsupported (also: a prompt block the agent's
            ``promptCapabilities`` do not admit), ModelUnavailable, AgentError.
        """
        init = initialized
        if init is None:
            init = await self.client.initialize(self.capabilities)
        mark("initialize")
        await self._emit(AgentInitialized(**initialized_data(init)))
        # Before any session exists: a prompt the agent cannot take fails the job here.
        check_capabilities(init, self._spec.prompt_blocks())
        if self._wiring.authenticate is not None:
            await self.client.authenticate(self._wiring.authenticate, init.get("authMethods"))
        resume = self._spec.session.resume if self._spec.session is not None else None
        if resume is not None:
            session = await self._load(init, resume)
            session_id = resume
            mark("session_load")
        else:
            session = await self.client.new_session(WORKSPACE)
            session_id = str(session["sessionId"])
            self._wiring.normalizer.bind(session_id)
            mark("session_new")
        started = session_data(session_id, session, resume is not None)
        await self._emit(SessionStarted(**started))
        self.session_id = session_id
        await self._configure(session_id, session)
        return session_id

    async def _load(self, init: Mapping[str, Any], session_id: str) -> Mapping[str, Any]:
        caps = init.get("agentCapabilities")
        if not (isinstance(caps, Mapping) and caps.get("loadSession") is True):
            raise Unsupported(
                "the agent does not offer session/load, so the session cannot be resumed",
                session_id=session_id,
            )
        normalizer = self._wiring.normalizer
        normalizer.bind(session_id)
        normalizer.replay = True  # the history arrives before the result
        try:
            return await self.client.load_session(session_id, WORKSPACE)
        finally:
            normalizer.replay = False

    async def _configure(self, session_id: str, session: Mapping[str, Any]) -> None:
        mode = self._spec.mode or self._wiring.default_mode
        if mode is not None:
            check_mode(session, mode)
            await self.client.set_mode(session_id, mode)
        model = self._spec.model
        parameterized = self.capabilities.parameterized_models
        if model is None:
            selected = default_selection(session, parameterized=parameterized)
        else:
            selector = ModelSelector(self.client, session_id, parameterized=parameterized)
            selected = await selector.select(session, model.id, model.params, model.reasoning)
            if self._wiring.params_required and selected["defaults"]:
                raise ModelUnavailable(
                    "the operator requires every model parameter to be named "
                    "(ACPW_MODEL_PARAMS_REQUIRED); the job leaves "
                    f"{', '.join(sorted(selected['defaults']))} to the agent's defaults",
                    reason="params_required",
                    model=model.id,
                    unset=selected["defaults"],
                )
        await self._emit(ModelSelected(**selected))
        raising = cost_raising(selected["defaults"])
        if raising:
            await self._emit(notices.cost_raising_default(selected["model"], raising))


def parameterized_models(spec: JobSpec, dialect: str | None) -> bool:
    """Whether the client offers Cursor's parameterized models for ``spec``'s model."""
    model = spec.model
    return model is not None and dialect == "cursor" and not model.variant


def offered_modes(session: Mapping[str, object]) -> list[str]:
    """The mode ids of a ``session/new`` (or ``session/load``) result's
    ``modes.availableModes``, in the agent's order."""
    modes = session.get("modes")
    listed = modes.get("availableModes") if isinstance(modes, Mapping) else None
    return [
        str(m["id"])
        for m in (listed if isinstance(listed, list) else [])
        if isinstance(m, Mapping) and isinstance(m.get("id"), str)
    ]


def check_mode(session: Mapping[str, object], mode: str) -> None:
    """Refuse a mode the agent did not offer, before asking for it.

    Raises:
        ModeUnavailable: ``mode`` is not among the offered ids (or none were offered).
    """
    offered = offered_modes(session)
    if mode in offered:
        return
    shown = [m[:100] for m in offered[:50]]  # the agent's strings: bounded
    raise ModeUnavailable(
        f"mode {mode!r} is not offered by the agent (it offers: {', '.join(shown) or 'none'})",
        mode=mode,
        available=shown,
    )


def initialized_data(init: Mapping[str, Any]) -> dict[str, Any]:
    caps = init.get("agentCapabilities")
    methods = init.get("authMethods")
    info = init.get("agentInfo")
    return {
        "protocol_version": int(init["protocolVersion"]),
        "agent_capabilities": dict(caps) if isinstance(caps, Mapping) else {},
        "auth_methods": [m for m in methods if isinstance(m, Mapping)]
        if isinstance(methods, list)
        else [],
        "agent_info": dict(info) if isinstance(info, Mapping) else None,
    }


def session_data(session_id: str, session: Mapping[str, object], resumed: bool) -> dict[str, Any]:
    def mapping(key: str) -> dict[str, object] | None:
        value = session.get(key)
        return dict(value) if isinstance(value, Mapping) else None

    options = session.get("configOptions")
    return {
        "session_id": session_id,
        "resumed": resumed,
        "modes": mapping("modes"),
        "models": mapping("models"),
        "config_options": options if isinstance(options, list) else None,
    }
