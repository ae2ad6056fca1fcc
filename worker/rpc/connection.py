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
  without end; here a line over ``line_limit`` (8 MiB by default) is skipped as it
  streams (see below). A line that is not JSON-RPC is reported to ``on_malformed`` (the
  job's notice), where the package only logs it; failures are typed
  (:mod:`worker.errors`) for the job to report.

How it behaves:

- Requests go both ways concurrently; each outbound request has its own timeout
  (a malformed input gets *no* reply from Cursor, so nothing may wait forever).
- Inbound notifications are dispatched in arrival order; inbound requests each run in
  their own task so a blocking question never stalls the stream — except handlers
  routed ``inline`` (quick acknowledgements), which run in arrival order too.
- A handler may return a :class:`Reply` to learn whether its answer reached the agent's
  stdin (durable interactions record a resolution only after the pipe write).
- A malformed line (not JSON, not an object, not JSON-RPC) is reported through
  ``on_malformed`` and skipped.
- A line longer than ``line_limit`` is skipped without ever being held: its first
  16 KiB are kept, the rest is counted and discarded up to the next newline, and it is
  reported to ``on_oversize`` as an :class:`~worker.rpc.oversize.OversizeLine` (its size
  and what its prefix tells: method, id, a tool update's fields and output preview).
  Reading goes on. An oversize *request* whose id the prefix shows is answered -32600,
  so the agent does not wait on it; an oversize *response* to a pending request fails
  that request with :class:`LineTooLong` (its result is lost), and only that request.
- A reply to a request the worker stopped waiting for (timed out, or cancelled with
  its caller: the prompt after a cancel's grace) is a *late reply*: the last 256 such
  ids are remembered, and a reply to one is logged at debug level naming the id and the
  method, not reported as malformed.
- Any other reply that matches no pending request is a *stray reply*, reported through
  ``on_stray_reply`` as a :class:`StrayReply` (a valid JSON-RPC reply, not a malformed
  line): a *duplicate* (its id was sent and answered already; the method is named while
  it is among the last 256 requests) or one to an id never sent. It is skipped.
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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import AgentExited, AgentTimeout, LineTooLong, ProtocolError, WorkerError
from worker.rpc.oversize import LineSplitter, OversizeLine
from worker.rpc.wire import JsonObject, JsonValue

log = logging.getLogger(__name__)

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000

#: ``handler(params)`` → the result, or a :class:`Reply`; raise :class:`RpcError` to refuse.
RequestHandler = Callable[[JsonValue], Awaitable["JsonValue | Reply"]]
NotificationHandler = Callable[[str, JsonValue], Awaitable[None]]
MalformedHandler = Callable[[str, str], Awaitable[None]]
OversizeHandler = Callable[[OversizeLine], Awaitable[None]]
StrayReplyHandler = Callable[["StrayReply"], Awaitable[None]]

_CHUNK = 256 * 1024
#: How many abandoned request ids are remembered to recognise their late replies, and how
#: many sent ones to name the method a duplicate reply answers.
_ABANDONED = 256


@dataclass(frozen=True, slots=True)
class StrayReply:
    """A reply to no pending request that is not a late one: ``duplicate`` when its id
    was sent (and answered already), else an id the connection never sent. ``method``:
    the request it answers again, when remembered."""

    id: JsonValue
    duplicate: bool
    method: str | None = None


class RpcError(WorkerError):
    """A JSON-RPC error object, raised by handlers and by :meth:`Connection.request`;
    ``rpc_code`` is its JSON-RPC ``code`` (``code`` is the package's, ``rpc_error``)."""

    code = "rpc_error"

    def __init__(self, rpc_code: int, message: str, data: JsonValue = None) -> None:
        super().__init__(message, rpc_code=rpc_code)
        self.args = (f"{rpc_code}: {message}",)
        self.rpc_code = rpc_code
        self.data = data

    def to_wire(self) -> JsonObject:
        out: JsonObject = {"code": self.rpc_code, "message": self.message}
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


class _Outbox:
    """The write side: one writer behind a lock, and why the connection closed.

    ``closed`` is shared by everything that must stop once the peer is gone: a send
    after it raises the close reason instead of writing.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()
        self.closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def send(self, message: Mapping[str, JsonValue]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            if self.closed.done() or self._writer.is_closing():
                raise self.closed_error(str(message.get("method", "reply")))
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, RuntimeError) as exc:
                self.close(AgentExited("agent stdin closed", error=str(exc)))
                raise self.closed_error(str(message.get("method", "reply"))) from exc

    def close(self, reason: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)

    def closed_error(self, method: str) -> BaseException:
        reason = self.closed.result()
        if isinstance(reason, WorkerError) and not isinstance(reason, AgentExited):
            return reason  # a line too long, a protocol error, a failed handler
        return AgentExited(f"agent closed the connection during {method}", method=method)


class _Requests:
    """Outbound requests awaiting their replies, each with its own timeout."""

    def __init__(self, outbox: _Outbox, *, request_timeout: float) -> None:
        self._outbox = outbox
        self._request_timeout = request_timeout
        self._pending: dict[int, asyncio.Future[JsonValue]] = {}
        self._abandoned: OrderedDict[int, str] = OrderedDict()  # id → method, oldest first
        self._sent: OrderedDict[int, str] = OrderedDict()  # the last requests: id → method
        self._next_id = 0

    async def request(self, method: str, params: JsonValue, *, timeout: float | None) -> JsonValue:
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[JsonValue] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._sent[request_id] = method
        if len(self._sent) > _ABANDONED:
            self._sent.popitem(last=False)
        try:
            await self._outbox.send(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            )
            limit = self._request_timeout if timeout == -1 else timeout
            return await self._await_reply(future, method, limit)
        finally:
            self._pending.pop(request_id, None)
            if not future.done():  # timed out, or its caller cancelled: a reply is late
                self._abandoned[request_id] = method
                if len(self._abandoned) > _ABANDONED:
                    self._abandoned.popitem(last=False)

    async def _await_reply(
        self, future: asyncio.Future[JsonValue], method: str, limit: float | None
    ) -> JsonValue:
        closed = asyncio.ensure_future(asyncio.shield(self._outbox.closed))
        either: set[asyncio.Future[Any]] = {future, closed}  # two result types, one wait
        try:
            done, _ = await asyncio.wait(either, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if future in done:
            return future.result()
        if self._outbox.closed.done():
            raise self._outbox.closed_error(method)
        raise AgentTimeout(f"agent did not answer {method} within {limit:g} s", method=method)

    def resolve(self, message: JsonObject) -> bool:
        """Complete the request ``message`` answers; False when none is pending."""
        future = self._future(message["id"])
        if future is None:
            return False
        error = message.get("error")
        if error is not None:
            future.set_exception(_rpc_error(error))
        else:
            future.set_result(message.get("result"))
        return True

    def fail(self, request_id: JsonValue, reason: WorkerError) -> bool:
        """Fail the pending request ``request_id`` with ``reason``; False when none is."""
        future = self._future(request_id)
        if future is not None:
            future.set_exception(reason)
        return future is not None

    def late(self, request_id: JsonValue) -> str | None:
        """The method of the abandoned request ``request_id`` (forgotten now), if it was
        one: its reply came after the worker stopped waiting."""
        if not isinstance(request_id, int):
            return None
        return self._abandoned.pop(request_id, None)

    def stray(self, request_id: JsonValue) -> StrayReply:
        """What a reply to no pending request that is not a late one is."""
        if type(request_id) is not int or not 0 <= request_id < self._next_id:
            return StrayReply(id=request_id, duplicate=False)
        return StrayReply(id=request_id, duplicate=True, method=self._sent.get(request_id))

    def _future(self, request_id: JsonValue) -> asyncio.Future[JsonValue] | None:
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        return None if future is None or future.done() else future


@dataclass(frozen=True, slots=True)
class _Callbacks:
    """What the reader reports besides requests: notifications, malformed and oversize
    lines, stray replies."""

    on_notification: NotificationHandler | None
    on_malformed: MalformedHandler | None
    on_oversize: OversizeHandler | None = None
    on_stray_reply: StrayReplyHandler | None = None


class _Reader:
    """The read side: bounded lines → replies, notifications and inbound requests."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        *,
        outbox: _Outbox,
        requests: _Requests,
        line_limit: int,
        callbacks: _Callbacks,
    ) -> None:
        self._reader = reader
        self._outbox = outbox
        self._requests = requests
        self._line_limit = line_limit
        self._callbacks = callbacks
        self.handlers: dict[str, RequestHandler] = {}
        self.inline: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def read_loop(self) -> None:
        lines = LineSplitter(self._line_limit)
        try:
            while True:
                chunk = await self._reader.read(_CHUNK)
                if not chunk:
                    break
                for line in lines.feed(chunk):
                    if isinstance(line, bytes):
                        await self._dispatch(line)
                    else:
                        await self._oversize(line)
            if (cut := lines.end()) is not None:
                await self._oversize(cut)
            self._outbox.close(AgentExited("agent closed its stdout"))
        except ProtocolError as exc:
            self._outbox.close(exc)
        except _HandlerFailed as exc:
            self._outbox.close(exc.reason)
        except (ConnectionError, OSError) as exc:
            self._outbox.close(AgentExited("agent stdout failed", error=str(exc)))

    async def _oversize(self, line: OversizeLine) -> None:
        """A skipped line: the request it answers fails, the request it is gets -32600;
        then it is reported."""
        what = f"a line of {line.size} bytes, over the {line.limit}-byte bound"
        if line.kind == "response":
            self._requests.late(line.id)  # a late reply, if it is one, is forgotten
            self._requests.fail(
                line.id,
                LineTooLong(f"agent answered with {what}", limit=line.limit, bytes=line.size),
            )
        elif line.kind == "request" and line.id is not None:
            refusal = RpcError(INVALID_REQUEST, f"request skipped unread: {what}")
            reply: JsonObject = {"jsonrpc": "2.0", "id": line.id, "error": refusal.to_wire()}
            with contextlib.suppress(WorkerError):  # the connection is closed: nobody to tell
                await self._outbox.send(reply)
        on_oversize = self._callbacks.on_oversize
        if on_oversize is None:
            log.warning("skipped %s (%s %.256s)", what, line.kind, line.method or "")
        else:
            await _handled("an oversize line", on_oversize(line))

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
            if self._requests.resolve(message):
                return
            method = self._requests.late(message["id"])
            if method is None:
                await self._stray(self._requests.stray(message["id"]))
            else:
                log.debug("a late reply to %s (id %s), which was abandoned", method, message["id"])
        else:
            await self._malformed(line, "not a JSON-RPC request, notification or response")

    async def _inbound(self, method: str, message: JsonObject) -> None:
        params = message.get("params")
        if "id" not in message:
            on_notification = self._callbacks.on_notification
            if on_notification is not None:
                await _handled(method, on_notification(method, params))
            return
        if method in self.inline:
            await _handled(method, self._answer(message["id"], method, params))
            return
        task = asyncio.create_task(self._answer_apart(message["id"], method, params))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer_apart(self, request_id: JsonValue, method: str, params: JsonValue) -> None:
        """``_answer`` in a task of its own, where a failure would otherwise go unseen."""
        try:
            await self._answer(request_id, method, params)
        except Exception as exc:  # any handler failure ends the connection, typed
            self._outbox.close(_handler_failure(method, exc))

    async def _answer(self, request_id: JsonValue, method: str, params: JsonValue) -> None:
        reply, after = await self._reply(request_id, method, params)
        sent = False
        with contextlib.suppress(WorkerError):  # the connection is closed: nobody to tell
            await self._outbox.send(reply)
            sent = True
        if after is not None:
            await after(sent)

    async def _reply(
        self, request_id: JsonValue, method: str, params: JsonValue
    ) -> tuple[JsonObject, Callable[[bool], Awaitable[None]] | None]:
        """The reply to an inbound request, and the handler's ``after`` if it gave one."""
        handler = self.handlers.get(method)
        reply: JsonObject = {"jsonrpc": "2.0", "id": request_id}
        if handler is None:
            reply["error"] = RpcError(METHOD_NOT_FOUND, f'"Method not found": {method}').to_wire()
            return reply, None
        try:
            result = await handler(params)
        except RpcError as exc:
            reply["error"] = exc.to_wire()
            return reply, None
        if isinstance(result, Reply):
            reply["result"] = result.result
            return reply, result.after
        reply["result"] = result
        return reply, None

    async def _stray(self, reply: StrayReply) -> None:
        on_stray_reply = self._callbacks.on_stray_reply
        if on_stray_reply is None:
            what = "a duplicate reply" if reply.duplicate else "a reply to an id never sent"
            log.warning("skipped %s (id %.64r, %s)", what, reply.id, reply.method)
        else:
            await _handled("a stray reply", on_stray_reply(reply))

    async def _malformed(self, line: bytes, reason: str) -> None:
        on_malformed = self._callbacks.on_malformed
        if on_malformed is not None:
            preview = line[:512].decode("utf-8", "replace")
            await _handled("a malformed line", on_malformed(preview, reason))


class Connection:
    """One JSON-RPC peer reached through a reader/writer pair.

    The write side (:class:`_Outbox`), the requests awaiting replies
    (:class:`_Requests`) and the reader with its dispatch (:class:`_Reader`) are its
    parts; this is the surface the ACP client uses.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        line_limit: int = 8 * 1024 * 1024,
        request_timeout: float = 60.0,
        on_notification: NotificationHandler | None = None,
        on_malformed: MalformedHandler | None = None,
        on_oversize: OversizeHandler | None = None,
        on_stray_reply: StrayReplyHandler | None = None,
    ) -> None:
        self._outbox = _Outbox(writer)
        self._requests = _Requests(self._outbox, request_timeout=request_timeout)
        self._reader = _Reader(
            reader,
            outbox=self._outbox,
            requests=self._requests,
            line_limit=line_limit,
            callbacks=_Callbacks(on_notification, on_malformed, on_oversize, on_stray_reply),
        )
        self._reader_task: asyncio.Task[None] | None = None
        self.closed: asyncio.Future[BaseException] = self._outbox.closed

    def route(self, method: str, handler: RequestHandler, *, inline: bool = False) -> None:
        """Answer inbound requests for exactly ``method`` with ``handler(params)``.

        ``inline`` handlers run before the next line is read, so what they emit keeps
        its place in the stream; they must not wait on anything slow.
        """
        self._reader.handlers[method] = handler
        if inline:
            self._reader.inline.add(method)
        else:
            self._reader.inline.discard(method)

    def start(self) -> None:
        self._reader_task = asyncio.create_task(self._reader.read_loop(), name="acp-reader")

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
        return await self._requests.request(method, params, timeout=timeout)

    async def notify(self, method: str, params: JsonValue) -> None:
        await self._outbox.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def aclose(self) -> None:
        """Stop reading and cancel inbound handlers; the process is not touched here."""
        self._outbox.close(AgentExited("connection closed by the client"))
        tasks = [t for t in (self._reader_task, *self._reader.tasks) if t is not None]
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
    log.error("the handler of %s failed", what, exc_info=exc)  # with its traceback
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
