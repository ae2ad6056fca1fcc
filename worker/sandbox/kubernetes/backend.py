"""The Kubernetes backend itself: ``KubernetesBackend`` (create, destroy, list) and
``KubernetesSandbox`` (spawn). See the package docstring."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.admission import MaskEntry, MaskKind, mask_plan
from worker.errors import SandboxConnectionLost, SandboxError
from worker.sandbox import hostfill
from worker.sandbox.base import (
    HOME,
    LABEL_ATTEMPT,
    LABEL_JOB,
    WORKSPACE,
    Capabilities,
    ExitDiagnosis,
    LeaseDeadline,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    SignalledByCall,
    ended,
    home_relative,
)
from worker.sandbox.kubernetes import manifests, transfer
from worker.sandbox.kubernetes.api import PodApi, cluster_end, connect
from worker.sandbox.kubernetes.files import KubernetesWorkspaceFiles
from worker.sandbox.kubernetes.names import exact_labels, pod_labels
from worker.sandbox.kubernetes.netproxy import PodNetwork
from worker.sandbox.kubernetes.stream import ExecStream
from worker.sandbox.kubernetes.view import pod_admission
from worker.sandbox.launcher import exit_status, launch_header, launcher_argv
from worker.sandbox.shared import check_command, check_id, check_spec

if TYPE_CHECKING:
    from worker.admission.result import AdmissionResult
    from worker.images.engine import EngineConfig
    from worker.sandbox.config import KubernetesConfig

log = logging.getLogger(__name__)

#: The pod's main process: it only waits (and reaps orphans); every program of the
#: sandbox is exec'd beside it, so the pod outlives the agent and what it wrote can be
#: copied out. SIGTERM ends it at once.
KEEPER = (
    "import os,signal,time\n"
    "signal.signal(signal.SIGTERM,lambda *a:os._exit(0))\n"
    "while 1:\n"
    " try:\n"
    "  while os.waitpid(-1,os.WNOHANG)[0]:pass\n"
    " except ChildProcessError:pass\n"
    " time.sleep(1)\n"
)
KEEPER_ARGV = ("/usr/bin/python3", "-I", "-S", "-c", KEEPER)
LAUNCHER_ARGV = launcher_argv(lead_group=True)
SIGNALLER = (
    "import os,sys\n"
    "try: os.killpg(int(sys.argv[1]),int(sys.argv[2]))\n"
    "except ProcessLookupError: pass\n"
)
_PID_DIGITS = 10
_PID_WAIT_S = 60.0
#: How long past its grace a deleted pod may take to be gone before it is forced: the
#: kubelet stops its containers within the grace, then reports, then the API removes it.
DELETE_MARGIN_S = 30
#: How long a diagnosis waits for the pod's status: the job is settling, and a pod the
#: API cannot show quickly tells nothing a job needs to wait for.
DIAGNOSIS_READ_S = 10.0
#: An exec'd program's status when SIGKILL ended it (``NonZeroExitCode`` 137).
KILLED = 128 + signal.SIGKILL


class KubernetesProcess(SignalledByCall):
    """A program exec'd in the sandbox pod. ``pid`` is its pid in the pod (its process
    group); signals are sent by a short exec of ``os.killpg``. A stream that ended
    without the program's status was lost (``lost``): it reads as SIGKILL (the pod is
    deleted with it), and its diagnosis is the pod's end or ``sandbox_connection_lost``,
    never an OOM kill."""

    def __init__(self, sandbox: KubernetesSandbox, stream: ExecStream, pid: int) -> None:
        super().__init__(stdin=stream.stdin, stdout=stream.stdout, stderr=stream.stderr)
        self._sandbox, self._stream, self._pid = sandbox, stream, pid
        self._status: int | None = None
        self.lost = False
        self._waiter = asyncio.ensure_future(self._watch())

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdin_eof(self) -> bool:
        """Closing stdin is the program's EOF: False when the API server negotiated
        ``v4.channel.k8s.io`` (no half-close; the shutdown escalates to signals)."""
        return self._stream.stdin_eof

    @property
    def oom_killed(self) -> bool:
        """SIGKILL that no terminate/kill/destroy of ours explains: in a pod whose memory
        is bounded, the kernel's OOM killer (an exec'd program's end says no more)."""
        return self._status == KILLED and not self.signalled and not self.lost

    async def wait(self) -> int:
        return await asyncio.shield(self._waiter)

    async def exit_diagnosis(self) -> ExitDiagnosis:
        """Its exit status or signal; and when it ended on its own (no terminate/kill/
        destroy of ours), whether the cluster ended its pod under it (evicted, past its
        ``activeDeadlineSeconds``, OOM-killed: ``api.cluster_end``), read once from the
        pod's status. Such an end is the diagnosis's ``sandbox_error`` and explains a
        SIGKILL better than the OOM guess. A pod that cannot be read in
        ``DIAGNOSIS_READ_S`` says nothing (never raises)."""
        plain = ended(self._returncode, oom_killed=self.oom_killed)
        if self._returncode is None or self.signalled or self._sandbox.destroying:
            return plain
        cause = await self._sandbox.cluster_end()
        if self.lost:
            lost = cause or SandboxConnectionLost(
                "the stream to the program in the sandbox pod ended without its exit "
                "status (the connection was lost); the pod is intact",
                pod=self._sandbox.sandbox_id, reason="StreamLost",
            )  # fmt: skip
            return ExitDiagnosis(None, None, sandbox_error=lost)
        if cause is None:
            return plain
        return dataclasses.replace(plain, oom_killed=False, sandbox_error=cause)

    async def _watch(self) -> int:
        status = await self._stream.status
        self.lost = status is None
        self._status = KILLED if status is None else status
        self._returncode = exit_status(self._status)
        return self._returncode

    async def _deliver(self, sig: signal.Signals) -> None:
        await self._sandbox.signal(self._pid, sig)


class KubernetesSandbox:
    """One job attempt's pod (``sandbox_id`` is the pod's name)."""

    def __init__(
        self,
        backend: KubernetesBackend,
        spec: SandboxSpec,
        pod: str,
        *,
        masks: Sequence[MaskEntry] = (),
        made: Sequence[str] = (),
        deadline_s: int,
        begun: float,
    ) -> None:
        """``masks``: mounted over the pod's workspace; ``made``: the anchor directories
        the host workspace did not have (removed after the copy out while empty);
        ``deadline_s``: the pod's ``activeDeadlineSeconds`` as created; ``begun``: when
        its creation was asked for (``time.monotonic``: the pod is active no longer)."""
        self.backend = backend
        self._spec = spec
        self._pod = pod
        self.masks = tuple(masks)
        self.made = tuple(made)
        #: The pod's exact labels as last written (``create``, then ``assign``).
        self.labels = manifests.sandbox_labels(spec, backend.config)
        self.processes: list[KubernetesProcess] = []
        self.files: KubernetesWorkspaceFiles | None = None
        #: Our destroy began: a program that ends now was ended by it, not the cluster.
        self.destroying = False
        #: The pod's ``activeDeadlineSeconds`` as last written (``create``, ``assign``).
        self.deadline_s = deadline_s
        self.begun = begun

    @property
    def sandbox_id(self) -> str:
        return self._pod

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
    ) -> KubernetesProcess:
        """Exec ``argv`` in the pod with exactly ``env`` (sent over stdin, never in the
        pod's configuration).

        Raises:
            SandboxError: the exec could not be opened, or the launcher ended before
                the program started.
        """
        check_command(argv, env, cwd)
        argv, env = self.backend.network.wrap(self._pod, argv, env, self._spec.network_tunnels)
        api = self.backend.api
        ws = await asyncio.to_thread(
            api.exec, self._pod, manifests.CONTAINER, LAUNCHER_ARGV, stdin=True,
            timeout_s=api.exec_timeout_s,
        )  # fmt: skip
        stream = ExecStream(ws, stdout_limit=stdout_limit, ping_s=api.ping_s)
        stream.stdin.write(launch_header(argv, env, cwd))
        try:
            pid = int(await asyncio.wait_for(stream.stdout.readexactly(_PID_DIGITS), _PID_WAIT_S))
        except (asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            stream.abort()
            raise SandboxError(
                "the launcher in the sandbox pod ended before the program started",
                pod=self._pod,
                argv0=argv[0],
            ) from exc
        process = KubernetesProcess(self, stream, pid)
        self.processes.append(process)
        return process

    def admission_view(self, *, provider: str = "cursor") -> AdmissionResult:
        """The admission check in the pod's own view, its masks proven in place
        (``view.pod_admission``; blocking).

        Raises:
            SandboxError: the view could not be read, or a mask is not in place.
            WorkspaceUnavailable: the pod has no workspace directory.
        """
        return pod_admission(
            self.backend.api, self._pod, manifests.CONTAINER, masks=self.masks, provider=provider
        )

    def workspace_files(self) -> KubernetesWorkspaceFiles:
        """The pod's ``/workspace`` through exec, with this pod's masks (``files.py``;
        ``fs/*`` is advertised when the pack keeps ``launch.client_fs``)."""
        if self.files is None:
            self.files = KubernetesWorkspaceFiles(
                self.backend.api, self._pod, manifests.CONTAINER, masks=self.masks
            )
        return self.files

    async def signal(self, pid: int, sig: signal.Signals) -> None:
        """``sig`` to the process group ``pid`` in the pod; one already gone is fine."""
        command = ["/usr/bin/python3", "-I", "-S", "-c", SIGNALLER, str(pid), str(int(sig))]
        with contextlib.suppress(SandboxError):
            await asyncio.to_thread(self.backend.run, self._pod, command)

    def oom_killed(self) -> bool:
        return any(p.oom_killed for p in self.processes)

    async def cluster_end(self) -> SandboxError | None:
        """Why the cluster ended this pod (``api.cluster_end``), or None: it is intact,
        or could not be read within ``DIAGNOSIS_READ_S`` (the API's error, a timeout:
        swallowed and logged, since a diagnosis claims only what it read)."""
        try:
            async with asyncio.timeout(DIAGNOSIS_READ_S):
                pod = await asyncio.to_thread(
                    self.backend.api.read_pod, self._pod, timeout_s=DIAGNOSIS_READ_S
                )
        except Exception as exc:  # a diagnosis never raises: it claims less
            log.warning("the sandbox pod %s could not be read for a diagnosis: %r", self._pod, exc)
            return None
        return None if pod is None else cluster_end(pod)


class KubernetesBackend:
    """``SandboxBackend`` on a Kubernetes cluster: a pod per job attempt in
    ``k8s_namespace``; ``list``/``destroy`` work from any process that reaches the API."""

    name = manifests.BACKEND_NAME
    capabilities = Capabilities(runs_host_usr=False, warm_slots=True)

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        api: PodApi | None = None,
        engine_config: EngineConfig | None = None,
    ) -> None:
        """``api``: the cluster (default: ``connect(config)`` on first use).
        ``engine_config``: the image engine pack images are resolved on (default: the
        docker backend's settings, ``ACPW_DOCKER_HOST``…)."""
        self.config = config
        self._api = api
        self._engine_config = engine_config
        self._sandboxes: dict[str, KubernetesSandbox] = {}
        self._policies_ready = False
        #: What the copy-outs of this process may spool on the worker's disk at once.
        self.disk = transfer.DiskBudget(config.k8s_copy_out_max_bytes)
        #: ``allowlist``: the jobs' proxies behind one TCP front (``netproxy``).
        self.network = PodNetwork(config)

    @property
    def api(self) -> PodApi:
        if self._api is None:
            cfg = self.config
            self._api = PodApi(
                connect(cfg), cfg.k8s_namespace, exec_timeout_s=cfg.k8s_exec_timeout_s,
                copy_timeout_s=cfg.k8s_copy_timeout_s, ping_s=cfg.k8s_exec_ping_s,
            )  # fmt: skip
        return self._api

    def stage_owner(self) -> tuple[int, int]:
        return self.config.host_owner()

    def run(self, pod: str, command: list[str]) -> None:
        """Run a short command in the pod to its end (blocking).

        Raises:
            SandboxError: it could not run or did not exit 0.
        """
        api = self.api
        ws = api.exec(pod, manifests.CONTAINER, command, stdin=False, timeout_s=api.exec_timeout_s)
        try:
            _, err, code = transfer.drain(ws, timeout_s=api.exec_timeout_s, ping_s=api.ping_s)
        finally:
            transfer.close(ws)
        if code != 0:
            raise SandboxError(
                "a command in the sandbox pod failed", pod=pod, exit_code=code, stderr=err
            )

    async def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        """Create the pod, wait until it runs, copy the workspace and the state mounts in.

        Raises:
            SandboxError: the spec asks for what this backend cannot do (``allowlist``
                with no ``k8s_proxy_address``, host mounts), the proxy could not listen,
                the pack image has no digest reference, or the cluster refused or could
                not run the pod (``reason`` says why).
        """
        _check_spec(spec)
        self.network.check(spec)
        masks, made = await asyncio.to_thread(_plan_masks, spec)
        image = await asyncio.to_thread(self._image, spec)
        pod_spec = dataclasses.replace(spec, state_mounts=())
        pod = manifests.sandbox_pod(
            pod_spec,
            image=image,
            config=self.config,
            command=KEEPER_ARGV,
            deadline_s=pod_deadline(spec, self.config),
            masks=masks,
        )
        name = str(pod["metadata"]["name"])
        await self.network.open(name, spec)
        begun = time.monotonic()
        try:
            await self._ensure_policies()
            await self._create_pod(pod, name)
        except BaseException:
            await asyncio.shield(self.network.close(name))
            raise
        try:
            await asyncio.to_thread(
                self.api.wait_running,
                name,
                self.config.k8s_start_timeout_s,
                unschedulable_s=self.config.k8s_unschedulable_timeout_s,
                pull_s=self.config.k8s_image_pull_timeout_s,
            )
            await asyncio.to_thread(self._copy_in, name, spec, masks)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(self._remove, name))
            await asyncio.shield(self.network.close(name))
            raise
        deadline_s = int(pod["spec"]["activeDeadlineSeconds"])
        sandbox = KubernetesSandbox(
            self, spec, name, masks=masks, made=made, deadline_s=deadline_s, begun=begun
        )
        self._sandboxes[name] = sandbox
        return sandbox

    async def assign(
        self,
        sandbox: Sandbox,
        *,
        labels: Mapping[str, str],
        lease_deadline: LeaseDeadline | None,
        deadline_s: int | None = None,
    ) -> None:
        """A warm slot's pod made the attempt's: its labels and their exact annotation
        patched to what ``create`` would have written for the attempt (the reaper judges
        it by the attempt's lease from then on), and in the same patch its
        ``activeDeadlineSeconds`` (a slot's: ``k8s_active_deadline_s``, it had no job)
        brought down to the job's bound: the seconds the pod has been active (counted
        from before its creation was asked for, so never fewer than the kubelet counts)
        plus ``claimed_deadline`` of ``deadline_s``. The API server takes only a lower
        value on a running pod, so a slot too old to give the job its whole bound keeps
        the deadline it has (logged). ``lease_deadline`` is not followed, as ``create``
        does not follow it: a pod is bounded by its lease through the reaper.

        Raises:
            SandboxError: the API refused the patch (the pod is gone, a 403 without
                ``patch`` on pods).
        """
        assert isinstance(sandbox, KubernetesSandbox)
        del lease_deadline
        active_s = math.ceil(time.monotonic() - sandbox.begun)
        wanted = active_s + claimed_deadline(deadline_s, self.config)
        if wanted > sandbox.deadline_s:
            log.warning(
                "the warm slot pod %s has been active %d s: its deadline (%d s) leaves the "
                "job less than its bound",
                sandbox.sandbox_id, active_s, sandbox.deadline_s,
            )  # fmt: skip
        new_deadline = min(wanted, sandbox.deadline_s)
        spec = sandbox.spec
        job_spec = dataclasses.replace(
            spec,
            labels=labels,
            job_id=labels.get(LABEL_JOB, spec.job_id),
            attempt=int(labels.get(LABEL_ATTEMPT, str(spec.attempt))),
        )
        new = manifests.sandbox_labels(job_spec, self.config)
        removed: dict[str, str | None] = {k: None for k in sandbox.labels if k not in new}
        await asyncio.to_thread(
            self.api.patch_pod_metadata,
            sandbox.sandbox_id,
            labels=removed | pod_labels(new),
            annotations={manifests.ANNOTATION_LABELS: exact_labels(new)},
            active_deadline_s=new_deadline if new_deadline < sandbox.deadline_s else None,
        )
        sandbox.labels = new
        sandbox.deadline_s = new_deadline

    async def fill(self, sandbox: Sandbox, staged: Path) -> Path:
        """The staged copy moved into the slot's host workspace (``hostfill``: it was
        empty), then copied into the pod's ``/workspace`` by the copy-in ``create``
        does (tar over exec), what the masks cover left out: the mask volumes stay
        mounted where they are. The copy out at ``destroy`` goes back to that host
        workspace, as a cold pod's goes to its job's.

        Raises:
            SandboxError: the move or the copy in failed.
        """
        assert isinstance(sandbox, KubernetesSandbox)
        workspace = sandbox.spec.workspace
        await asyncio.to_thread(hostfill.move_into, staged, workspace)
        sandbox.made = tuple(_missing_anchors(workspace, sandbox.masks))
        await asyncio.to_thread(
            transfer.put_tree, self.api, sandbox.sandbox_id, manifests.CONTAINER,
            workspace, WORKSPACE, masks=sandbox.masks,
        )  # fmt: skip
        return workspace

    async def _create_pod(self, pod: Mapping[str, Any], name: str) -> None:
        """Create the pod. Cancelled meanwhile (a job cancelled, a warm slot being made
        as its pool closes), the request still goes on in its thread and may make the
        pod after all: it is waited for and the pod deleted before the cancellation
        goes on, so that nothing is left for the reaper."""
        creating = asyncio.ensure_future(asyncio.to_thread(self.api.create_pod, pod))
        try:
            await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(creating)
            await asyncio.shield(asyncio.to_thread(self._remove, name))
            raise

    async def _ensure_policies(self) -> None:
        if self._policies_ready:
            return
        for policy in manifests.network_policies(self.config, self.network.peer()):
            await asyncio.to_thread(self.api.ensure_policy, policy)
        self._policies_ready = True

    def _copy_in(self, pod: str, spec: SandboxSpec, masks: Sequence[MaskEntry]) -> None:
        transfer.put_tree(
            self.api, pod, manifests.CONTAINER, spec.workspace, WORKSPACE, masks=masks
        )
        for state in spec.state_mounts:
            target = f"{HOME}/{home_relative(state.target)}"
            transfer.put_tree(self.api, pod, manifests.CONTAINER, state.source, target)

    def _copy_out(self, pod: str, sandbox: KubernetesSandbox) -> None:
        spec, owner = sandbox.spec, self.stage_owner()
        bound = self.config.k8s_ephemeral_storage_bytes
        transfer.get_tree(
            self.api, pod, manifests.CONTAINER, WORKSPACE, spec.workspace,
            max_bytes=bound, owner=owner, masks=sandbox.masks, budget=self.disk,
        )  # fmt: skip
        for made in sandbox.made:
            with contextlib.suppress(OSError):  # kept when the agent wrote in it
                os.rmdir(spec.workspace / made)
        for state in spec.state_mounts:
            source = f"{HOME}/{home_relative(state.target)}"
            transfer.get_tree(
                self.api, pod, manifests.CONTAINER, source, state.source,
                max_bytes=bound, owner=owner, budget=self.disk,
            )  # fmt: skip

    def _running(self, name: str) -> bool:
        """Whether the pod still runs, so that something can be copied out of it: one
        the cluster ended (evicted, past its deadline) takes exec no more, and its
        emptyDirs go with it (blocking)."""
        pod = self.api.read_pod(name)
        phase = pod.status.phase if pod is not None and pod.status is not None else None
        running = pod is not None and phase == "Running" and cluster_end(pod) is None
        if not running:
            log.warning("the sandbox pod %s is not running: nothing is copied out of it", name)
        return running

    def _image(self, spec: SandboxSpec) -> str:
        """The pack image of ``spec``'s closure, by digest (see ``images``)."""
        from worker.sandbox.kubernetes.images import pack_image

        return pack_image(self.config, spec.pack_closure, self._engine_config)

    def _remove(self, name: str) -> bool:
        """Delete the pod as the API server means deletion (blocking): with the pod's
        own grace (its containers get SIGTERM, the object stays until they stopped),
        confirmed gone; only when it is still there after that grace and a margin
        (a kubelet that does not answer: a lost node) is it deleted with grace 0, which
        removes the object at once whatever its containers still do. False if it was
        not gone in time even so."""
        grace = manifests.TERMINATION_GRACE_S
        if not self.api.delete_pod(name, grace_s=grace):
            return True
        if self.api.wait_gone(name, grace + DELETE_MARGIN_S):
            return True
        log.warning(
            "the sandbox pod %s is still there %d s after its graceful deletion: forcing it",
            name,
            grace + DELETE_MARGIN_S,
        )
        self.api.delete_pod(name, grace_s=0)
        return self.api.wait_gone(name, self.config.k8s_start_timeout_s)

    async def destroy(self, sandbox_id: str) -> None:
        """Copy the workspace and state mounts back (when this process created the pod
        and it still runs), then delete the pod and wait until it is gone; idempotent.

        Raises:
            SandboxError: the copy out or the deletion failed (the pod is deleted
                whatever the copy did).
        """
        check_id(sandbox_id, backend=self.name)
        sandbox = self._sandboxes.pop(sandbox_id, None)
        copy_error: SandboxError | None = None
        if sandbox is not None:
            sandbox.destroying = True
            if sandbox.files is not None:
                await sandbox.files.aclose()
            try:
                if await asyncio.to_thread(self._running, sandbox_id):
                    await asyncio.to_thread(self._copy_out, sandbox_id, sandbox)
            except SandboxError as exc:
                copy_error = exc
        await self.network.close(sandbox_id)
        if not await asyncio.to_thread(self._remove, sandbox_id):
            raise SandboxError("the sandbox pod was not deleted in time", pod=sandbox_id)
        if copy_error is not None:
            raise copy_error

    async def list(self, labels: Mapping[str, str]) -> list[SandboxInfo]:
        """Sandbox pods whose exact labels include all of ``labels``."""
        wanted = {**labels, manifests.LABEL_BACKEND: manifests.BACKEND_NAME}
        selector = ",".join(f"{k}={v}" for k, v in pod_labels(wanted).items())
        pods = await asyncio.to_thread(self.api.list_pods, selector)
        infos = []
        for pod in pods:
            exact = _exact_labels(pod)
            name = pod.metadata.name if pod.metadata is not None else None
            if name and exact is not None and wanted.items() <= exact.items():
                infos.append(SandboxInfo(str(name), self.name, exact))
        return sorted(infos, key=lambda i: i.sandbox_id)


def pod_deadline(spec: SandboxSpec, config: KubernetesConfig) -> int:
    """``activeDeadlineSeconds`` of ``spec``'s pod: its ``deadline_s`` (the job's timeout
    and a margin), never over ``k8s_active_deadline_s``."""
    return claimed_deadline(spec.deadline_s, config)


def claimed_deadline(deadline_s: int | None, config: KubernetesConfig) -> int:
    """What a claimed slot pod may live from its claim on: the bound ``pod_deadline``
    gives a cold pod of the job's ``deadline_s``."""
    cap = config.k8s_active_deadline_s
    return cap if deadline_s is None else max(1, min(deadline_s, cap))


def _plan_masks(spec: SandboxSpec) -> tuple[list[MaskEntry], list[str]]:
    """The masks of ``spec``'s pod, and the anchors its host workspace does not have."""
    masks = mask_plan(spec.workspace) if spec.mask_config else []
    return masks, _missing_anchors(spec.workspace, masks)


def _missing_anchors(workspace: Path, masks: Sequence[MaskEntry]) -> list[str]:
    """The mask anchors the host ``workspace`` does not have (removed after the copy
    out while empty)."""
    anchors = [str(e.path) for e in masks if e.kind is MaskKind.ANCHOR]
    return [p for p in anchors if not os.path.lexists(workspace / p)]


def _exact_labels(pod: Any) -> dict[str, str] | None:
    """The pod's exact labels (its annotation; re-checked against the selector since
    label values may be encodings)."""
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    try:
        exact = json.loads(annotations.get(manifests.ANNOTATION_LABELS, "null"))
    except ValueError:
        return None
    if not isinstance(exact, dict) or not all(isinstance(v, str) for v in exact.values()):
        return None
    return {str(k): v for k, v in exact.items()}


def _check_spec(spec: SandboxSpec) -> None:
    check_spec(spec, python=None)
    if spec.extra_mounts:
        raise SandboxError(
            "a sandbox pod cannot bind host paths (extra mounts)",
            extra_mounts=[m.target for m in spec.extra_mounts],
        )
