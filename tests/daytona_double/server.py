"""The double's server: routes, validation with the SDK's models, sandboxes as host
directories whose commands run under bubblewrap. See the package docstring."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import stat
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import daytona_api_client as api
import daytona_toolbox_api_client as tb
from aiohttp import MultipartWriter, hdrs, web
from pydantic import ValidationError

STDOUT_PREFIX = b"\x01\x01\x01"
STDERR_PREFIX = b"\x02\x02\x02"
#: Directories of a sandbox that the file API and commands may write (all else is the
#: host's, read-only).
WRITABLE_ROOTS = ("workspace", "home", "tmp")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _json(model: Any, status: int = 200) -> web.Response:
    """A response of one of the SDK's models, as its own ``to_dict`` shapes it."""
    body = json.dumps(model.to_dict(), default=lambda v: v.isoformat().replace("+00:00", "Z"))
    return web.Response(text=body, status=status, content_type="application/json")


def _error(status: int, message: str, **extra: Any) -> web.Response:
    body = {"statusCode": status, "message": message, **extra}
    return web.json_response(body, status=status)


@dataclass
class Fault:
    """One injected answer: the next request matching ``method`` and ``path`` gets it."""

    method: str
    path: re.Pattern[str]
    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    #: the request is served first, then answered with the error (a gateway that lost
    #: the answer of a call the daemon applied)
    after: bool = False


@dataclass
class CommandRun:
    """One session command: its process, its framed log and its exit code."""

    cmd_id: str
    command: str
    proc: asyncio.subprocess.Process | None = None
    log: bytearray = field(default_factory=bytearray)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    inputs: int = 0
    #: the data of every input call, in order
    received: list[str] = field(default_factory=list)
    pump: asyncio.Task[None] | None = None


@dataclass
class SandboxRecord:
    dto: dict[str, Any]
    root: Path
    closure: Path
    sessions: dict[str, dict[str, CommandRun]] = field(default_factory=dict)
    activity_refreshes: int = 0
    #: commands of deleted sessions (their logs are what the runner kept)
    finished: list[CommandRun] = field(default_factory=list)


class DaytonaDouble:
    """The double: ``await start()``, use ``api_url`` and ``api_key``, ``await stop()``."""

    def __init__(self, state_dir: Path, *, api_key: str | None = None) -> None:
        self.state_dir = state_dir
        self.api_key = api_key or "dtn_" + secrets.token_hex(16)
        #: image reference → the pack closure that image holds at /opt/acp-pack
        self.images: dict[str, Path] = {}
        #: consulted for a reference ``images`` lacks (a registry filled as jobs go)
        self.resolve_image: Callable[[str], Path | None] = lambda ref: None
        #: image references whose snapshots stay ``pending`` (a build that never ends)
        self.stuck_images: set[str] = set()
        self.snapshots: dict[str, dict[str, Any]] = {}
        #: registry host → (user, password) a private registry's pulls need; an image
        #: there builds only once the organisation registered those credentials
        self.private_registries: dict[str, tuple[str, str]] = {}
        #: the organisation's Docker registries, by id (password kept apart)
        self.registries: dict[str, dict[str, Any]] = {}
        self.registry_passwords: dict[str, str] = {}
        #: how long a snapshot's build takes: ``pending``, then ``building`` for this
        #: long, then ``active`` (or ``build_failed``)
        self.snapshot_build_s = 0.0
        #: the next this many builds end ``build_failed`` (a registry hiccup)
        self.fail_builds = 0
        #: snapshot name → (monotonic time its build ends, state then, error reason)
        self._builds: dict[str, tuple[float, str, str | None]] = {}
        #: how many snapshots were created, activated, deleted
        self.snapshot_calls: dict[str, int] = {"create": 0, "activate": 0, "delete": 0}
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.faults: list[Fault] = []
        #: the organisation's total CPU for sandboxes not stopped (``None``: no limit);
        #: a create past it is refused as Daytona refuses it
        self.org_cpu_limit: int | None = None
        #: sandboxes created from now on stay ``starting`` (a runner that never starts them)
        self.start_stuck = False
        #: how long a sandbox takes to start: ``starting`` for this long, then ``started``
        self.sandbox_start_s = 0.0
        #: sandbox id → monotonic time it is started
        self._starts: dict[str, float] = {}
        #: the next log stream closes with 1011 after its first message (a dropped socket)
        self.drop_logs_once = False
        self.requests: list[tuple[str, str]] = []
        #: echo every input call into the command's log (stdout), as a runner that
        #: ignores ``suppressInputEcho`` would
        self.echo_input = False
        #: an injected round-trip time, waited before each request is served and before
        #: each message of a log stream
        self.rtt_s = 0.0
        #: requests being served now, and the most at once
        self.in_flight = 0
        self.most_in_flight = 0
        #: how many input calls were echoed
        self.echoed = 0
        #: (monotonic time, method, path) of every request
        self.timed: list[tuple[float, str, str]] = []
        #: deleted sandboxes (their command logs stay readable)
        self.gone: list[SandboxRecord] = []
        #: (folder mode, file mode) of each relay header when its command started
        self.header_modes: list[tuple[int, int]] = []
        #: files every sandbox created from now on starts with (sandbox path → content):
        #: what a snapshot's image would hold there, e.g. config planted in /workspace
        self.image_files: dict[str, bytes] = {}
        #: every path asked for with files/info, in order
        self.info_paths: list[str] = []
        #: (sandbox name, labels) of every label replacement served, in order
        self.relabels: list[tuple[str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=256 * 1024**2)
        self._routes(app)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        for record in list(self.sandboxes.values()):
            await self._kill_all(record)
        if self._runner is not None:
            await self._runner.cleanup()

    def fail_next(
        self,
        method: str,
        path: str,
        status: int,
        message: str,
        *,
        after: bool = False,
        **headers: str,
    ) -> None:
        """The next ``method`` request whose path matches the regex ``path`` gets
        ``status`` with ``message`` (and ``headers``, e.g. ``Retry_After``); with
        ``after``, only once it was served (applied, then the answer lost)."""
        fixed = {k.replace("_", "-"): v for k, v in headers.items()}
        self.faults.append(Fault(method, re.compile(path), status, message, fixed, after))

    # --- middleware: auth, faults, request log ---------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        counted = "/socket.io/" not in request.path  # the SDK's event socket, refused
        self.in_flight += counted
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.rtt_s:
                await asyncio.sleep(self.rtt_s)  # the round trip, served as one wait
            return await self._serve(request, handler)
        finally:
            self.in_flight -= counted

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.timed.append((time.monotonic(), request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Unauthorized")
        for fault in self.faults:
            if fault.method == request.method and fault.path.search(request.path):
                self.faults.remove(fault)
                if fault.after:
                    await handler(request)
                response = _error(fault.status, fault.message)
                response.headers.update(fault.headers)
                return response
        try:
            return await handler(request)
        except ValidationError as exc:
            # The shape the SDK's models (the API's own schema) refuse: as the API does.
            return _error(400, f"invalid request: {exc.error_count()} error(s)")

    def _routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/api/snapshots", self.create_snapshot)
        r.add_get("/api/snapshots", self.list_snapshots)
        r.add_get("/api/snapshots/{id}", self.get_snapshot)
        r.add_delete("/api/snapshots/{id}", self.delete_snapshot)
        r.add_post("/api/snapshots/{id}/activate", self.activate_snapshot)
        r.add_get("/api/docker-registry", self.list_registries)
        r.add_post("/api/docker-registry", self.create_registry)
        r.add_patch("/api/docker-registry/{id}", self.update_registry)
        r.add_post("/api/sandbox", self.create_sandbox)
        r.add_get("/api/sandbox", self.list_sandboxes)
        r.add_get("/api/sandbox/{id}", self.get_sandbox)
        r.add_delete("/api/sandbox/{id}", self.delete_sandbox)
        r.add_post("/api/sandbox/{id}/start", self.start_sandbox)
        r.add_post("/api/sandbox/{id}/stop", self.stop_sandbox)
        r.add_post("/api/sandbox/{id}/last-activity", self.last_activity)
        r.add_put("/api/sandbox/{id}/labels", self.replace_labels)
        r.add_get("/api/sandbox/{id}/toolbox-proxy-url", self.toolbox_url)
        t = "/toolbox/{sid}"
        r.add_post(t + "/process/session", self.create_session)
        r.add_delete(t + "/process/session/{session}", self.delete_session)
        r.add_post(t + "/process/session/{session}/exec", self.session_exec)
        r.add_get(t + "/process/session/{session}/command/{cmd}", self.command_status)
        r.add_post(t + "/process/session/{session}/command/{cmd}/input", self.command_input)
        r.add_get(t + "/process/session/{session}/command/{cmd}/logs", self.command_logs)
        r.add_post(t + "/files/bulk-upload", self.upload)
        r.add_post(t + "/files/bulk-download", self.download)
        r.add_get(t + "/files/info", self.file_info)
        r.add_get(t + "/files", self.list_files)
        r.add_post(t + "/files/folder", self.create_folder)
        r.add_post(t + "/files/permissions", self.set_permissions)

    # --- snapshots ---------------------------------------------------------------------

    async def create_snapshot(self, request: web.Request) -> web.Response:
        body = api.CreateSnapshot.from_dict(await request.json())
        assert body is not None
        if body.name in self.snapshots:
            return _error(409, f"Snapshot with name {body.name} already exists")
        image = body.image_name or ""
        found = self.images.get(image) or self.resolve_image(image)
        if found is not None:
            self.images[image] = found
        self.snapshot_calls["create"] += 1
        state, reason = "active", None
        if image in self.stuck_images:
            state = "pending"
        elif image not in self.images:
            state, reason = "build_failed", f"image {image} not found in the registry"
        elif not self._may_pull(image):
            state, reason = "build_failed", f"pull access denied for {image}: unauthorized"
        elif self.fail_builds > 0:
            self.fail_builds -= 1
            state, reason = "build_failed", "failed to pull the image: registry hiccup"
        if state != "pending" and self.snapshot_build_s > 0:
            self._builds[body.name] = (time.monotonic() + self.snapshot_build_s, state, reason)
            state, reason = "pending", None
        now = _now()
        dto = {
            "id": str(uuid.uuid4()), "organizationId": "org-double", "general": False,
            "name": body.name, "imageName": image, "state": state, "size": 0.1,
            "entrypoint": body.entrypoint, "cpu": body.cpu or 1, "gpu": 0,
            "mem": body.memory or 1, "disk": body.disk or 3, "errorReason": reason,
            "createdAt": now, "updatedAt": now, "lastUsedAt": None, "sourceSandboxId": None,
        }  # fmt: skip
        self.snapshots[body.name] = dto
        return self._snapshot_response(dto)

    def _may_pull(self, image: str) -> bool:
        host = image.split("/", 1)[0]
        needed = self.private_registries.get(host)
        if needed is None:
            return True
        return any(
            r["url"] == host and (r["username"], self.registry_passwords[rid]) == needed
            for rid, r in self.registries.items()
        )

    async def list_registries(self, request: web.Request) -> web.Response:
        del request
        items = [api.DockerRegistry.from_dict(r) for r in self.registries.values()]
        body = json.dumps([m.to_dict() for m in items if m is not None], default=str)
        return web.Response(text=body, content_type="application/json")

    async def create_registry(self, request: web.Request) -> web.Response:
        body = api.CreateDockerRegistry.from_dict(await request.json())
        assert body is not None
        rid = str(uuid.uuid4())
        now = _now()
        self.registries[rid] = {
            "id": rid, "name": body.name, "url": body.url, "username": body.username,
            "project": body.project or "", "registryType": "organization",
            "createdAt": now, "updatedAt": now,
        }  # fmt: skip
        self.registry_passwords[rid] = body.password
        model = api.DockerRegistry.from_dict(self.registries[rid])
        assert model is not None
        return _json(model, 201)

    async def update_registry(self, request: web.Request) -> web.Response:
        rid = request.match_info["id"]
        if rid not in self.registries:
            return _error(404, "Registry not found")
        body = api.UpdateDockerRegistry.from_dict(await request.json())
        assert body is not None
        self.registries[rid].update(name=body.name, url=body.url, username=body.username)
        if body.password:
            self.registry_passwords[rid] = body.password
        model = api.DockerRegistry.from_dict(self.registries[rid])
        assert model is not None
        return _json(model)

    def _snapshot_response(self, dto: dict[str, Any]) -> web.Response:
        model = api.SnapshotDto.from_dict(dto)
        assert model is not None
        return _json(model, 200)

    def _find_snapshot(self, key: str) -> dict[str, Any] | None:
        found = self.snapshots.get(key) or next(
            (s for s in self.snapshots.values() if s["id"] == key), None
        )
        if found is not None and found["name"] in self._builds:
            ends, state, reason = self._builds[found["name"]]
            if time.monotonic() >= ends:
                del self._builds[found["name"]]
                found.update(state=state, errorReason=reason, updatedAt=_now())
            else:
                found["state"] = "building"
        return found

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        dto = self._find_snapshot(request.match_info["id"])
        if dto is None:
            return _error(404, "Snapshot not found")
        self.snapshot_calls["delete"] += 1
        del self.snapshots[dto["name"]]
        self._builds.pop(dto["name"], None)
        return web.Response(status=200)

    async def activate_snapshot(self, request: web.Request) -> web.Response:
        dto = self._find_snapshot(request.match_info["id"])
        if dto is None:
            return _error(404, "Snapshot not found")
        if dto["state"] != "inactive":
            return _error(400, f"Snapshot {dto['name']} is {dto['state']}, not inactive")
        self.snapshot_calls["activate"] += 1
        dto.update(state="active", updatedAt=_now())
        return self._snapshot_response(dto)

    async def get_snapshot(self, request: web.Request) -> web.Response:
        dto = self._find_snapshot(request.match_info["id"])
        if dto is None:
            return _error(404, "Snapshot not found")
        return self._snapshot_response(dto)

    async def list_snapshots(self, request: web.Request) -> web.Response:
        del request
        items = list(self.snapshots.values())
        page = {"items": items, "total": len(items), "page": 1, "totalPages": 1}
        model = api.PaginatedSnapshots.from_dict(page)
        assert model is not None
        return _json(model)

    # --- sandboxes ---------------------------------------------------------------------

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = api.CreateSandbox.from_dict(await request.json())
        assert body is not None
        snapshot = self._find_snapshot(body.snapshot or "")
        if snapshot is None:
            return _error(404, f"Snapshot {body.snapshot} not found")
        if snapshot["state"] != "active":
            return _error(400, f"Snapshot {body.snapshot} is {snapshot['state']}")
        name = body.name or ""
        if self.org_cpu_limit is not None:
            used = sum(r.dto["cpu"] for r in self.sandboxes.values() if r.dto["state"] != "stopped")
            if used + snapshot["cpu"] > self.org_cpu_limit:
                return _error(
                    400, f"Total CPU limit exceeded. Maximum allowed: {self.org_cpu_limit}."
                )
        if any(s.dto["name"] == name for s in self.sandboxes.values()):
            return _error(409, f"Sandbox with name {name} already exists")
        sandbox_id = str(uuid.uuid4())
        root = self.state_dir / sandbox_id
        for sub in ("workspace", "home/daytona", "tmp"):
            (root / sub).mkdir(parents=True)
        for inside, content in self.image_files.items():
            planted = root / inside.lstrip("/")
            planted.parent.mkdir(parents=True, exist_ok=True)
            planted.write_bytes(content)
        now = _now()
        dto = {
            "id": sandbox_id, "organizationId": "org-double", "name": name or sandbox_id,
            "snapshot": snapshot["name"], "user": body.user or "daytona", "env": body.env or {},
            "labels": body.labels or {}, "public": bool(body.public),
            "networkBlockAll": bool(body.network_block_all), "kvm": False,
            "networkAllowList": body.network_allow_list,
            "domainAllowList": body.domain_allow_list, "target": body.target or "us",
            "cpu": snapshot["cpu"], "gpu": 0, "memory": snapshot["mem"],
            "disk": snapshot["disk"],
            "state": "starting" if self.start_stuck or self.sandbox_start_s else "started",
            "autoStopInterval": body.auto_stop_interval,
            "autoDeleteInterval": body.auto_delete_interval,
            "autoArchiveInterval": body.auto_archive_interval,
            "ttlMinutes": body.ttl_minutes, "createdAt": now, "updatedAt": now,
            "lastActivityAt": now,
            "toolboxProxyUrl": f"http://127.0.0.1:{self.port}/toolbox",
        }  # fmt: skip
        if self.sandbox_start_s and not self.start_stuck:
            self._starts[sandbox_id] = time.monotonic() + self.sandbox_start_s
        closure = self.images[snapshot["imageName"]]
        self.sandboxes[sandbox_id] = SandboxRecord(dto, root, closure)
        return self._sandbox_response(dto)

    def _sandbox_response(self, dto: dict[str, Any]) -> web.Response:
        model = api.Sandbox.from_dict(dto)
        assert model is not None
        return _json(model)

    def _find(self, key: str) -> SandboxRecord | None:
        found = self.sandboxes.get(key) or next(
            (s for s in self.sandboxes.values() if s.dto["name"] == key), None
        )
        ready = None if found is None else self._starts.get(found.dto["id"])
        if found is not None and ready is not None and time.monotonic() >= ready:
            del self._starts[found.dto["id"]]
            found.dto.update(state="started", updatedAt=_now())
        return found

    async def get_sandbox(self, request: web.Request) -> web.Response:
        record = self._find(request.match_info["id"])
        if record is None:
            return _error(404, "Sandbox not found")
        return self._sandbox_response(record.dto)

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [
            r.dto for r in self.sandboxes.values() if wanted.items() <= r.dto["labels"].items()
        ]
        page = api.ListSandboxesResponse.from_dict({"items": items, "nextCursor": None})
        assert page is not None
        return _json(page)

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        record = self._find(request.match_info["id"])
        if record is None:
            return _error(404, "Sandbox not found")
        await self._kill_all(record)
        del self.sandboxes[record.dto["id"]]
        self.gone.append(record)
        shutil.rmtree(record.root, ignore_errors=True)
        record.dto["state"] = "destroyed"
        return self._sandbox_response(record.dto)

    async def replace_labels(self, request: web.Request) -> web.Response:
        """``PUT /sandbox/{sandboxIdOrName}/labels``: the whole label set replaced by the
        body's (``SandboxLabels``; a value that is not a string is refused by the model,
        400), answered with the labels now held, as the API's ``replaceLabels`` does."""
        record = self._find(request.match_info["id"])
        if record is None:
            return _error(404, "Sandbox not found")
        body = api.SandboxLabels.from_dict(await request.json())
        assert body is not None
        record.dto.update(labels=dict(body.labels), updatedAt=_now())
        self.relabels.append((record.dto["name"], dict(body.labels)))
        return _json(api.SandboxLabels(labels=record.dto["labels"]))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        return await self._set_state(request, "started")

    async def stop_sandbox(self, request: web.Request) -> web.Response:
        return await self._set_state(request, "stopped")

    async def _set_state(self, request: web.Request, state: str) -> web.Response:
        record = self._find(request.match_info["id"])
        if record is None:
            return _error(404, "Sandbox not found")
        if state == "stopped":
            await self._kill_all(record)
        record.dto["state"] = state
        return self._sandbox_response(record.dto)

    async def last_activity(self, request: web.Request) -> web.Response:
        record = self._find(request.match_info["id"])
        if record is None:
            return _error(404, "Sandbox not found")
        record.dto["lastActivityAt"] = _now()
        record.activity_refreshes += 1
        return web.Response(status=201)

    async def toolbox_url(self, request: web.Request) -> web.Response:
        if self._find(request.match_info["id"]) is None:
            return _error(404, "Sandbox not found")
        model = api.ToolboxProxyUrl(url=f"http://127.0.0.1:{self.port}/toolbox")
        return _json(model)

    # --- toolbox: sessions ---------------------------------------------------------------

    def _sandbox(self, request: web.Request) -> SandboxRecord:
        record = self.sandboxes.get(request.match_info["sid"])
        if record is None or record.dto["state"] != "started":
            raise web.HTTPNotFound(text='{"message": "sandbox not running"}')
        return record

    def _command(self, request: web.Request) -> CommandRun:
        session = self._sandbox(request).sessions.get(request.match_info["session"])
        run = None if session is None else session.get(request.match_info["cmd"])
        if run is None:
            raise web.HTTPNotFound(text='{"message": "command not found"}')
        return run

    async def create_session(self, request: web.Request) -> web.Response:
        record = self._sandbox(request)
        body = tb.CreateSessionRequest.from_dict(await request.json())
        assert body is not None
        if body.session_id in record.sessions:
            return _error(409, "session already exists")
        record.sessions[body.session_id] = {}
        return web.Response(status=201)

    async def delete_session(self, request: web.Request) -> web.Response:
        record = self._sandbox(request)
        runs = record.sessions.pop(request.match_info["session"], None)
        if runs is None:
            return _error(404, "session not found")
        for run in runs.values():
            await _kill(run)
            record.finished.append(run)
        return web.Response(status=204)

    async def session_exec(self, request: web.Request) -> web.Response:
        record = self._sandbox(request)
        session = record.sessions.get(request.match_info["session"])
        if session is None:
            return _error(404, "session not found")
        body = tb.SessionExecuteRequest.from_dict(await request.json())
        assert body is not None
        run = CommandRun(str(uuid.uuid4()), body.command)
        session[run.cmd_id] = run
        self._note_header(record, body.command)
        await self._spawn(record, run)
        if not (body.run_async or body.var_async):
            await _finished(run)
        answer = tb.SessionExecuteResponse(
            cmd_id=run.cmd_id,
            exit_code=run.exit_code,
            stdout=run.stdout.decode(errors="replace") if run.exit_code is not None else None,
            stderr=run.stderr.decode(errors="replace") if run.exit_code is not None else None,
        )
        return _json(answer, 202 if body.run_async else 200)

    def _note_header(self, record: SandboxRecord, command: str) -> None:
        """The modes of a relay's header file and folder as its command starts."""
        match = re.search(r"(/tmp/acpw-launch-[0-9a-f]+)/header\.json", command)
        if match is None:
            return
        folder = self._host_path(record, match.group(1))
        with contextlib.suppress(OSError):
            self.header_modes.append(
                (
                    stat.S_IMODE(folder.stat().st_mode),
                    stat.S_IMODE((folder / "header.json").stat().st_mode),
                )
            )

    async def command_status(self, request: web.Request) -> web.Response:
        run = self._command(request)
        model = tb.Command(id=run.cmd_id, command=run.command, exit_code=run.exit_code)
        return _json(model)

    async def command_input(self, request: web.Request) -> web.Response:
        run = self._command(request)
        body = tb.SessionSendInputRequest.from_dict(await request.json())
        assert body is not None
        if run.proc is None or run.proc.stdin is None or run.exit_code is not None:
            return _error(410, "command already completed")
        run.inputs += 1
        run.received.append(body.data)
        if self.echo_input:
            self.echoed += 1
            async with run.changed:
                run.log += STDOUT_PREFIX + body.data.encode()
                run.stdout += body.data.encode()
                run.changed.notify_all()
        try:
            run.proc.stdin.write(body.data.encode())
            await run.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return _error(410, "command already completed")
        return web.Response(status=200)

    async def command_logs(self, request: web.Request) -> web.StreamResponse:
        run = self._command(request)
        if request.query.get("follow") != "true":
            logs = tb.SessionCommandLogsResponse(
                output=run.log.decode(errors="replace"),
                stdout=run.stdout.decode(errors="replace"),
                stderr=run.stderr.decode(errors="replace"),
            )
            return _json(logs)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sent = 0

        def more() -> bool:
            return len(run.log) > sent or run.exit_code is not None

        while True:
            async with run.changed:
                await run.changed.wait_for(more)
            if len(run.log) > sent:
                if self.rtt_s:
                    await asyncio.sleep(self.rtt_s / 2)  # one way
                chunk = bytes(run.log[sent:])
                sent += len(chunk)
                await ws.send_bytes(chunk)
                if self.drop_logs_once:
                    self.drop_logs_once = False
                    await ws.close(code=1011, message=b"runner connection lost")
                    return ws
                continue
            if run.exit_code is not None:
                break
        await ws.close(code=1000)
        return ws

    # --- toolbox: files ----------------------------------------------------------------

    def _host_path(self, record: SandboxRecord, remote: str) -> Path:
        parts = [p for p in remote.split("/") if p not in ("", ".")]
        if not remote.startswith("/") or ".." in parts or not parts:
            raise web.HTTPBadRequest(text='{"message": "invalid path"}')
        if parts[0] not in WRITABLE_ROOTS:
            raise web.HTTPForbidden(text='{"message": "permission denied"}')
        return record.root.joinpath(*parts)

    def _view_path(self, record: SandboxRecord, remote: str) -> Path | None:
        """Where a path the sandbox sees lives on this host (read only but for the
        writable roots), as the bubblewrap view of ``_bwrap_argv`` lays it out; ``None``
        for ``/`` itself. A path outside every bound tree does not exist."""
        parts = [p for p in remote.split("/") if p not in ("", ".")]
        if not remote.startswith("/") or ".." in parts:
            raise web.HTTPBadRequest(text='{"message": "invalid path"}')
        if not parts:
            return None
        if parts[0] in WRITABLE_ROOTS:
            return record.root.joinpath(*parts)
        if parts[0] in ("usr", "etc"):
            return Path("/").joinpath(*parts)
        if parts[:2] == ["opt", "acp-pack"]:
            return record.closure.joinpath(*parts[2:])
        return record.root / "absent"  # never made: nothing else is in the view

    async def file_info(self, request: web.Request) -> web.Response:
        """The daemon's file info of the entry itself (``lstat``: a link is reported as a
        link, mode in Go's ``os.FileMode`` notation)."""
        record = self._sandbox(request)
        remote = request.query.get("path", "")
        self.info_paths.append(remote)
        path = self._view_path(record, remote)
        try:
            info = os.lstat(path if path is not None else record.root)
        except (FileNotFoundError, NotADirectoryError):
            return _error(404, f"file not found: {remote}")
        model = tb.FileInfo(
            name=PurePosixPath(remote).name or "/", is_dir=stat.S_ISDIR(info.st_mode),
            size=info.st_size, mode=_go_mode(info.st_mode), mod_time="",
            permissions=f"{info.st_mode & 0o777:o}", owner="daytona", group="daytona",
            path=remote,
        )  # fmt: skip
        return _json(model)

    async def list_files(self, request: web.Request) -> web.Response:
        """The entries of a directory of the sandbox's view (one level)."""
        record = self._sandbox(request)
        remote = request.query.get("path", "")
        path = self._view_path(record, remote) or record.root
        try:
            names = sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return _error(404, f"directory not found: {remote}")
        items = []
        for name in names:
            info = os.lstat(path / name)
            items.append(
                tb.FileInfo(
                    name=name, is_dir=stat.S_ISDIR(info.st_mode), size=info.st_size,
                    mode=_go_mode(info.st_mode), mod_time="",
                    permissions=f"{info.st_mode & 0o777:o}", owner="daytona",
                    group="daytona", path=f"{remote.rstrip('/')}/{name}",
                ).to_dict()
            )  # fmt: skip
        return web.json_response(items)

    async def create_folder(self, request: web.Request) -> web.Response:
        record = self._sandbox(request)
        mode = request.query.get("mode", "")
        if not re.fullmatch(r"[0-7]{3,4}", mode):
            return _error(400, "invalid mode")
        path = self._host_path(record, request.query.get("path", ""))
        try:
            os.mkdir(path, int(mode, 8))
        except FileExistsError:
            pass
        except (FileNotFoundError, NotADirectoryError):
            return _error(400, "parent directory does not exist")
        return web.Response(status=201)

    async def set_permissions(self, request: web.Request) -> web.Response:
        """The mode of a file or directory (owner and group are not modelled: one user)."""
        record = self._sandbox(request)
        mode = request.query.get("mode", "")
        if not re.fullmatch(r"[0-7]{3,4}", mode):
            return _error(400, "invalid mode")
        path = self._host_path(record, request.query.get("path", ""))
        try:
            os.chmod(path, int(mode, 8), follow_symlinks=False)
        except FileNotFoundError:
            return _error(404, "file not found")
        return web.Response(status=200)

    async def upload(self, request: web.Request) -> web.Response:
        record = self._sandbox(request)
        reader = await request.multipart()
        paths: dict[str, str] = {}
        async for part in reader:
            name = part.name or ""
            if name.endswith(".path"):
                paths[name.removesuffix(".path")] = (await part.read()).decode()  # type: ignore[union-attr]
                continue
            if not name.endswith(".file"):
                return _error(400, f"unexpected form field {name}")
            dest = self._host_path(
                record, paths.get(name.removesuffix(".file")) or part.filename or ""
            )
            dest.parent.mkdir(parents=True, exist_ok=True)
            with dest.open("wb") as out:
                while chunk := await part.read_chunk():  # type: ignore[union-attr]
                    out.write(chunk)
        return web.Response(status=200)

    async def download(self, request: web.Request) -> web.StreamResponse:
        record = self._sandbox(request)
        body = tb.FilesDownloadRequest.from_dict(await request.json())
        assert body is not None
        writer = MultipartWriter("form-data")
        for remote in body.paths:
            path = self._view_path(record, remote) or record.root
            # The daemon writes the path as it is; aiohttp's helper would percent-quote it.
            if path.is_file():
                disposition = f'form-data; name="file"; filename="{remote}"'
                content_type = "application/octet-stream"
                data: bytes | io.BytesIO = io.BytesIO(path.read_bytes())
            else:
                disposition = f'form-data; name="error"; filename="{remote}"'
                content_type = "application/json"
                data = json.dumps({"message": "file not found", "statusCode": 404}).encode()
            headers = {hdrs.CONTENT_TYPE: content_type, hdrs.CONTENT_DISPOSITION: disposition}
            writer.append(data, headers)
        return web.Response(body=writer)

    # --- processes -----------------------------------------------------------------------

    async def _spawn(self, record: SandboxRecord, run: CommandRun) -> None:
        argv = [*_bwrap_argv(record), "/bin/sh", "-c", run.command]
        run.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        run.pump = asyncio.create_task(_pump(run))

    async def _kill_all(self, record: SandboxRecord) -> None:
        for runs in record.sessions.values():
            for run in runs.values():
                await _kill(run)
                record.finished.append(run)
        record.sessions.clear()

    @property
    def logged(self) -> list[str]:
        """The log of every command of every sandbox still here and every command
        line (what the runner would keep), as text."""
        texts = []
        for record in [*self.sandboxes.values(), *self.gone]:
            runs = [run for session in record.sessions.values() for run in session.values()]
            for run in [*runs, *record.finished]:
                texts += [run.command, run.log.decode(errors="replace")]
        return texts

    def activity_refreshes(self, name: str) -> int:
        record = self._find(name)
        return 0 if record is None else record.activity_refreshes


def _go_mode(mode: int) -> str:
    """``mode`` as Go's ``os.FileMode.String()`` writes it: type letters, then rwx."""
    letters = {
        stat.S_IFDIR: "d", stat.S_IFLNK: "L", stat.S_IFIFO: "p", stat.S_IFSOCK: "S",
        stat.S_IFBLK: "D", stat.S_IFCHR: "Dc",
    }  # fmt: skip
    kind = letters.get(stat.S_IFMT(mode), "")
    perms = "".join(
        c if mode & bit else "-"
        for c, bit in zip("rwxrwxrwx", (256, 128, 64, 32, 16, 8, 4, 2, 1), strict=True)
    )
    return (kind or "-") + perms


def _bwrap_argv(record: SandboxRecord) -> list[str]:
    argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if record.dto["networkBlockAll"]:
        argv.append("--unshare-net")
    argv += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for sub in WRITABLE_ROOTS:
        argv += ["--bind", str(record.root / sub), f"/{sub}"]
    argv += ["--ro-bind", str(record.closure), "/opt/acp-pack", "--chdir", "/home/daytona"]
    argv += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
    argv += ["--setenv", "HOME", "/home/daytona"]
    for key, value in record.dto["env"].items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]


async def _pump(run: CommandRun) -> None:
    proc = run.proc
    assert proc is not None
    assert proc.stdout is not None
    assert proc.stderr is not None

    async def follow(stream: asyncio.StreamReader, prefix: bytes, plain: bytearray) -> None:
        while chunk := await stream.read(65536):
            plain += chunk
            async with run.changed:
                run.log += prefix + chunk
                run.changed.notify_all()

    await asyncio.gather(
        follow(proc.stdout, STDOUT_PREFIX, run.stdout),
        follow(proc.stderr, STDERR_PREFIX, run.stderr),
    )
    status = await proc.wait()
    async with run.changed:
        run.exit_code = 128 - status if status < 0 else status
        run.changed.notify_all()


async def _finished(run: CommandRun) -> None:
    async with run.changed:
        await run.changed.wait_for(lambda: run.exit_code is not None)


async def _kill(run: CommandRun) -> None:
    if run.proc is None or run.proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.proc.pid, signal.SIGKILL)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(_finished(run), timeout=10)


__all__ = ["DaytonaDouble"]
