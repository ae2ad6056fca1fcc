"""The pack image a sandbox pod runs, named by digest.

A pod cannot bind the closure from the worker's host: only a closure of the pack cache
(``<cache_dir>/closures/<digest>``) can run, from its pack image, found by identity
(base image id, closure digest, builder):

- with ``k8s_base_image_id`` set, in the pin store alone (``images_dir/pins``, written
  by ``acp-worker image build`` with a registry): no engine is needed (a worker pod in
  the cluster has none), and the image must have been pushed;
- else on the image engine ``acp-worker image`` uses (resolved, or built, as the docker
  backend does).

The kubelet gets it by digest: the registry's manifest digest once the image was pushed
(``ACPW_IMAGE_REGISTRY``), else the engine's own digest reference (a cluster whose nodes
share that engine's store, as the API double's Podman does).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from worker.errors import SandboxError
from worker.images.build import PackImages, PinStore
from worker.images.engine import connect, translate
from worker.images.identity import ImageIdentity, PinnedImage

if TYPE_CHECKING:
    from worker.images.engine import EngineConfig
    from worker.sandbox.config import KubernetesConfig

_HEX = re.compile(r"[0-9a-f]{64}")


def pack_image(config: KubernetesConfig, closure: Path, engine: EngineConfig | None) -> str:
    """``name@sha256:…`` of the pack image of ``closure`` (built when missing).

    Raises:
        SandboxError: the closure is not one of the pack cache, the engine failed, or
            the image has no digest reference.
        ImageMismatch: an image tagged with the identity is not it.
    """
    digest = _closure_digest(config, closure)
    if config.k8s_base_image_id is not None:
        return _recorded(config, ImageIdentity(config.k8s_base_image_id, digest))
    if engine is None:
        from worker.sandbox.config import DockerConfig

        engine = DockerConfig(worker_id=config.worker_id, cache_dir=config.cache_dir).engine()
    client = connect(engine)
    try:
        images = PackImages(client, engine)
        identity = ImageIdentity(images.base_id(), digest)
        pin = images.resolve(identity) or images.build(closure, identity)
        return _reference(client, pin)
    finally:
        client.close()


def _recorded(config: KubernetesConfig, identity: ImageIdentity) -> str:
    """The pushed reference the pin store records for ``identity``."""
    store = PinStore((config.images_dir or config.cache_dir / "images") / "pins")
    try:
        pin = store.read(identity)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SandboxError(
            "the pack image's pin is unreadable", identity=identity.digest, error=str(exc)
        ) from exc
    if pin is None or pin.pushed is None:
        raise SandboxError(
            "no pushed pack image is recorded for this closure: run `acp-worker image "
            "build PACK` with ACPW_IMAGE_REGISTRY and give the worker its pins",
            identity=identity.digest,
        )
    return pin.pushed.reference


def _closure_digest(config: KubernetesConfig, closure: Path) -> str:
    closures = (config.cache_dir / "closures").resolve()
    resolved = closure.resolve()
    if resolved.parent != closures or not _HEX.fullmatch(resolved.name):
        raise SandboxError(
            "a sandbox pod runs a pack image: its closure must be one of the pack cache",
            closure=str(closure),
        )
    return f"sha256:{resolved.name}"


def _reference(client: object, pin: PinnedImage) -> str:
    if pin.pushed is not None:
        return pin.pushed.reference
    repository = pin.identity.tag.rpartition(":")[0]
    with translate("inspect image", image=pin.image_id):
        attrs = client.api.inspect_image(pin.image_id)  # type: ignore[attr-defined]
    digests = [
        str(d) for d in attrs.get("RepoDigests") or [] if str(d).startswith(repository + "@")
    ]
    if not digests:
        raise SandboxError(
            "the pack image has no digest reference: push it to a registry "
            "(`acp-worker image build` with ACPW_IMAGE_REGISTRY)",
            image=pin.image_id,
        )
    return digests[0]
