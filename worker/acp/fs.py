"""``fs/read_text_file`` and ``fs/write_text_file``, served through the sandbox's
:class:`worker.sandbox.files.WorkspaceFiles` — registered (and advertised at initialize)
only when the backend gives one. Its containment rules decide every path.

The params are read field by field as decoded JSON (the ``acp.schema`` models are not
imported at run time: :mod:`worker.acp.client` says why). The request models would not
fit anyway: they require a ``sessionId`` these handlers have never needed (the workspace
is the job's), so they would refuse requests that are served today. The replies are
checked against the schema's ``ReadTextFileResponse``/``WriteTextFileResponse`` in
``tests/unit/test_acp_schema.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.rpc.connection import INVALID_PARAMS, Connection, RpcError
from worker.rpc.wire import JsonObject, JsonValue
from worker.sandbox.files import PathRefused, WorkspaceFiles

#: ACP's ``RequestError.resourceNotFound``: what agents test for a file that is not there
#: (gemini-cli 0.61 takes the message "Resource not found" as ENOENT, and so creates a new
#: file with write_file; any other error fails its write).
RESOURCE_NOT_FOUND = -32002


class FileService:
    """Text file access for the agent, confined to the workspace."""

    def __init__(self, files: WorkspaceFiles, *, read_limit: int) -> None:
        self._files = files
        self._limit = read_limit

    def register(self, connection: Connection) -> None:
        connection.route("fs/read_text_file", self.read)
        connection.route("fs/write_text_file", self.write)

    async def read(self, params: JsonValue) -> JsonObject:
        """``{content}``, optionally from 1-based ``line`` for ``limit`` lines.

        Raises:
            RpcError: -32002 "Resource not found" when the file does not exist; -32602
                when the path is refused or the params are malformed.
        """
        request, path = _request(params)
        try:
            text = await self._files.read_text(path, limit=self._limit)
        except PathRefused as exc:
            raise _refused(exc, path) from None
        content = _lines(text, request.get("line"), request.get("limit"))
        return {"content": content}

    async def write(self, params: JsonValue) -> JsonObject:
        """Create or replace a text file inside the workspace.

        Raises:
            RpcError: -32602 when the path is refused or the params are malformed.
        """
        request, path = _request(params)
        content = request.get("content")
        if not isinstance(content, str):
            raise RpcError(INVALID_PARAMS, "Invalid params", {"message": "content is required"})
        try:
            await self._files.write_text(path, content)
        except PathRefused as exc:
            raise _refused(exc, path) from None
        return {}


def _request(params: JsonValue) -> tuple[Mapping[str, JsonValue], str]:
    """The params as an object, and their ``path``."""
    path = params.get("path") if isinstance(params, Mapping) else None
    if not isinstance(params, Mapping) or not isinstance(path, str):
        raise RpcError(INVALID_PARAMS, "Invalid params", {"message": "path is required"})
    return params, path


def _lines(text: str, line: JsonValue, limit: JsonValue) -> str:
    if not isinstance(line, int) and not isinstance(limit, int):
        return text
    lines = text.splitlines(keepends=True)
    start = max(line - 1, 0) if isinstance(line, int) else 0
    end = start + limit if isinstance(limit, int) and limit >= 0 else None
    return "".join(lines[start:end])


def _refused(exc: PathRefused, path: str) -> RpcError:
    message = f"path refused: {exc.reason}"
    data: JsonObject = {"message": message, "reason": exc.reason}
    if exc.reason == "missing":
        return RpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": path, **data})
    return RpcError(INVALID_PARAMS, "Invalid params", data)
