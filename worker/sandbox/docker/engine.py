"""The engine calls of the docker backend: create, attach, start, signal, wait, remove,
list — blocking SDK calls, each translated at the seam (``worker.images.engine``)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from worker.admission import MaskEntry
from worker.errors import ImageMismatch, SandboxError
from worker.images.build import PackImages
from worker.images.engine import EngineConfig, connect, translate
from worker.sandbox.base import (
    SandboxInfo,
    SandboxSpec,
)
from worker.sandbox.docker.containers import (
    BACKEND_NAME,
    LABEL_BACKEND,
    LABEL_SANDBOX,
    ImagePlan,
    Started,
    container_config,
    own_labels,
)
from worker.sandbox.docker.process import DockerProcess, StdinWriter, demultiplex

if TYPE_CHECKING:
    import docker


class ContainerEngine:
    """One Docker-API engine, connected lazily; remembers the containers ``prestart``
    started ahead of their spawn."""

    def __init__(self, config: EngineConfig, *, client: docker.DockerClient | None = None) -> None:
        self.config = config
        self._client = client
        self._images: PackImages | None = None
        self._podman: bool | None = None
        self._started: dict[str, Started] = {}

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect(self.config)
        return self._client

    @property
    def images(self) -> PackImages:
        if self._images is None:
            self._images = PackImages(self.client, self.config)
        return self._images

    def is_podman(self) -> bool:
        if self._podman is None:
            with translate("version"):
                components = self.client.version().get("Components") or []
            self._podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        return self._podman

    async def create_container(
        self,
        spec: SandboxSpec,
        plan: ImagePlan,
        labels: Mapping[str, str],
        name: str,
        masks: Sequence[MaskEntry] = (),
    ) -> str:
        """Create (not start) one container of the sandbox; returns its id."""
        return await asyncio.to_thread(self.create_container_now, spec, plan, labels, name, masks)

    def create_container_now(
        self,
        spec: SandboxSpec,
        plan: ImagePlan,
        labels: Mapping[str, str],
        name: str,
        masks: Sequence[MaskEntry],
    ) -> str:
        """``create_container``, blocking."""
        api: Any = self.client.api
        podman = self.is_podman()
        config = container_config(api, spec, plan, labels, podman=podman, masks=masks)
        with translate("create container", sandbox_id=labels.get(LABEL_SANDBOX)):
            created = api.create_container_from_config(config, name=name)
        return str(created["Id"])

    async def start(
        self,
        plan: ImagePlan,
        container: str,
        header: bytes,
        stdout_limit: int,
        *,
        sock: socket.socket | None = None,
        on_started: Callable[[str], None] | None = None,
    ) -> DockerProcess:
        """Check the image, attach, start, send the launch header (``sock``: the attach
        socket of a container ``prestart`` already started). ``on_started(container)``
        runs (in a thread) once the container runs, before the header goes; what it
        raises fails the start."""
        if sock is None:
            sock = await asyncio.to_thread(self._attach_and_start, container, plan, on_started)
        loop = asyncio.get_running_loop()
        raw = asyncio.StreamReader(limit=2**20)
        transport, protocol = await loop.create_connection(
            lambda: asyncio.StreamReaderProtocol(raw), sock=sock
        )
        stdin = StdinWriter(transport, protocol, raw, loop)
        stdout = asyncio.StreamReader(limit=stdout_limit)
        stderr = asyncio.StreamReader(limit=stdout_limit)
        pump = asyncio.create_task(demultiplex(raw, stdout, stderr))
        stdin.write(header)
        process = DockerProcess(
            self, container, stdin=stdin, stdout=stdout, stderr=stderr, pump=pump, pid=0
        )
        await stdin.drain()
        return process

    def _attach_and_start(
        self,
        container: str,
        plan: ImagePlan,
        on_started: Callable[[str], None] | None = None,
    ) -> socket.socket:
        api = self.client.api
        with translate("start container", container=container):
            self._check_image(container, plan)
            response_sock = api.attach_socket(
                container, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            raw = getattr(response_sock, "_sock", response_sock)
            # Our own descriptor for asyncio; the SDK's response object is closed.
            sock = socket.socket(fileno=os.dup(raw.fileno()))
            response_sock.close()
            raw.close()
            try:
                api.start(container)
                if on_started is not None:
                    on_started(container)
            except BaseException:
                sock.close()
                raise
        return sock

    def prestart(
        self,
        sandbox_id: str,
        container: str,
        plan: ImagePlan,
        on_started: Callable[[str], None] | None = None,
    ) -> Started:
        """Check the image, attach and start ``container`` (blocking); its launcher waits
        for the header that the sandbox's next ``spawn`` sends, on this attach socket.
        ``on_started`` as for ``start``.

        Raises:
            ImageMismatch: the container's image is not the pinned one.
            SandboxError: the engine could not attach, start or inspect it.
        """
        sock = self._attach_and_start(container, plan, on_started)
        try:
            pid = self.init_pid(container)
        except BaseException:
            sock.close()
            raise
        started = Started(container, sock, pid)
        self._started[sandbox_id] = started
        return started

    def init_pid(self, container: str) -> int:
        """The host pid of a running container's init (0 when the engine does not say).

        Raises:
            SandboxError: the engine could not inspect it.
        """
        with translate("inspect container", container=container):
            state = self.client.api.inspect_container(container)["State"]
        return int(state.get("Pid") or 0)

    def started(self, sandbox_id: str) -> Started | None:
        """The container ``prestart`` started and no spawn has used yet."""
        return self._started.get(sandbox_id)

    def take_started(self, sandbox_id: str) -> Started | None:
        return self._started.pop(sandbox_id, None)

    def _check_image(self, container: str, plan: ImagePlan) -> None:
        image = str(self.client.api.inspect_container(container)["Image"])
        if not image.startswith("sha256:"):
            image = f"sha256:{image}"
        if image != plan.image_id:
            raise ImageMismatch(
                "the container's image is not the pinned one",
                container=container,
                expected=plan.image_id,
                actual=image,
            )
        if plan.pin is not None:
            self.images.check(plan.pin)

    # --- signals, wait ------------------------------------------------------------------

    async def signal(self, container: str, sig: signal.Signals) -> None:
        """Send ``sig`` to a container; a container that already stopped is fine."""
        import docker.errors

        def send() -> None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self.client.api.kill(container, signal=int(sig))

        await asyncio.to_thread(send)

    async def wait_container(self, container: str) -> int:
        """The container's exit status; -SIGKILL-equivalent 137 when it was removed."""
        import docker.errors

        def wait() -> int:
            try:
                return int(self.client.api.wait(container)["StatusCode"])
            except docker.errors.NotFound:
                return 128 + signal.SIGKILL  # destroyed (force-removed) while running

        with translate("wait container", container=container):
            return await asyncio.to_thread(wait)

    async def oom_killed(self, container: str) -> bool:
        """The engine's ``State.OOMKilled`` of a container; False when it cannot say."""
        import docker.errors

        def inspect() -> bool:
            try:
                state = self.client.api.inspect_container(container)["State"]
            except (docker.errors.DockerException, OSError, SandboxError, KeyError, TypeError):
                return False  # gone, or the engine is unreachable: no evidence
            return bool(state.get("OOMKilled"))

        return await asyncio.to_thread(inspect)

    def kill_all(self, sandbox_id: str) -> builtins.list[dict[str, Any]]:
        api = self.client.api
        with translate("destroy", sandbox_id=sandbox_id):
            found: builtins.list[dict[str, Any]] = api.containers(
                all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}
            )
            for container in found:
                if container.get("State") == "running":
                    self._kill(container["Id"])
        return found

    def remove_all(self, found: builtins.list[dict[str, Any]]) -> None:
        with translate("destroy"):
            for container in found:
                self._remove(container["Id"])

    def _kill(self, container: str) -> None:
        import docker.errors

        # SIGKILL first and wait for the exit: a forced removal alone stops the
        # container with SIGTERM, which the program could answer with a clean exit 0.
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.kill(container, signal=int(signal.SIGKILL))
            self.client.api.wait(container, timeout=30)

    def _remove(self, container: str) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_container(container, force=True, v=True)


def list_sandboxes(api: Any, labels: Mapping[str, str]) -> list[SandboxInfo]:
    """The engine's sandboxes whose labels include all of ``labels`` (blocking).

    A sandbox's labels are its newest container's (a warm slot's next container is made
    with the labels of the attempt that claimed it: ``DockerSandbox.assign``).
    """
    wanted = {**labels, LABEL_BACKEND: BACKEND_NAME}
    with translate("list"):
        # Every sandbox's containers: an older one may carry labels that match.
        found = api.containers(all=True, filters={"label": [f"{LABEL_BACKEND}={BACKEND_NAME}"]})
    newest: dict[str, tuple[int, dict[str, str]]] = {}
    for container in found:
        have = {str(k): str(v) for k, v in (container.get("Labels") or {}).items()}
        sandbox_id = have.get(LABEL_SANDBOX)
        if not sandbox_id:
            continue
        rank = _sequence(container, sandbox_id)
        if sandbox_id not in newest or rank > newest[sandbox_id][0]:
            newest[sandbox_id] = (rank, have)
    # Filters are checked here: an engine may match label filters loosely.
    infos = [
        SandboxInfo(sandbox_id, BACKEND_NAME, own_labels(have))
        for sandbox_id, (_, have) in newest.items()
        if wanted.items() <= have.items()
    ]
    return sorted(infos, key=lambda i: i.sandbox_id)


def _sequence(container: Mapping[str, Any], sandbox_id: str) -> int:
    """A container's place in its sandbox: 0 for the first (named as the sandbox), ``n``
    for ``<sandbox id>-<n>`` (``DockerSandbox._next_name``)."""
    for name in container.get("Names") or ():
        rest = str(name).lstrip("/").removeprefix(sandbox_id)
        if rest.startswith("-") and rest[1:].isdigit():
            return int(rest[1:])
    return 0


def sandbox_status(api: Any, sandbox_id: str) -> dict[str, object] | None:
    """Per-container state of a sandbox (running, exit status, OOM as inferred; blocking)."""
    with translate("status", sandbox_id=sandbox_id):
        found = api.containers(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})
        states = [api.inspect_container(c["Id"])["State"] for c in found]
    if not states:
        return None
    return {
        "running": any(s.get("Running") for s in states),
        "exit_codes": [s.get("ExitCode") for s in states],
        "oom_killed": any(s.get("OOMKilled") or s.get("ExitCode") == 137 for s in states),
    }
