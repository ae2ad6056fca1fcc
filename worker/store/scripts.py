"""The Lua programs that make leases, fencing and settling atomic.

The programs are package data (``worker/store/lua/*.lua``), read once at import. Each is
registered once per Redis client (:func:`bound`): redis-py then runs it by its SHA
(``EVALSHA``) and loads it again only if the server forgot it, instead of sending its
source with every call.

Every per-job program touches only keys of one job (one Redis Cluster slot, thanks to
the ``{J}`` hash tag); the global ``acpw:leases`` index is updated outside them, as a
hint for the reaper, never as the source of truth. Key order for the per-job programs:
``lease``, ``state``, ``events``, ``control``, ``settled`` (``PUT_INTERACTION``: ``lease``,
``interactions``). The state hash fields they write are listed in
:mod:`worker.store.fields`. The events stream is bounded by trimming, never by
``XADD ... MAXLEN``: see ``lua/trim.lua``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@dataclass(frozen=True, slots=True)
class Program:
    """One Lua program: its name (the file under ``lua/``) and its full source."""

    name: str
    source: str


def _program(name: str, *preludes: str) -> Program:
    return Program(name, "".join(_read(part) for part in (*preludes, name)))


ACQUIRE = _program("acquire", "terminal")
RENEW = _program("renew")
RELEASE = _program("release")
APPEND = _program("append", "terminal", "trim", "hand_back")
MARK_LOST = _program("mark_lost", "terminal", "trim")
SUBMIT = _program("submit", "terminal")
ENQUEUE = _program("enqueue", "terminal")
REFUSE = _program("refuse")
PUT_INTERACTION = _program("put_interaction")
WARM_CLAIM = _program("warm_claim")
WARM_RENEW = _program("warm_renew")
WARM_RETIRE = _program("warm_retire")

PROGRAMS = (
    ACQUIRE,
    RENEW,
    RELEASE,
    APPEND,
    MARK_LOST,
    SUBMIT,
    ENQUEUE,
    REFUSE,
    PUT_INTERACTION,
    WARM_CLAIM,
    WARM_RENEW,
    WARM_RETIRE,
)

_registered: weakref.WeakKeyDictionary[Any, dict[str, object]] = weakref.WeakKeyDictionary()


def bound(client: aioredis.Redis, program: Program) -> AsyncScript:
    """``program`` registered with the asyncio ``client`` (once per client)."""
    script: AsyncScript = _bind(client, program)
    return script


def bound_sync(client: redis.Redis, program: Program) -> Script:
    """``program`` registered with the synchronous ``client`` (once per client)."""
    script: Script = _bind(client, program)
    return script


def _bind(client: Any, program: Program) -> Any:
    scripts = _registered.setdefault(client, {})
    script = scripts.get(program.name)
    if script is None:
        script = scripts[program.name] = client.register_script(program.source)
    return script
