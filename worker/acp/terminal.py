"""``terminal/*``: commands the agent asks the client to run, run inside the job's own
sandbox (``Sandbox.spawn``), with stdin closed and output bounded.

Output keeps the *last* ``outputByteLimit`` bytes (capped by the worker), as ACP
specifies, and says whether it was cut. At most ``MAX_TERMINALS`` live at once; every
one is killed when the job ends.

Requests and replies are plain JSON (the ``acp.schema`` models are not imported at run
time: :mod:`worker.acp.client` says why); ``tests/unit/test_acp_schema.py`` checks the
replies against the schema. One deviation is kept on purpose: the schema types the exit
status's ``signal`` as a string (a signal name) while the worker has always sent the
signal's number, and changing it is a wire change for agents that read it. The params
are read field by field: the request models would require a ``sessionId`` (never needed
here: the sandbox is the job's) and drop an ``env`` entry without a ``value``, which
this handler sets to "".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import posixpath
from collections.abc import Mapping

from worker.errors import SandboxError
from worker.rpc.connection import INVALID_PARAMS, Connection, RpcError
from worker.rpc.wire import JsonObject, JsonValue
from worker.sandbox.base import HOME, WORKSPACE, Sandbox, SandboxProcess

MAX_TERMINALS = 8
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8"}


class _Terminal:
    def __init__(self, process: SandboxProcess, limit: int) -> None:
        self.process = process
        self.limit = limit
        self.buffer = bytearray()
        self.truncated = False
        self.readers = [
            asyncio.create_task(self._drain(process.stdout)),
            asyncio.create_task(self._drain(process.stderr)),
        ]

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.buffer += chunk
            if len(self.buffer) > self.limit:
                del self.buffer[: len(self.buffer) - self.limit]
                self.truncated = True

    def output(self) -> str:
        return bytes(self.buffer).decode("utf-8", "ignore" if self.truncated else "replace")

    def exit_status(self) -> JsonObject | None:
        code = self.process.returncode
        if code is None:
            return None
        return {"exitCode": code if code >= 0 else None, "signal": None if code >= 0 else -code}

    async def wait(self) -> JsonObject:
        await self.process.wait()
        await asyncio.gather(*self.readers, return_exceptions=True)
        status = self.exit_status()
        assert status is not None
        return status

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.wait(), 5.0)
        for reader in self.readers:
            reader.cancel()


class Terminals:
    """The terminals of one job."""

    def __init__(self, sandbox: Sandbox, *, output_limit: int) -> None:
        self._sandbox = sandbox
        self._limit = output_limit
        self._live: dict[str, _Terminal] = {}
        self._ids = itertools.count(1)

    def register(self, connection: Connection) -> None:
        connection.route("terminal/create", self.create)
        connection.route("terminal/output", self.output)
        connection.route("terminal/wait_for_exit", self.wait_for_exit)
        connection.route("terminal/kill", self.kill)
        connection.route("terminal/release", self.release)

    async def create(self, params: JsonValue) -> JsonObject:
        """Start the command; returns ``{terminalId}``.

        Raises:
            RpcError: -32602 for malformed params or a cwd outside the workspace,
                -32603 when too many terminals are live or the sandbox refused.
        """
        argv, env, cwd, limit = self._parse(params)
        if len(self._live) >= MAX_TERMINALS:
            raise RpcError(-32603, "Internal error", {"message": "too many terminals"})
        try:
            process = await self._sandbox.spawn(argv, env=env, cwd=cwd)
        except SandboxError as exc:
            raise RpcError(-32603, "Internal error", {"message": exc.message}) from None
        process.stdin.close()
        terminal_id = f"term-{next(self._ids)}"
        self._live[terminal_id] = _Terminal(process, limit)
        return {"terminalId": terminal_id}

    def _parse(self, params: JsonValue) -> tuple[list[str], dict[str, str], str, int]:
        command = params.get("command") if isinstance(params, Mapping) else None
        if not isinstance(params, Mapping) or not isinstance(command, str):
            raise _invalid("command is required")
        args = params.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _invalid("args must be strings")
        env = dict(BASE_ENV)
        for item in _items(params.get("env")):
            name = item.get("name") if isinstance(item, Mapping) else None
            if isinstance(item, Mapping) and isinstance(name, str):
                env[name] = str(item.get("value", ""))
        requested = params.get("outputByteLimit")
        limit = (
            min(requested, self._limit)
            if isinstance(requested, int) and requested > 0
            else self._limit
        )
        return [command, *(str(a) for a in args)], env, _cwd(params.get("cwd")), limit

    def _get(self, params: JsonValue) -> tuple[str, _Terminal]:
        terminal_id = params.get("terminalId") if isinstance(params, Mapping) else None
        terminal = self._live.get(terminal_id) if isinstance(terminal_id, str) else None
        if terminal is None or not isinstance(terminal_id, str):
            raise _invalid("unknown terminalId")
        return terminal_id, terminal

    async def output(self, params: JsonValue) -> JsonObject:
        _, terminal = self._get(params)
        return {
            "output": terminal.output(),
            "truncated": terminal.truncated,
            "exitStatus": terminal.exit_status(),
        }

    async def wait_for_exit(self, params: JsonValue) -> JsonObject:
        _, terminal = self._get(params)
        return await terminal.wait()

    async def kill(self, params: JsonValue) -> JsonObject:
        _, terminal = self._get(params)
        if terminal.process.returncode is None:
            terminal.process.kill()
        return {}

    async def release(self, params: JsonValue) -> JsonObject:
        terminal_id, terminal = self._get(params)
        del self._live[terminal_id]
        await terminal.close()
        return {}

    async def close_all(self) -> None:
        live, self._live = list(self._live.values()), {}
        for terminal in live:
            await terminal.close()


def _items(value: JsonValue) -> list[JsonValue]:
    """``env``'s entries; anything but a list has none (a string's or an object's items
    were never entries, and a number no longer fails the handler)."""
    return value if isinstance(value, list) else []


def _cwd(value: JsonValue) -> str:
    if value is None:
        return WORKSPACE
    if not isinstance(value, str) or ".." in value.split("/"):
        raise _invalid("cwd must be inside the workspace")
    cwd = posixpath.normpath(value if value.startswith("/") else f"{WORKSPACE}/{value}")
    if cwd != WORKSPACE and not cwd.startswith(WORKSPACE + "/"):
        raise _invalid("cwd must be inside the workspace")
    return cwd


def _invalid(message: str) -> RpcError:
    return RpcError(INVALID_PARAMS, "Invalid params", {"message": message})
