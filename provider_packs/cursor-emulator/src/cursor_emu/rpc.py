"""Newline-delimited JSON-RPC 2.0 on stdio, as Cursor speaks it.

Only JSON-RPC ever reaches stdout (plus the deliberate `garbage`/`bigline` scenario lines).
Agent->client requests use the agent's own id counter starting at 0 (FACTS §8, §13.1).
"""

from __future__ import annotations

import json
import os
import threading

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at every start
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    JSON = dict[str, Any]


class RpcError(Exception):
    """An error response to send back for the current request."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> JSON:
        err: JSON = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars), as `copy.deepcopy` makes one,
    without importing `copy` at every start."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def method_not_found(method: str) -> RpcError:
    # Cursor's message is the JSON-quoted phrase followed by the method (FACTS §3).
    return RpcError(-32601, f'"Method not found": {method}')


def invalid_params(message: str) -> RpcError:
    return RpcError(-32602, "Invalid params", {"message": message})


def session_not_found(session_id: Any) -> RpcError:
    return invalid_params(f'Session "{session_id}" not found')


def zod_error(path: str, message: str) -> RpcError:
    # Schema failures carry an issue array as `data` (FACTS §12).
    return RpcError(
        -32602, "Invalid params", [{"path": [path] if path else [], "message": message}]
    )


def auth_required() -> RpcError:
    return RpcError(-32000, "Authentication required")


class Pending:
    """An agent->client request awaiting its response.

    `cond` is the waiting turn's condition, so a reply and a cancel wake the same waiter.
    """

    def __init__(self, request_id: int, cond: threading.Condition) -> None:
        self.id = request_id
        self.cond = cond
        self.done = False
        self.result: Any = None
        self.error: JSON | None = None

    def resolve(self, msg: JSON) -> None:
        with self.cond:
            self.done = True
            self.result = msg.get("result")
            err = msg.get("error")
            self.error = err if isinstance(err, dict) else None
            self.cond.notify_all()


class Transport:
    """Serialises writes from the reader loop, prompt threads and timers."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, Pending] = {}

    def write_line(self, data: bytes) -> None:
        with self._lock:
            try:
                self._out.write(data + b"\n")
                self._out.flush()
            except (OSError, ValueError):
                # The client closed our stdout: nobody is listening any more.
                os._exit(0)

    def send(self, obj: JSON) -> None:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        self.write_line(text.encode("utf-8"))

    def notify(self, method: str, params: JSON) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def respond(self, request_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def respond_error(self, request_id: Any, error: RpcError) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()})

    def request(
        self, method: str, params: JSON, cond: threading.Condition | None = None
    ) -> Pending:
        """Send a request with the next agent-side id; the reply resolves the Pending."""
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            pending = Pending(request_id, cond or threading.Condition())
            self._pending[request_id] = pending
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return pending

    def deliver(self, msg: JSON) -> None:
        """Route a client response to its Pending; unknown ids are dropped silently."""
        request_id = msg.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            return
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.resolve(msg)
