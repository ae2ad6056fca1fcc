"""A small asyncio JSON-RPC 2.0 connection over newline-delimited JSON (ACP's stdio).

Why our own and not the ``agent-client-protocol`` package's connection (whose schema
models check the worker's wire in the tests, not at run time: see :mod:`worker.rpc.wire`):

- Routing. The package routes an inbound request to a handler only when its method is
  one of the protocol's own or starts with ``_`` (an extension); anything else gets
  -32601. Cursor sends its ``cursor/*`` methods as *requests with ids* and stalls the
  turn when one fails. Here every inbound request reaches the handler registered for its
  exact method name; unknown methods get -32601.
- Timeouts per request. An agent may never answer (Cursor does not reply to input it
  cannot parse), so every outbound request carries its own bound (the prompt, which
  lasts as long as the turn, none). The package's requests wait unbounded; its only
  timeout is on the next message of the whole stream, which a long turn trips.
- Ordering. Notifications, and the acknowledgements Cursor's turn waits on, are handled
  in arrival order on the reader, so events keep the agent's order.
- A bounded line. The package keeps reading a line past its buffer limit (it joins
  the chunks), so an agent that never writes a newline grows the worker's memory
  without end; here a line over ``line_limit`` (8 MiB by default) is fatal. A line
  that is not JSON-RPC is reported to ``on_malformed`` (the job's notice), where the
  package only logs it; failures are typed (:mod:`worker.errors`) for the job to report.

How it behaves:

- Requests go both ways concurrently; each outbound request has its own timeout
  (a malformed input gets *no* reply from Cursor, so nothing may wait forever).
- Inbound notifications are dispatched in arrival order; inbound requests each run in
  their own task so a blocking question never stalls the stream — except handlers
  routed ``inline`` (quick acknowledgements), which run in arrival order too.
- A handler may return a :class:`Reply` to learn whether its answer reached the agent's
  stdin (durable interactions record a resolution only after the pipe write).
- A malformed line (not JSON, not an object, not JSON-RPC) is reported through
  ``on_malformed`` and skipped; a line longer than ``line_limit`` is fatal
  (:class:`LineTooLong`), because memory must stay bounded.
- A handler that raises (anything but :class:`RpcError`, which is an answer) ends the
  connection: ``closed`` resolves with the handler's :class:`WorkerError` (any other
  exception is wrapped in one and logged with its traceback), and every pending and
  later request raises it. The job then fails with that typed error at once, instead
  of waiting on a reader that is gone (an event sink that lost Redis, for instance).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import AgentExited, AgentTimeout, LineTooLong, ProtocolError, WorkerError
from worker.rpc.wire import JsonObject, JsonValue

log = logging.getLogger(__name__)

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000

#: ``handler(params)`` → the result, or a :class:`Reply`; raise :class:`RpcError` to refuse.
RequestHandler = Callable[[JsonValue], Awaitable["JsonValue | Reply"]]
NotificationHandler = Callable[[str, JsonValue], Awaitable[None]]
MalformedHandler = Callable[[str, str], Awaitable[None]]

_CHUNK = 256 * 1024


class RpcError(Exception):
    """A JSON-RPC error object, raised by handlers and by :meth:`Connection.request`."""

    def __init__(self, code: int, message: str, data: JsonValue = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    def to_wire(self) -> JsonObject:
        out: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


class _HandlerFailed(Exception):
    """A handler raised while the reader awaited it: the connection ends with ``reason``."""

    def __init__(self, reason: WorkerError) -> None:
        super().__init__(reason.message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's result plus ``after(sent)``, awaited once the write was attempted."""

    result: JsonValue
    after: Callable[[bool], Awaitable[None]]


class Connection:
    """One JSON-RPC peer reached through a reader/writer pair."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        line_limit: int = 8 * 1024 * 1024,
        request_timeout: float = 60.0,
        on_notification: NotificationHandler | None = None,
        on_malformed: MalformedHandler | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._line_limit = line_limit
        self._request_timeout = request_timeout
        self._on_notification = on_notification
        self._on_malformed = on_malformed
        self._handlers: dict[str, RequestHandler] = {}
        self._inline: set[str] = set()
        self._pending: dict[int, asyncio.Future[JsonValue]] = {}
        self._next_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def route(self, method: str, handler: RequestHandler, *, inline: bool = False) -> None:
        """Answer inbound requests for exactly ``method`` with ``handler(params)``.

        ``inline`` handlers run before the next line is read, so what they emit keeps
        its place in the stream; they must not wait on anything slow.
        """
        self._handlers[method] = handler
        if inline:
            self._inline.add(method)
        else:
            self._inline.discard(method)

    def start(self) -> None:
        self._reader_task = asyncio.create_task(self._read_loop(), name="acp-reader")

    # -- outbound -----------------------------------------------------------------

    async def request(
        self, method: str, params: JsonValue, *, timeout: float | None = -1
    ) -> JsonValue:
        """Send a request and wait for its result.

        ``timeout=None`` waits as long as the connection lives; the default is the
        connection's request timeout.

        Raises:
            RpcError: the peer answered with an error object.
            AgentTimeout: no answer within the timeout.
            AgentExited: the connection closed first (carries the close reason).
        """
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[JsonValue] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            )
            limit = self._request_timeout if timeout == -1 else timeout
            return await self._await_reply(future, method, limit)
        finally:
            self._pending.pop(request_id, None)

    async def _await_reply(
        self, future: asyncio.Future[JsonValue], method: str, limit: float | None
    ) -> JsonValue:
        closed = asyncio.ensure_future(asyncio.shield(self.closed))
        either: set[asyncio.Future[Any]] = {future, closed}  # two result types, one wait
        try:
            done, _ = await asyncio.wait(either, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if future in done:
            return future.result()
        if self.closed.done():
            raise self._closed_error(method)
        raise AgentTimeout(f"agent did not answer {method} within {limit:g} s", method=method)

    def _closed_error(self, method: str) -> BaseException:
        reason = self.closed.result()
        if isinstance(reason, WorkerError) and not isinstance(reason, AgentExited):
            return reason  # a line too long, a protocol error, a failed handler
        return AgentExited(f"agent closed the connection during {method}", method=method)

    async def notify(self, method: str, params: JsonValue) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _send(self, message: Mapping[str, JsonValue]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            if self.closed.done() or self._writer.is_closing():
                raise self._closed_error(str(message.get("method", "reply")))
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                self._close(AgentExited("agent stdin closed", error=str(exc)))
                raise self._closed_error(str(message.get("method", "reply"))) from exc

    # -- inbound ------------------------------------------------------------------

    async def _read_loop(self) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = await self._reader.read(_CHUNK)
                if not chunk:
                    break
                buffer += chunk
                buffer = await self._drain_lines(buffer)
                if len(buffer) > self._line_limit:
                    raise LineTooLong(
                        f"agent sent a line over {self._line_limit} bytes",
                        limit=self._line_limit,
                    )
            self._close(AgentExited("agent closed its stdout"))
        except (LineTooLong, ProtocolError) as exc:
            self._close(exc)
        except _HandlerFailed as exc:
            self._close(exc.reason)
        except (ConnectionError, OSError) as exc:
            self._close(AgentExited("agent stdout failed", error=str(exc)))

    async def _drain_lines(self, buffer: bytearray) -> bytearray:
        start = 0
        while (end := buffer.find(b"\n", start)) != -1:
            if end - start > self._line_limit:
                raise LineTooLong(
                    f"agent sent a line over {self._line_limit} bytes", limit=self._line_limit
                )
            line = bytes(buffer[start:end]).strip()
            start = end + 1
            if line:
                await self._dispatch(line)
        return buffer[start:]

    async def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError as exc:
            await self._malformed(line, f"not JSON: {exc}")
            return
        except RecursionError:  # "[[[[…" nested deeper than the parser's stack
            await self._malformed(line, "JSON nested too deeply")
            return
        if not isinstance(message, dict):
            await self._malformed(line, "not a JSON object")
        elif "method" in message and isinstance(message["method"], str):
            await self._inbound(message["method"], message)
        elif "id" in message and ("result" in message or "error" in message):
            await self._reply(message, line)
        else:
            await self._malformed(line, "not a JSON-RPC request, notification or response")

    async def _inbound(self, method: str, message: JsonObject) -> None:
        params = message.get("params")
        if "id" not in message:
            if self._on_notification is not None:
                await _handled(method, self._on_notification(method, params))
            return
        if method in self._inline:
            await _handled(method, self._answer(message["id"], method, params))
            return
        task = asyncio.create_task(self._answer_apart(message["id"], method, params))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer_apart(self, request_id: JsonValue, method: str, params: JsonValue) -> None:
        """``_answer`` in a task of its own, where a failure would otherwise go unseen."""
        try:
            await self._answer(request_id, method, params)
        except Exception as exc:  # any handler failure ends the connection, typed
            self._close(_handler_failure(method, exc))

    async def _answer(self, request_id: JsonValue, method: str, params: JsonValue) -> None:
        handler = self._handlers.get(method)
        reply: JsonObject = {"jsonrpc": "2.0", "id": request_id}
        after = None
        if handler is None:
            reply["error"] = RpcError(METHOD_NOT_FOUND, f'"Method not found": {method}').to_wire()
        else:
            try:
                result = await handler(params)
            except RpcError as exc:
                reply["error"] = exc.to_wire()
            else:
                if isinstance(result, Reply):
                    reply["result"], after = result.result, result.after
                else:
                    reply["result"] = result
        sent = False
        with contextlib.suppress(WorkerError):  # the connection is closed: nobody to tell
            await self._send(reply)
            sent = True
        if after is not None:
            await after(sent)

    async def _reply(self, message: JsonObject, line: bytes) -> None:
        request_id = message["id"]
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None or future.done():
            await self._malformed(line, "response to no pending request")
            return
        error = message.get("error")
        if error is not None:
            future.set_exception(_rpc_error(error))
        else:
            future.set_result(message.get("result"))

    async def _malformed(self, line: bytes, reason: str) -> None:
        if self._on_malformed is not None:
            preview = line[:512].decode("utf-8", "replace")
            await _handled("a malformed line", self._on_malformed(preview, reason))

    # -- lifecycle ----------------------------------------------------------------

    def _close(self, reason: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)

    async def aclose(self) -> None:
        """Stop reading and cancel inbound handlers; the process is not touched here."""
        self._close(AgentExited("connection closed by the client"))
        tasks = [t for t in (self._reader_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _handled(what: str, call: Awaitable[None]) -> None:
    """Await a handler on the reader; its failure ends the reading loop, typed."""
    try:
        await call
    except Exception as exc:  # any handler failure ends the connection, typed
        raise _HandlerFailed(_handler_failure(what, exc)) from exc


def _handler_failure(what: str, exc: Exception) -> WorkerError:
    """The typed reason a failed handler closes the connection with (logged here)."""
    if isinstance(exc, WorkerError):
        log.error("the handler of %s failed: %s [%s]", what, exc.message, exc.code)
        return exc
    log.exception("the handler of %s failed", what, exc_info=exc)
    return WorkerError(f"the handler of {what} failed: {exc!r}", method=what)


def _rpc_error(error: JsonValue) -> RpcError:
    if not isinstance(error, dict):
        return RpcError(INTERNAL_ERROR, "malformed error object", error)
    code = error.get("code")
    return RpcError(
        code if isinstance(code, int) else INTERNAL_ERROR,
        str(error.get("message", "")),
        error.get("data"),
    )
