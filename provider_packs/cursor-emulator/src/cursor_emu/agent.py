"""The ACP method router: what `agent acp` answers to each client message."""

from __future__ import annotations

import json
import os
import threading

from . import ambient, catalog, ids, scenario
from .models import ModelPicker
from .player import Player
from .rpc import RpcError, auth_required, method_not_found, session_not_found, zod_error
from .sessions import Session, SessionStore, iso_now
from .turn import Turn, TurnCancelled

# Every start imports this module and what it imports: the standard library's heavier
# modules (base64, urllib.parse, subprocess, pathlib, uuid, secrets, dataclasses, typing)
# are imported where a rare path needs them, or not at all (see ids.py); so are the
# emulator's own modules that initialize, session/new and session/prompt do not need
# (LATER, player.ACTION_VERBS).
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .rpc import Transport

    JSON = dict[str, Any]

NO_REPLY = object()  # A handler that answers by itself (later, or before side effects).
SCENARIO_PREFIX = "scenario:"
INLINE_SHEBANG = "#!scenario"
UNSUPPORTED = ("session/fork", "session/resume", "session/close")
#: Methods whose code is in another module (its METHODS), imported on the first call.
LATER = {
    "authenticate": "options",
    "session/load": "history",
    "session/list": "history",
    "session/set_mode": "options",
    "session/set_config_option": "options",
    "session/set_model": "options",
    "cursor/list_available_models": "options",
}


class Settings:
    """What the environment says, read once at start."""

    __slots__ = (
        "authenticated",
        "home",
        "commands_delay",
        "chunk_delay",
        "exit_delay",
        "prompt_capabilities",
    )

    def __init__(
        self,
        *,
        authenticated: bool,
        home: str | None,
        commands_delay: float,
        chunk_delay: float,
        exit_delay: float,
        prompt_capabilities: JSON,
    ) -> None:
        self.authenticated = authenticated
        self.home = home
        self.commands_delay = commands_delay
        self.chunk_delay = chunk_delay
        self.exit_delay = exit_delay
        #: Overrides of Cursor's promptCapabilities (FACTS §2: image true, audio and
        #: embeddedContext false), so a client's refusal path can be tested too.
        self.prompt_capabilities = prompt_capabilities

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            authenticated=bool(env.get("CURSOR_API_KEY") or env.get("CURSOR_AUTH_TOKEN")),
            home=env.get("HOME") or None,
            commands_delay=_float(env.get("CURSOR_EMULATOR_COMMANDS_DELAY"), 0.05),
            chunk_delay=_float(env.get("CURSOR_EMULATOR_CHUNK_DELAY"), 0.002),
            exit_delay=_float(env.get("CURSOR_EMULATOR_EXIT_DELAY"), 0.0),
            prompt_capabilities=_bool_map(env.get("CURSOR_EMULATOR_PROMPT_CAPABILITIES")),
        )


def _float(value: str | None, default: float) -> float:
    try:
        return max(0.0, float(value)) if value else default
    except ValueError:
        return default


def _bool_map(value: str | None) -> JSON:
    try:
        parsed = json.loads(value) if value else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {k: v for k, v in parsed.items() if isinstance(v, bool)}


class Agent:
    def __init__(self, transport: Transport, settings: Settings) -> None:
        self.transport = transport
        self.settings = settings
        self.picker = ModelPicker()
        self.store = SessionStore(settings.home)
        self.subagents = False
        self.chunk_delay = settings.chunk_delay
        self.home = settings.home
        self.ignore_sigterm = False
        self.prompt_capabilities: JSON = {}
        self._methods: dict[str, Callable[[Any, JSON], Any]] = {
            "initialize": self.initialize,
            "session/new": self.session_new,
            "session/prompt": self.prompt,
        }

    # --- message dispatch ---------------------------------------------------------------

    def handle_line(self, raw: bytes) -> None:
        """One input line. Anything malformed is dropped without a word (FACTS §3)."""
        try:
            msg = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return
        if not isinstance(msg, dict):
            return
        method = msg.get("method")
        if isinstance(method, str):
            if "id" in msg:
                self.handle_request(msg["id"], method, msg.get("params"))
            else:
                self.handle_notification(method, msg.get("params"))
        elif "id" in msg and ("result" in msg or "error" in msg):
            self.transport.deliver(msg)

    def method(self, name: str) -> Callable[[Any, JSON], Any] | None:
        """The handler of method `name`; one in LATER imports its module on first call."""
        handler = self._methods.get(name)
        if handler is None and name in LATER:
            if LATER[name] == "history":
                from .history import METHODS
            else:
                from .options import METHODS
            later = METHODS[name]
            handler = self._methods[name] = lambda rid, params: later(self, rid, params)
        return handler

    def handle_request(self, request_id: Any, method: str, params: Any) -> None:
        try:
            handler = self.method(method)
            if handler is None:
                raise method_not_found(method)
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise zod_error("", "Expected object, received " + type(params).__name__)
            result = handler(request_id, params)
        except RpcError as err:
            self.transport.respond_error(request_id, err)
            return
        except Exception as exc:  # An emulator bug must answer, never kill the agent.
            self.transport.respond_error(
                request_id, RpcError(-32603, "Internal error", {"details": repr(exc)})
            )
            return
        if result is not NO_REPLY:
            self.transport.respond(request_id, result)

    def handle_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel" and isinstance(params, dict):
            session = self.store.get_live(params.get("sessionId"))
            if session is not None:
                with session.lock:
                    turn = session.active
                if turn is not None:
                    turn.cancel()

    def emit(self, session: Session, update: JSON) -> None:
        session.record(update)
        self.transport.notify("session/update", {"sessionId": session.session_id, "update": update})

    def set_ignore_sigterm(self) -> None:
        self.ignore_sigterm = True

    # --- helpers ------------------------------------------------------------------------

    def require_auth(self) -> None:
        if not self.settings.authenticated:
            raise auth_required()

    def live_session(self, params: JSON) -> Session:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            raise zod_error("sessionId", "Required")
        session = self.store.get_live(session_id)
        if session is None:
            raise session_not_found(session_id)
        return session

    def config_options(self, session: Session) -> list[JSON]:
        modes = catalog.select_option(
            "mode",
            "Mode",
            "mode",
            session.mode,
            [{"value": m["id"], "name": m["name"]} for m in catalog.MODES],
        )
        return [modes, *self.picker.config_options()]

    def session_state(self, session: Session) -> JSON:
        return {
            "modes": catalog.modes_state(session.mode),
            "models": self.picker.models_state(),
            "configOptions": self.config_options(session),
        }

    # --- methods ------------------------------------------------------------------------

    def initialize(self, _rid: Any, params: JSON) -> JSON:
        caps = params.get("clientCapabilities")
        meta = caps.get("_meta") if isinstance(caps, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        self.subagents = catalog.js_truthy(meta.get("subagents"))
        self.picker.configure(catalog.js_truthy(meta.get("parameterizedModelPicker")))
        result = catalog.initialize_result(caps)
        result["agentCapabilities"]["promptCapabilities"].update(
            self.settings.prompt_capabilities
        )
        self.prompt_capabilities = dict(result["agentCapabilities"]["promptCapabilities"])
        return result

    def session_new(self, rid: Any, params: JSON) -> Any:
        self.require_auth()
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise zod_error("cwd", "Expected an absolute path")
        if not isinstance(params.get("mcpServers", []), list):
            raise zod_error("mcpServers", "Expected array")
        session = Session(session_id=ids.uuid4(), cwd=cwd)
        self.store.add(session)
        ambient.run_ambient_config(cwd)
        self.transport.respond(
            rid, {"sessionId": session.session_id, **self.session_state(session)}
        )
        # Pushed once, a little after the result (FACTS §7).
        timer = threading.Timer(self.settings.commands_delay, self.push_commands, (session,))
        timer.daemon = True
        timer.start()
        return NO_REPLY

    def push_commands(self, session: Session) -> None:
        """Send the command list once: after the timer, or before the first turn's output
        when a prompt arrives sooner (the real agent's ~0.7 s push precedes its ~0.9 s
        title), so the stream order never depends on a race."""
        with session.lock:
            if session.commands_pushed:
                return
            session.commands_pushed = True
        update = {
            "sessionUpdate": "available_commands_update",
            "availableCommands": [dict(c) for c in catalog.AVAILABLE_COMMANDS],
        }
        self.transport.notify("session/update", {"sessionId": session.session_id, "update": update})

    def prompt(self, rid: Any, params: JSON) -> Any:
        session = self.live_session(params)
        blocks = params.get("prompt")
        if not isinstance(blocks, list):
            raise zod_error("prompt", "Expected array")
        refused = refused_block(blocks, self.prompt_capabilities)
        if refused is not None:
            raise zod_error(*refused)
        text = prompt_text(blocks)
        self.push_commands(session)
        turn = Turn(
            {
                "prompt": text,
                "cwd": session.cwd,
                "sessionId": session.session_id,
                "blocks": json.dumps(
                    prompt_media(blocks, session.cwd), separators=(",", ":"), sort_keys=True
                ),
            }
        )
        # Swap the active turn here, in the reader loop, so two prompts sent back to back
        # cancel in arrival order (FACTS §6: the new prompt cancels the running one).
        with session.lock:
            previous = session.active_thread
            if session.active is not None:
                session.active.cancel()
            thread = threading.Thread(
                target=self.run_turn, args=(rid, session, blocks, turn, previous), daemon=True
            )
            session.active, session.active_thread = turn, thread
        thread.start()
        return NO_REPLY

    # --- the turn -----------------------------------------------------------------------

    def run_turn(
        self,
        rid: Any,
        session: Session,
        blocks: list[Any],
        turn: Turn,
        previous: threading.Thread | None,
    ) -> None:
        if previous is not None:
            previous.join(timeout=5)  # The cancelled turn answers before this one starts.
        try:
            reason = self.play_turn(session, turn, blocks, prompt_text(blocks))
        except TurnCancelled:
            reason = "cancelled"
        except Exception as exc:  # The prompt is answered whatever happens.
            self.finish_turn(session, turn)
            self.transport.respond_error(
                rid, RpcError(-32603, "Internal error", {"details": repr(exc)})
            )
            return
        self.finish_turn(session, turn)
        self.transport.respond(rid, {"stopReason": reason})

    def play_turn(self, session: Session, turn: Turn, blocks: list[Any], text: str) -> str:
        session.turns.append([])
        for block in blocks:
            # Never echoed live; kept so load can replay it (FACTS §3), images too (S0).
            if isinstance(block, dict) and block.get("type") in ("text", "image"):
                session.record({"sessionUpdate": "user_message_chunk", "content": dict(block)})
        ambient.run_ambient_config(session.cwd)
        player = Player(self, session, turn)
        if session.title is None:
            player.do_title(make_title(text))
        try:
            steps = choose_scenario(text)
        except scenario.ScenarioError as exc:
            player.do_error_text(f"Scenario error: {exc}")
            return "cancelled" if turn.cancelled else "end_turn"
        return player.play(steps)

    def finish_turn(self, session: Session, turn: Turn) -> None:
        session.updated_at = iso_now()
        self.store.persist(session)
        with session.lock:
            if session.active is turn:
                session.active, session.active_thread = None, None


def prompt_text(blocks: list[Any]) -> str:
    parts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return "\n".join(p for p in parts if isinstance(p, str))


#: Block type → the promptCapabilities key it needs (text and resource_link: baseline).
BLOCK_CAPABILITIES = {"image": "image", "audio": "audio"}
#: A linked project file is inlined, cut at this many characters (FACTS §6).
LINK_INLINE_CHARS = 20_000


def refused_block(blocks: list[Any], capabilities: JSON) -> tuple[str, str] | None:
    """A block the agent did not advertise taking: its schema refuses it. An embedded
    `resource` is inlined as text although embeddedContext is false (FACTS §6, R1)."""
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        needed = BLOCK_CAPABILITIES.get(str(kind))
        if needed is not None and capabilities.get(needed) is not True:
            return str(index), f"Invalid input: {kind} content is not supported"
    return None


def prompt_media(blocks: list[Any], cwd: str) -> list[JSON]:
    """What the turn received besides text (the `{{blocks}}` variable): images by type
    and decoded size, links and resources with the text they were inlined as."""
    out = []
    for block in blocks:
        if not isinstance(block, dict) or block.get("type") == "text":
            continue
        kind = block.get("type")
        if kind == "image":
            import base64  # Not every start: few prompts carry an image.

            try:
                size = len(base64.b64decode(str(block.get("data", "")), validate=True))
            except ValueError:
                size = -1
            out.append({"type": kind, "mimeType": block.get("mimeType"), "bytes": size})
        elif kind == "resource_link":
            uri = str(block.get("uri", ""))
            out.append({"type": kind, "uri": uri, "text": _linked_text(uri, cwd)})
        else:
            out.append({"type": str(kind)})
    return out


def _linked_text(uri: str, cwd: str) -> str | None:
    """A project file's text, as Cursor inlines a link (None: not a readable project file)."""
    from urllib.parse import unquote  # Not every start: few prompts carry a link.

    path = unquote(uri[len("file://") :]) if uri.startswith("file://") else uri
    root = os.path.realpath(cwd)
    target = os.path.realpath(os.path.join(cwd, path))
    if not target.startswith(root + os.sep):
        return None
    try:
        with open(target, encoding="utf-8", errors="replace") as handle:
            return handle.read(LINK_INLINE_CHARS)
    except OSError:
        return None


def make_title(text: str) -> str:
    words = text.replace(INLINE_SHEBANG, "").split()
    return " ".join(words[:6])[:60] or "New chat"


def choose_scenario(text: str) -> list[scenario.Step]:
    stripped = text.strip()
    first_line, _, rest = text.lstrip().partition("\n")
    if first_line.strip() == INLINE_SHEBANG:
        return scenario.parse(rest)
    if stripped.startswith(SCENARIO_PREFIX) and "\n" not in stripped:
        return scenario.load_named(stripped[len(SCENARIO_PREFIX) :].strip())
    return scenario.load_named("default")
