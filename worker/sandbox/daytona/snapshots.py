"""The snapshots of the Daytona backend: one per pack image, named by our content
identity, built, activated or rebuilt as Daytona's snapshot lifecycle needs, with the
registry credentials a private pull needs. See the package docstring."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from typing import TYPE_CHECKING, Any

from worker.errors import BackendAuthFailed, SandboxError, SnapshotFailed
from worker.images.identity import PACK_REPO, ImageIdentity
from worker.sandbox.base import SandboxSpec
from worker.sandbox.daytona import sdk
from worker.sandbox.daytona.api import Api

if TYPE_CHECKING:
    from daytona import AsyncDaytona, CreateSnapshotParams

    from worker.sandbox.config import DaytonaConfig

log = logging.getLogger(__name__)

_GIB = 1024**3


class Snapshots:
    """The snapshot side of one ``DaytonaBackend`` (its config and API wrapper)."""

    def __init__(self, config: DaytonaConfig, api: Api) -> None:
        self.config = config
        self.api = api

    def snapshot_plan(self, spec: SandboxSpec) -> tuple[str, str, tuple[int, int]]:
        """(snapshot name, image reference, (CPUs, GiB of memory)) of the spec's pack
        image.

        The name carries our content identity of the pack image (not the registry's
        digest, which Daytona rewrites) and the resources, which Daytona fixes per
        snapshot.

        Raises:
            SandboxError: the closure is not one of the pack cache, or the registry or
                the base image id is not configured.
        """
        closure = spec.pack_closure.resolve()
        closures = (self.config.cache_dir / "closures").resolve()
        if closure.parent != closures or not re.fullmatch(r"[0-9a-f]{64}", closure.name):
            raise SandboxError(
                "the daytona backend runs pack-cache closures only (from their pack image)",
                closure=str(spec.pack_closure),
            )
        registry, base = self.config.daytona_image_registry, self.config.daytona_base_image_id
        if not registry or not base:
            raise SandboxError(
                "set ACPW_DAYTONA_IMAGE_REGISTRY and ACPW_DAYTONA_BASE_IMAGE_ID: Daytona "
                "makes its snapshots from the pack images pushed there"
            )
        identity = ImageIdentity(base, f"sha256:{closure.name}")
        hexdigest = identity.digest.removeprefix("sha256:")
        image = f"{registry.rstrip('/')}/{PACK_REPO.rpartition('/')[2]}:{hexdigest}"
        cpu = max(1, math.ceil(spec.limits.cpus))
        memory = max(1, math.ceil(spec.limits.memory_bytes / _GIB))
        name = f"acpw-{hexdigest[:40]}-c{cpu}m{memory}"
        return name, image, (cpu, memory)

    async def ensure_snapshot(self, client: AsyncDaytona, spec: SandboxSpec) -> str:
        """The spec's snapshot, active and verified: reused when present, else created;
        an inactive one activated; one whose build failed deleted and built again
        (``daytona_snapshot_rebuilds`` times, the wait doubling from
        ``daytona_snapshot_rebuild_backoff_s``).

        Raises:
            SnapshotFailed: it still failed to build after the rebuilds
                (``reason: build_failed``), stayed short of ``active`` past
                ``daytona_snapshot_timeout_s`` (``reason: pending``, its last ``state``
                in the details), or names another image (``reason: identity``).
            SandboxError: (or a subclass) Daytona refused otherwise.
        """
        name, image, (cpu, memory) = self.snapshot_plan(spec)
        d = sdk.module()
        params = d.CreateSnapshotParams(
            name=name, image=image, resources=d.Resources(cpu=cpu, memory=memory)
        )
        seen: dict[str, str] = {}
        rebuilds = 0
        while True:
            try:
                found = await asyncio.wait_for(
                    self._snapshot_active(client, params, seen),
                    timeout=self.config.daytona_snapshot_timeout_s,
                )
                break
            except TimeoutError:
                state = seen.get("state") or await self._state_now(client, name)
                raise SnapshotFailed(
                    f"daytona: snapshot {name} not active after "
                    f"{self.config.daytona_snapshot_timeout_s:g} s (it is {state})",
                    snapshot=name, reason="pending", state=state,
                ) from None  # fmt: skip
            except SnapshotFailed as exc:
                if exc.details.get("reason") not in ("build_failed", "error"):
                    raise
                if rebuilds >= self.config.daytona_snapshot_rebuilds:
                    raise SnapshotFailed(
                        exc.message, **{**exc.details, "rebuilds": rebuilds}
                    ) from None
                wait = self.config.daytona_snapshot_rebuild_backoff_s * 2**rebuilds
                rebuilds += 1
                log.warning(
                    "daytona: snapshot %s failed to build (%s); rebuilding in %g s (%d of %d)",
                    name, exc.message, wait, rebuilds, self.config.daytona_snapshot_rebuilds,
                )  # fmt: skip
                await self._delete_snapshot(client, name)
                await asyncio.sleep(wait)
        recorded = getattr(found, "image_name", None)
        if recorded != image:
            raise SnapshotFailed(
                f"daytona: snapshot {name} was made from another image",
                snapshot=name, reason="identity", expected=image, recorded=recorded,
            )  # fmt: skip
        return name

    async def _snapshot_active(
        self, client: AsyncDaytona, params: CreateSnapshotParams, seen: dict[str, str]
    ) -> Any:
        """The snapshot once ``active``: made when missing, activated when inactive,
        polled while on its way (its last state kept in ``seen``).

        Raises:
            SnapshotFailed: its build failed (``reason`` the state) or it vanished.
        """
        name = params.name
        found = await self._get_snapshot(client, name)
        if found is None:
            await self.ensure_registry(client)
            found = await self._create_snapshot(client.snapshot, params)
        snapshots = client.snapshot
        activated = False
        while True:
            state = str(getattr(found.state, "value", found.state))
            seen["state"] = state
            if state == "active":
                return found
            if state in ("error", "build_failed"):
                raise SnapshotFailed(
                    f"daytona: snapshot {name} failed: {found.error_reason or state}",
                    snapshot=name,
                    reason=state,
                )
            if state == "inactive" and not activated:
                found = await self.api.call(
                    "activate snapshot", lambda: snapshots.activate(name), snapshot=name
                )
                activated = True
                continue
            await asyncio.sleep(1.0)
            found = await self._get_snapshot(client, name)
            if found is None:
                raise SnapshotFailed(f"daytona: snapshot {name} vanished", snapshot=name)

    async def ensure_registry(self, client: AsyncDaytona) -> None:
        """With registry credentials set, register them with Daytona for the pack images'
        registry (a Docker registry of the organisation named ``acpw-<host>``, made or
        updated), so its snapshot builds can pull from a private registry. The password
        travels in that request's body only; it is never logged nor in an error.

        Raises:
            BackendAuthFailed: the password file cannot be read.
            SandboxError: Daytona refused.
        """
        user = self.config.daytona_registry_username
        try:
            password = self.config.registry_password()
        except OSError as exc:
            raise BackendAuthFailed(
                "the Daytona registry password file cannot be read",
                path=str(self.config.daytona_registry_password_file),
            ) from exc
        registry = self.config.daytona_image_registry
        if not user or not password or not registry:
            return
        host = registry.split("/", 1)[0]
        name = "acpw-" + re.sub(r"[^a-z0-9-]", "-", host.lower())
        models = sdk.api_models()
        registries = models.DockerRegistryApi(client._api_client)  # the SDK has no service for it
        found = await self.api.call("list registries", registries.list_registries)
        have = next((r for r in found if r.name == name), None)
        if have is None:
            body = models.CreateDockerRegistry(
                name=name, url=host, username=user, password=password, project=""
            )
            await self.api.call(
                "register registry", lambda: registries.create_registry(body), registry=host
            )
        else:
            update = models.UpdateDockerRegistry(
                name=name, url=host, username=user, password=password, project=""
            )
            await self.api.call(
                "update registry",
                lambda: registries.update_registry(have.id, update),
                registry=host,
            )

    async def _state_now(self, client: AsyncDaytona, name: str) -> str | None:
        """The snapshot's state as Daytona answers now (``None``: not known)."""
        with contextlib.suppress(SandboxError, TimeoutError):
            found = await asyncio.wait_for(self._get_snapshot(client, name), 30)
            if found is not None:
                return str(getattr(found.state, "value", found.state))
        return None

    async def _delete_snapshot(self, client: AsyncDaytona, name: str) -> None:
        snapshots = client.snapshot
        try:
            await self.api.call("delete snapshot", lambda: snapshots.delete(name), snapshot=name)
        except SandboxError as exc:
            if exc.details.get("status") != 404:
                raise

    async def _get_snapshot(self, client: AsyncDaytona, name: str) -> Any:
        snapshots = client.snapshot
        try:
            return await self.api.call("get snapshot", lambda: snapshots.get(name), snapshot=name)
        except SandboxError as exc:
            if exc.details.get("status") == 404:
                return None
            raise

    async def _create_snapshot(self, snapshots: Any, params: CreateSnapshotParams) -> Any:
        try:
            with self.api.translating("create snapshot", snapshot=params.name):
                try:
                    return await snapshots.create(params)
                except sdk.module().DaytonaConflictError:  # another worker is making it
                    return await snapshots.get(params.name)
        except SnapshotFailed:
            raise
        except SandboxError as exc:
            if exc.code != "sandbox_failed":
                raise  # auth, quota, rate limit: not the snapshot's fault
            details = {**exc.details, "snapshot": params.name, "reason": "build_failed"}
            raise SnapshotFailed(exc.message, **details) from None

    # --- sandboxes ---------------------------------------------------------------------
