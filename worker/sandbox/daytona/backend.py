"""``DaytonaBackend`` (create, destroy, list; its snapshots: ``snapshots.py``; warm slots'
assign and fill: ``slots.py``) and ``DaytonaSandbox`` (spawn). See the package
docstring."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import secrets
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.errors import SandboxError
from worker.network import parse_endpoint
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_WORKER,
    WORKSPACE,
    Capabilities,
    SandboxInfo,
    SandboxSpec,
)
from worker.sandbox.daytona import sdk, slots, sync, view
from worker.sandbox.daytona.api import Api, close_client
from worker.sandbox.daytona.files import DaytonaWorkspaceFiles
from worker.sandbox.daytona.process import CommandControl, DaytonaProcess
from worker.sandbox.daytona.relay import launch_header, lease_frame, relay_command
from worker.sandbox.daytona.snapshots import Snapshots
from worker.sandbox.shared import check_command, check_id, make_sandbox_id

if TYPE_CHECKING:
    from daytona import AsyncDaytona, AsyncSandbox

    from worker.admission import MaskEntry
    from worker.admission.result import AdmissionResult
    from worker.sandbox.base import LeaseDeadline, Sandbox
    from worker.sandbox.config import DaytonaConfig

log = logging.getLogger(__name__)

BACKEND_NAME = "daytona"
LABEL_SANDBOX = "acpw.sandbox"
LABEL_BACKEND = "acpw.backend"
_SDK_LABELS = slots.SDK_LABELS
_SYNC_SESSION = "acpw-sync"
#: How long the runner's thread waits for the admission view (bounded calls, each retried).
_VIEW_TIMEOUT_S = 300.0


class _Command(CommandControl):
    """One relay command of a sandbox (``CommandControl`` over the SDK)."""

    def __init__(self, sandbox: DaytonaSandbox, session: str, cmd_id: str) -> None:
        self._box = sandbox
        self._session = session
        self._cmd = cmd_id

    async def follow_logs(
        self, on_stdout: Callable[[str], None], on_stderr: Callable[[str], None]
    ) -> None:
        process = self._box.remote.process
        await self._box.api.call(
            "follow logs",
            lambda: process.get_session_command_logs_async(
                self._session, self._cmd, on_stdout, on_stderr
            ),
            bounded=False,
        )

    async def exit_code(self) -> int | None:
        process = self._box.remote.process
        command = await self._box.api.call(
            "command status", lambda: process.get_session_command(self._session, self._cmd)
        )
        return command.exit_code

    async def send(self, data: str) -> None:
        process = self._box.remote.process
        await self._box.api.call(
            "send input",
            lambda: process.send_session_command_input(self._session, self._cmd, data),
        )

    async def send_lease(self, deadline: LeaseDeadline) -> None:
        """Tell the relay the lease now ends at ``deadline``: the remaining time is
        computed for each attempt, so a retried call never extends the lease."""
        process = self._box.remote.process
        await self._box.api.call(
            "renew lease",
            lambda: process.send_session_command_input(
                self._session, self._cmd, lease_frame(deadline.at - time.monotonic())
            ),
        )

    async def kill_session(self) -> None:
        process = self._box.remote.process
        with contextlib.suppress(SandboxError):
            await self._box.api.call(
                "delete session", lambda: process.delete_session(self._session)
            )


class DaytonaSandbox:
    """One job attempt's Daytona sandbox, as this process made it."""

    def __init__(
        self,
        backend: DaytonaBackend,
        *,
        sandbox_id: str,
        spec: SandboxSpec,
        client: AsyncDaytona,
        remote: AsyncSandbox,
        masks: Sequence[MaskEntry] = (),
    ) -> None:
        self.backend = backend
        #: The masks applied by content (``sync.py``): left out going in, kept coming back.
        self.masks = tuple(masks)
        self.api = backend.api
        self.client = client
        self._sandbox_id = sandbox_id
        self._spec = spec
        self.remote = remote
        self._count = 0
        self.processes: list[DaytonaProcess] = []
        self._controls: list[_Command] = []
        self._unfollow: Callable[[], None] | None = None
        self._last_refresh = 0.0
        self._refreshes: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._files: DaytonaWorkspaceFiles | None = None
        self._keeper: asyncio.Task[None] | None = None

    @property
    def sandbox_id(self) -> str:
        return self._sandbox_id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str = WORKSPACE,
        stdout_limit: int = 8 * 1024 * 1024,
    ) -> DaytonaProcess:
        """Start ``argv`` through the relay in a new session, with exactly ``env``.

        Raises:
            SandboxError: Daytona refused the session or the command.
        """
        check_command(argv, env, cwd)
        self._count += 1
        session = f"acpw-{self._count}"
        process = self.remote.process
        header = await self._upload_header(argv, env, cwd)
        await self.api.call("create session", lambda: process.create_session(session))
        request = sdk.module().SessionExecuteRequest(
            command=relay_command(header), run_async=True, suppress_input_echo=True
        )
        started = await self.api.call(
            "execute command", lambda: process.execute_session_command(session, request)
        )
        control = _Command(self, session, started.cmd_id)
        self._controls.append(control)
        proc = DaytonaProcess(
            control,
            stdout_limit=stdout_limit,
            frame_bytes=self.backend.config.daytona_input_frame_bytes,
        )
        self.processes.append(proc)
        return proc

    async def _upload_header(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
        """Upload the relay's launch header (argv, the environment with its credentials,
        the masks, the lease) as a 0600 file in a fresh 0700 directory below ``/tmp``
        through the file API; the relay reads and removes both. Returns its path.

        Credentials never travel as an input call, which a runner ignoring
        ``suppressInputEcho`` would echo into the command's log.
        """
        folder = f"/tmp/acpw-launch-{secrets.token_hex(12)}"  # noqa: S108 - in the sandbox
        path = f"{folder}/header.json"
        deadline = self._spec.lease_deadline
        body = launch_header(
            argv, env, cwd,
            masks=[(m.kind.value, f"{WORKSPACE}/{m.path}") for m in self.masks],
            lease_s=None if deadline is None else deadline.at - time.monotonic(),
        )  # fmt: skip
        fs = self.remote.fs
        await self.api.call("make header folder", lambda: fs.create_folder(folder, "700"))
        await self.api.call("upload header", lambda: fs.upload_file(body, path))
        await self.api.call("protect header", lambda: fs.set_file_permissions(path, mode="600"))
        return path

    def admission_view(self, *, provider: str = "cursor") -> AdmissionResult:
        """Admission in the sandbox's own view, rebuilt from its file API (``view.py``).
        Called in a worker thread (as the runner does): the SDK's client belongs to the
        event loop the sandbox was made in, so the work runs there and this thread waits.

        Raises:
            SandboxError: Daytona failed, the view needed more than its bounds, or this
                is called on the event loop's own thread (it would deadlock).
            WorkspaceUnavailable: the sandbox has no ``/workspace`` directory.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise SandboxError("daytona: admission_view must be called off the event loop")
        future = asyncio.run_coroutine_threadsafe(
            view.sandbox_admission(self, provider=provider, masks=self.masks), self._loop
        )
        try:
            return future.result(timeout=_VIEW_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise SandboxError(
                "daytona: the admission view took too long", timeout_s=_VIEW_TIMEOUT_S
            ) from None

    def workspace_files(self) -> DaytonaWorkspaceFiles:
        """``/workspace`` through Daytona's file API, with this sandbox's masks
        (``files.py``; ``fs/*`` is advertised when the pack keeps ``launch.client_fs``)."""
        if self._files is None:
            self._files = DaytonaWorkspaceFiles(self, masks=self.masks)
        return self._files

    # --- the lease heartbeat keeps the sandbox active --------------------------------

    def follow_lease(self, deadline: LeaseDeadline | None) -> None:
        """Refresh Daytona's activity clock on lease renewals (at most once every
        ``daytona_activity_every_s``): auto-stop counts only API calls, not the agent's
        work, and a sandbox whose worker keeps its lease must not be stopped."""
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        every = self.backend.config.daytona_activity_every_s

        def renewed(_at: float) -> None:
            for control, process in zip(self._controls, self.processes, strict=True):
                if process.returncode is None:
                    self._spawn_task(self._renew(control, deadline))
            now = loop.time()
            if now - self._last_refresh < every:
                return
            self._last_refresh = now
            self._spawn_task(self._refresh())

        self._unfollow = deadline.follow(renewed)

    def keep_active(self) -> None:
        """An unclaimed warm slot has no lease whose renewals would refresh its activity:
        refreshed every ``daytona_activity_every_s`` from this process while it is idle,
        so Daytona's auto-stop does not stop it under its pool (it stops a dead worker's
        slot within ``auto_stop_minutes``, as a dead worker's job sandbox)."""

        async def keep() -> None:
            while True:
                await asyncio.sleep(self.backend.config.daytona_activity_every_s)
                await self._refresh()

        self._keeper = self._loop.create_task(keep())

    def stop_keeping_active(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None

    def adopt(self, spec: SandboxSpec) -> None:
        """A claimed slot becomes the attempt's: ``spec`` is the attempt's (its labels,
        job, attempt and lease; the slot's workspace and HOME mounts)."""
        self._spec = spec

    async def arm_lease(self, deadline: LeaseDeadline) -> None:
        """Bound what runs by ``deadline`` now: an ``L`` frame to each running relay arms
        its watchdog (a slot's agent was started with no lease).

        Raises:
            SandboxError: a frame was not delivered (the agent would be unbounded).
        """
        for control, process in zip(self._controls, self.processes, strict=True):
            if process.returncode is None:
                await control.send_lease(deadline)

    def _spawn_task(self, call: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(call)
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def _renew(self, control: _Command, deadline: LeaseDeadline) -> None:
        try:
            await control.send_lease(deadline)
        except SandboxError as exc:
            log.warning("daytona: lease renewal of %s not delivered: %s", self._sandbox_id, exc)

    async def _refresh(self) -> None:
        try:
            await self.api.call("refresh activity", self.remote.refresh_activity)
        except SandboxError as exc:
            log.warning("daytona: activity refresh of %s failed: %s", self._sandbox_id, exc)

    async def close(self) -> None:
        """Its processes' followers stopped and its client closed (after the delete)."""
        for process in self.processes:
            await process.close()
        if self._files is not None:
            await self._files.aclose()
        await close_client(self.client)

    def unfollow(self) -> None:
        self.stop_keeping_active()
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None

    # --- commands of our own (workspace in and out) ----------------------------------

    async def run(self, command: str, what: str) -> None:
        """Run ``command`` to its end in the sandbox's sync session.

        Raises:
            SandboxError: it failed (its stderr's end in ``details``).
        """
        process = self.remote.process
        with contextlib.suppress(SandboxError):
            await self.api.call("create session", lambda: process.create_session(_SYNC_SESSION))
        request = sdk.module().SessionExecuteRequest(command=command, run_async=False)
        result = await self.api.call(
            what, lambda: process.execute_session_command(_SYNC_SESSION, request)
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"daytona: {what} failed in the sandbox",
                exit_code=result.exit_code,
                stderr=(result.stderr or "")[-2000:],
                sandbox_id=self._sandbox_id,
            )


class DaytonaBackend:
    """``SandboxBackend`` on Daytona; ``list``/``destroy`` work from any process with the
    same account."""

    name = BACKEND_NAME
    capabilities = Capabilities(runs_host_usr=False, warm_slots=True)

    def __init__(self, config: DaytonaConfig) -> None:
        """Raises ``ImportError`` when the SDK is missing (``get_backend`` names the
        extra); the SDK itself is imported by the first operation (``sdk.py``)."""
        sdk.check_installed()
        self.config = config
        self.api = Api(config)
        self.snapshots = Snapshots(config, self.api)
        self._live: dict[str, DaytonaSandbox] = {}

    def stage_owner(self) -> tuple[int, int]:
        return self.config.host_owner()

    async def aclose(self) -> None:
        """Delete every sandbox this backend still holds (tests)."""
        for sandbox_id in list(self._live):
            with contextlib.suppress(Exception):
                await self.destroy(sandbox_id)

    def snapshot_plan(self, spec: SandboxSpec) -> tuple[str, str, tuple[int, int]]:
        """See :meth:`Snapshots.snapshot_plan`."""
        return self.snapshots.snapshot_plan(spec)

    async def create(self, spec: SandboxSpec) -> DaytonaSandbox:
        """The job attempt's sandbox from its snapshot, the workspace and HOME mounts
        uploaded into it.

        Raises:
            SnapshotFailed, SandboxStartTimeout, BackendAuthFailed,
            BackendQuotaExceeded, BackendRateLimited: as their names say.
            SandboxError: the spec asks for what this backend cannot do, or Daytona
                failed otherwise.
        """
        _check_spec(spec)
        await sdk.load()
        client = self.api.new_client()
        try:
            return await self._create(client, spec)
        except BaseException:
            await close_client(client)
            raise

    async def _create(self, client: AsyncDaytona, spec: SandboxSpec) -> DaytonaSandbox:
        masks = await asyncio.to_thread(sync.masks, spec)
        snapshot = await self.snapshots.ensure_snapshot(client, spec)
        sandbox_id = make_sandbox_id(spec.job_id, spec.attempt)
        labels = self.labels(spec, sandbox_id)
        params = sdk.module().CreateSandboxFromSnapshotParams(
            name=sandbox_id, snapshot=snapshot, labels=labels,
            os_user=self.config.daytona_os_user,
            auto_stop_interval=self.config.daytona_auto_stop_minutes,
            auto_delete_interval=self.config.daytona_auto_delete_minutes,
            ttl_minutes=self.config.daytona_ttl_minutes or None,
            **network_params(spec),
        )  # fmt: skip
        try:
            remote = await self.api.call(
                "create sandbox",
                lambda: client.create(params, timeout=self.config.daytona_start_timeout_s),
                sandbox_id=sandbox_id,
            )
        except BaseException:
            # It may exist though it never started (a start time-out): not left behind.
            with contextlib.suppress(Exception):
                await self._delete(client, sandbox_id)
            raise
        sandbox = DaytonaSandbox(
            self, sandbox_id=sandbox_id, spec=spec, client=client, remote=remote, masks=masks
        )
        try:
            await self.upload(sandbox, spec)
        except BaseException:
            await self._delete(client, sandbox_id)
            raise
        self._live[sandbox_id] = sandbox
        sandbox.follow_lease(spec.lease_deadline)
        if spec.lease_deadline is None and slots.is_unclaimed_slot(spec):
            sandbox.keep_active()
        return sandbox

    async def assign(
        self,
        sandbox: Sandbox,
        *,
        labels: Mapping[str, str],
        lease_deadline: LeaseDeadline | None,
        deadline_s: int | None = None,
    ) -> None:
        """A warm slot's sandbox relabelled to the attempt through Daytona's label call
        and bound by the attempt's lease (``slots.py``). ``deadline_s`` is not applied:
        Daytona's hard TTL was fixed when the slot was made (``daytona.md``).

        Raises:
            SandboxError: Daytona refused or garbled the relabel, or the lease frame
                was not delivered.
        """
        assert isinstance(sandbox, DaytonaSandbox)
        del deadline_s
        await slots.assign(self, sandbox, labels, lease_deadline)

    async def fill(self, sandbox: Sandbox, staged: Path) -> Path:
        """The staged copy moved into the slot's host workspace and uploaded into its
        ``/workspace`` through the file API, masked paths left out (``slots.py``).

        Raises:
            SandboxError: a collision on the host, or the upload or unpack failed.
        """
        assert isinstance(sandbox, DaytonaSandbox)
        await self.upload(sandbox, await slots.fill_host(sandbox, staged))
        return sandbox.spec.workspace

    def labels(self, spec: SandboxSpec, sandbox_id: str) -> dict[str, str]:
        """The spec's labels plus job, attempt, worker, sandbox id and backend."""
        labels = {LABEL_WORKER: self.config.worker_id, **spec.labels}
        labels[LABEL_JOB] = spec.job_id
        labels[LABEL_ATTEMPT] = str(spec.attempt)
        labels[LABEL_SANDBOX] = sandbox_id
        labels[LABEL_BACKEND] = BACKEND_NAME
        return labels

    async def upload(self, sandbox: DaytonaSandbox, spec: SandboxSpec) -> None:
        """The trees of ``spec`` (its workspace, masked paths left out, and its HOME
        mounts) uploaded as one tar and unpacked in the sandbox.

        Raises:
            SandboxError: the upload or the unpack failed.
        """
        with tempfile.TemporaryDirectory(prefix="acpw-daytona-") as tmp:
            tar = Path(tmp) / "in.tar"
            await asyncio.to_thread(sync.pack_in, spec, tar, masked=sandbox.masks)
            fs = sandbox.remote.fs
            await self.api.call("upload workspace", lambda: fs.upload_file(str(tar), sync.IN_TAR))
        await sandbox.run(sync.unpack_in_command(spec), "unpack workspace")

    async def _bring_back(self, sandbox: DaytonaSandbox) -> None:
        """The sandbox's workspace and HOME mounts downloaded into the staged copies.

        Raises:
            SandboxError: the tar could not be made or downloaded within the bound.
            ArchiveRefused: it holds something unsafe or too much.
        """
        await sandbox.run(sync.pack_out_command(sandbox.spec), "pack workspace")
        limit = self.config.daytona_sync_max_bytes + 1024**2
        with tempfile.TemporaryDirectory(prefix="acpw-daytona-") as tmp:
            tar = Path(tmp) / "out.tar"
            await self.api.call("download workspace", lambda: _download(sandbox, tar, limit))
            await asyncio.to_thread(
                sync.bring_back, sandbox.spec, tar,
                max_bytes=self.config.daytona_sync_max_bytes,
                max_entries=self.config.daytona_sync_max_entries, masked=sandbox.masks,
            )  # fmt: skip

    async def destroy(self, sandbox_id: str) -> None:
        """Delete the sandbox (what runs in it dies with it); idempotent. When this
        process made it, its workspace and HOME mounts are brought back first (not an
        unclaimed warm slot's: nothing of a job is in it), and the sandbox is deleted
        whether or not that worked.

        Raises:
            SandboxError: Daytona failed to delete it, or the workspace did not come back
                (then the sandbox is deleted all the same, and nothing is captured).
            ArchiveRefused: what came back was unsafe (nothing replaced).
        """
        check_id(sandbox_id, backend=BACKEND_NAME)
        await sdk.load()
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is None:
            async with self.api.session() as client:
                await self._delete(client, sandbox_id)
            return
        failure: BaseException | None = None
        sandbox.unfollow()
        try:
            for process in sandbox.processes:
                await process.stop()
            try:
                if not slots.is_unclaimed_slot(sandbox.spec):
                    await self._bring_back(sandbox)
            except Exception as exc:  # still delete; the caller learns it after
                failure = exc
            await self._delete(sandbox.client, sandbox_id)
        finally:
            await sandbox.close()
        if failure is not None:
            raise failure

    async def _delete(self, client: AsyncDaytona, sandbox_id: str) -> None:
        try:
            remote = await self.api.call("get sandbox", lambda: client.get(sandbox_id))
        except SandboxError as exc:
            if exc.details.get("status") == 404:
                return
            raise
        try:
            await self.api.call(
                "delete sandbox", lambda: client.delete(remote), sandbox_id=sandbox_id
            )
        except SandboxError as exc:
            if exc.details.get("status") != 404:
                raise

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Our sandboxes whose labels include all of ``labels``."""
        wanted = {**labels, LABEL_BACKEND: BACKEND_NAME}
        await sdk.load()
        async with self.api.session() as client:
            return await self._list(client, wanted)

    async def _list(
        self, client: AsyncDaytona, wanted: dict[str, str]
    ) -> builtins.list[SandboxInfo]:
        async def collect() -> builtins.list[SandboxInfo]:
            found: dict[str, SandboxInfo] = {}
            query = sdk.module().ListSandboxesQuery(labels=wanted)
            async for remote in client.list(query):
                have = {str(k): str(v) for k, v in (remote.labels or {}).items()}
                name = have.get(LABEL_SANDBOX)
                # The filter is re-checked: the answer is untrusted, and ids become paths.
                if name != remote.name or not wanted.items() <= have.items():
                    continue
                with contextlib.suppress(SandboxError):
                    check_id(name, backend=BACKEND_NAME)
                    own = {k: v for k, v in have.items() if k not in _SDK_LABELS}
                    found[name] = SandboxInfo(name, BACKEND_NAME, own)
            return sorted(found.values(), key=lambda i: i.sandbox_id)

        return await self.api.call("list sandboxes", collect)


async def _download(sandbox: DaytonaSandbox, dest: Path, limit: int) -> None:
    """Stream the sandbox's out-tar into ``dest``, refusing more than ``limit`` bytes.

    Raises:
        SandboxError: more than ``limit`` bytes.
    """
    stream = await sandbox.remote.fs.download_file_stream(sync.OUT_TAR)
    written = 0
    with dest.open("wb") as out:
        async for chunk in stream:
            written += len(chunk)
            if written > limit:
                raise SandboxError(
                    "daytona: the workspace to bring back is over its bound",
                    limit=limit, sandbox_id=sandbox.sandbox_id,
                )  # fmt: skip
            out.write(chunk)


def network_params(spec: SandboxSpec) -> dict[str, object]:
    """Daytona's network settings for the spec (docs/daytona.md says where they differ):
    ``none`` → ``network_block_all``; ``allowlist`` → the hosts as Daytona's domain allow
    list and IP literals as its CIDR allow list (Daytona allows every port of them)."""
    if spec.network == "none":
        return {"network_block_all": True}
    domains: list[str] = []
    cidrs: list[str] = []
    for entry in spec.network_allow:
        try:
            endpoint = parse_endpoint(entry)
        except ValueError as exc:
            raise SandboxError(f"bad allowlist entry: {exc}", entry=entry) from exc
        if not endpoint.literal:
            domains.append(endpoint.host)
        else:
            cidrs.append(f"{endpoint.host}/{128 if ':' in endpoint.host else 32}")
    params: dict[str, object] = {"network_block_all": False}
    if domains:
        params["domain_allow_list"] = ",".join(sorted(set(domains)))
    if cidrs:
        params["network_allow_list"] = ",".join(sorted(set(cidrs)))
    if not domains and not cidrs:
        params["network_block_all"] = True
    return params


def _check_spec(spec: SandboxSpec) -> None:
    """Refuse what Daytona cannot carry.

    Raises:
        SandboxError: extra read-only mounts (Daytona has no host binds), plain tunnels
            to a private model endpoint, or an allowlist entry that is private.
    """
    if spec.network not in ("none", "allowlist"):
        raise SandboxError("unknown network policy", network=spec.network)
    if spec.extra_mounts:
        raise SandboxError("the daytona backend has no host mounts (extra_mounts)")
    if spec.network_tunnels or spec.network_private:
        raise SandboxError(
            "the daytona backend cannot reach a private model endpoint (its sandboxes run "
            "on Daytona's runners)",
            private=list(spec.network_private),
        )
    for path in (spec.workspace, *(m.source for m in spec.state_mounts)):
        if not path.is_dir():
            raise SandboxError("a tree to upload is not a directory", path=str(path))
    targets = [m.target for m in spec.state_mounts]
    for a in targets:
        if any(b != a and b.startswith(a + "/") for b in targets):
            raise SandboxError("nested writable mounts are not supported on daytona", target=a)


__all__ = ["BACKEND_NAME", "DaytonaBackend", "DaytonaSandbox"]
