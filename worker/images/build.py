"""Pack images: resolve (reuse) by identity, build when missing, check before start.

    resolve(closure)  tag ``localhost/acpw-pack:<identity>`` exists — or, with a registry
                      configured, is pulled from it (by the manifest digest recorded at
                      push, else by the identity tag) — its labels match the identity,
                      its layers are the base's plus one, and its id equals the pin
                      recorded when it was first built or resolved → reuse
    build(closure)    resolve, else build ``images/pack.Containerfile`` FROM the base id
                      with the closure as the one extra layer; record the pin; with a
                      registry configured, push ``<registry>/acpw-pack:<identity>`` and
                      record the manifest digest the registry reports
    check(pin)        before every container start: the image with the pinned id still
                      exists and carries the identity's labels

Anything that contradicts a pin raises :class:`~worker.errors.ImageMismatch`. Pins are
JSON files ``<images_dir>/pins/<identity hex>.json``, written atomically.

Whether a registry is reached over TLS is the engine's business (Docker's
``insecure-registries``, Podman's ``registries.conf``), not the worker's.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from worker.errors import ImageMismatch, SandboxError
from worker.images.base import (
    IMAGES_SRC,
    BaseRecipe,
    Progress,
    build_chunk,
    ensure_base,
    find_base,
    low_level_api,
)
from worker.images.engine import EngineConfig, translate
from worker.images.identity import (
    PACK_REPO,
    ImageIdentity,
    PinnedImage,
    PushedImage,
)

if TYPE_CHECKING:
    import docker


PACK_REPO_NAME = PACK_REPO.rpartition("/")[2]  # acpw-pack, under the registry
_PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def _quiet(_: str) -> None:
    return None


class PinStore:
    """Identity → image id, one small JSON file per identity."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, identity: ImageIdentity) -> Path:
        return self.root / f"{identity.digest.removeprefix('sha256:')}.json"

    def read(self, identity: ImageIdentity) -> PinnedImage | None:
        try:
            data = json.loads(self._path(identity).read_text())
        except FileNotFoundError:
            return None
        pushed = data.get("pushed")
        return PinnedImage(
            identity, str(data["image_id"]), PushedImage.from_json(pushed) if pushed else None
        )

    def write(self, pin: PinnedImage) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(pin.identity)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(pin.to_json(), sort_keys=True))
        tmp.replace(path)

    def forget(self, identity: ImageIdentity) -> None:
        self._path(identity).unlink(missing_ok=True)


class _EngineImages:
    """The engine and registry calls on images: inspect, tag, build, push, pull."""

    def __init__(
        self, client: docker.DockerClient, config: EngineConfig, progress: Progress
    ) -> None:
        self._client = client
        self._config = config
        self._progress = progress

    def inspect(self, ref: str) -> dict[str, object] | None:
        import docker.errors

        with translate("inspect image", image=ref):
            try:
                attrs: dict[str, object] = low_level_api(self._client).inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None
        return attrs

    def build(self, context: IO[bytes], identity: ImageIdentity, labels: dict[str, str]) -> str:
        image_id: str | None = None

        with translate("build pack image", tag=identity.tag):
            for chunk in self._client.api.build(
                fileobj=context,
                custom_context=True,
                dockerfile="Containerfile",
                tag=identity.tag,
                labels=labels,
                buildargs={"BASE": identity.base_id.removeprefix("sha256:")},
                rm=True,
                forcerm=True,
                decode=True,
            ):
                image_id = build_chunk(chunk, self._progress) or image_id
        if image_id is None:
            raise SandboxError("the engine's build reported no image id", tag=identity.tag)
        return image_id

    def _repository(self) -> str:
        return f"{(self._config.registry or '').rstrip('/')}/{PACK_REPO_NAME}"

    def tag(self, image_id: str, tag: str) -> None:
        repository, _, name = tag.rpartition(":")
        with translate("tag image", image=image_id, tag=tag):
            self._client.api.tag(image_id, repository, name)

    def push(self, pin: PinnedImage) -> PushedImage:
        """Push ``<registry>/acpw-pack:<identity hex>``; the manifest digest it got.

        Raises:
            SandboxError: the push failed or reported no digest.
        """
        repository = self._repository()
        tag = pin.identity.digest.removeprefix("sha256:")
        self._progress(f"pushing {repository}:{tag}")
        self.tag(pin.image_id, f"{repository}:{tag}")
        digest: str | None = None
        with translate("push pack image", repository=repository):
            for chunk in self._client.api.push(repository, tag=tag, stream=True, decode=True):
                digest = push_chunk(chunk, self._progress) or digest
        if digest is None:
            raise SandboxError("the engine's push reported no digest", repository=repository)
        return PushedImage(repository, tag, digest)

    def pull(self, identity: ImageIdentity, recorded: PinnedImage | None) -> str | None:
        """Pull the identity's image from the registry: by the digest recorded at push,
        else by the identity tag. The pulled reference; None without a registry or when
        the registry has no such manifest.

        Raises:
            SandboxError: the registry or the engine failed otherwise.
        """
        import docker.errors

        if not self._config.registry:
            return None
        pushed = recorded.pushed if recorded else None
        tag = identity.digest.removeprefix("sha256:")
        ref = pushed.reference if pushed else f"{self._repository()}:{tag}"
        self._progress(f"pulling {ref}")
        with translate("pull pack image", reference=ref):
            try:
                chunks = list(self._client.api.pull(ref, stream=True, decode=True))
            except docker.errors.NotFound:  # Docker answers 404; Podman streams an error
                return None
        for chunk in chunks:
            if "error" in chunk:
                _raise_unless_missing(ref, str(chunk["error"]))
                return None
        return ref


class _Verify:
    """What makes an image the one an identity names: its id, labels and layers."""

    def __init__(self, engine: _EngineImages) -> None:
        self._engine = engine

    def pinned(self, pin: PinnedImage) -> None:
        """See :meth:`PackImages.check`."""
        attrs = self._engine.inspect(pin.image_id)
        if attrs is None:
            raise ImageMismatch(
                f"pinned image {pin.image_id} is no longer on the engine",
                image_id=pin.image_id,
                identity=pin.identity.digest,
            )
        if str(attrs["Id"]) != pin.image_id:
            raise ImageMismatch(
                "the engine returned another image for the pinned id",
                expected=pin.image_id,
                actual=str(attrs["Id"]),
            )
        self.labels(pin, attrs)

    @staticmethod
    def labels(pin: PinnedImage, attrs: Mapping[str, Any]) -> None:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        wrong = pin.identity.mismatches(labels)
        if wrong:
            raise ImageMismatch(
                f"image {attrs.get('Id')} does not carry the labels of {pin.identity.digest}",
                image_id=str(attrs.get("Id")),
                labels={k: {"expected": e, "actual": a} for k, (e, a) in wrong.items()},
            )

    def layers(self, pin: PinnedImage, attrs: Mapping[str, object]) -> None:
        # A pack image is its base plus exactly one layer: an image derived from it
        # (same inherited labels, re-tagged) has more and is refused.
        base = self._engine.inspect(pin.identity.base_id)
        layers = _layers(attrs)
        base_layers = _layers(base) if base is not None else None
        if base_layers is None or layers[:-1] != base_layers or len(layers) != len(base_layers) + 1:
            raise ImageMismatch(
                f"{pin.identity.tag} is not its base image plus one pack layer",
                image_id=pin.image_id,
                layers=len(layers),
                base_layers=None if base_layers is None else len(base_layers),
            )


class PackImages:
    """Resolve, build and check pack images on one engine.

    The engine and registry calls (:class:`_EngineImages`), the checks that an image is
    its identity's (:class:`_Verify`) and the pins (:class:`PinStore`) are its parts.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        config: EngineConfig,
        *,
        images_src: Path = IMAGES_SRC,
        progress: Progress = _quiet,
    ) -> None:
        self.client = client
        self.config = config
        self.images_src = images_src
        self.recipe = BaseRecipe.from_config(config, images_src)
        self.pins = PinStore(config.images_dir / "pins")
        self.progress = progress
        self._engine = _EngineImages(client, config, progress)
        self._verify = _Verify(self._engine)

    # --- base ---------------------------------------------------------------------------

    def base_id(self, *, build: bool = False) -> str:
        """The base image id; built first when ``build`` and missing.

        Raises:
            SandboxError: no base image and ``build`` is false, or the build failed.
        """
        if build:
            return ensure_base(self.client, self.config, self.recipe, self.progress)
        found = find_base(self.client, self.recipe)
        if found is None:
            raise SandboxError(
                "the sandbox base image is not built on this engine: run "
                "`acp-worker image base` (or `make base-image`, about 70 s once)",
                tag=self.recipe.tag,
            )
        return found

    def identity(self, closure_digest: str, *, build_base: bool = False) -> ImageIdentity:
        return ImageIdentity(self.base_id(build=build_base), closure_digest)

    # --- resolve / build / check --------------------------------------------------------

    def resolve(self, identity: ImageIdentity) -> PinnedImage | None:
        """The image for ``identity``, pinned: the engine's, else the registry's (pulled);
        None when neither has it.

        Raises:
            ImageMismatch: an image is tagged with the identity but is not it.
            SandboxError: the engine or the registry failed.
        """
        recorded = self.pins.read(identity)
        attrs = self._engine.inspect(identity.tag)
        pulled = None
        if attrs is None:
            pulled = self._engine.pull(identity, recorded)
            attrs = None if pulled is None else self._engine.inspect(pulled)
            if attrs is None:
                return None
        pin = PinnedImage(identity, str(attrs["Id"]), recorded.pushed if recorded else None)
        self._verify.labels(pin, attrs)
        if recorded is not None and recorded.image_id != pin.image_id:
            raise ImageMismatch(
                f"{identity.tag} is image {pin.image_id}, but {recorded.image_id} was pinned",
                tag=identity.tag,
                expected=recorded.image_id,
                actual=pin.image_id,
            )
        self._verify.layers(pin, attrs)
        if pulled is not None:  # only now that it passed: under the identity's own tag
            self._engine.tag(pin.image_id, identity.tag)
        if recorded is None:
            self.pins.write(pin)
        return pin

    def build(
        self,
        closure: Path,
        identity: ImageIdentity,
        *,
        pack_labels: Mapping[str, str] | None = None,
    ) -> PinnedImage:
        """Reuse the image for ``identity`` or build it from the verified ``closure``;
        push it when a registry is configured (a push of what the registry has is cheap).

        Raises:
            ImageMismatch: an existing image contradicts the identity.
            SandboxError: the build or the push failed.
        """
        pin = self.resolve(identity) or self._build_new(closure, identity, pack_labels)
        if not self.config.registry:
            return pin
        pushed = self._engine.push(pin)
        pin = dataclasses.replace(pin, pushed=pushed)
        self.pins.write(pin)
        self.progress(f"pushed {pushed.reference}")
        return pin

    def _build_new(
        self, closure: Path, identity: ImageIdentity, pack_labels: Mapping[str, str] | None
    ) -> PinnedImage:
        labels = {**(pack_labels or {}), **identity.labels()}
        self.progress(f"building {identity.tag}")
        with tempfile.TemporaryFile() as context:
            _write_context(context, self._containerfile(), closure)
            context.seek(0)
            image_id = self._engine.build(context, identity, labels)
        pin = PinnedImage(identity, image_id)
        self.check(pin)
        self.pins.write(pin)
        return pin

    def check(self, pin: PinnedImage) -> None:
        """The pinned image still exists with its id and the identity's labels.

        Raises:
            ImageMismatch: it is gone or its labels differ.
        """
        self._verify.pinned(pin)

    def _containerfile(self) -> str:
        path = self.images_src / "pack.Containerfile"
        try:
            return path.read_text()
        except OSError as exc:
            raise SandboxError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc


def push_chunk(chunk: Mapping[str, object], progress: Progress) -> str | None:
    """One chunk of the engine's push stream: its manifest digest when it names one.

    Docker reports ``aux.Digest``; both Docker and Podman end with a status line
    ``<tag>: digest: sha256:<hex> size: <n>``.

    Raises:
        SandboxError: the chunk is an error.
    """
    if "error" in chunk:
        raise SandboxError(f"push failed: {chunk['error']}", detail=chunk.get("errorDetail"))
    status = str(chunk.get("status", ""))
    if status:
        progress(status)
    aux = chunk.get("aux")
    if isinstance(aux, Mapping) and isinstance(aux.get("Digest"), str):
        return str(aux["Digest"])
    found = _PUSHED_DIGEST.search(status)
    return found.group(1) if found else None


def _raise_unless_missing(ref: str, message: str) -> None:
    # The distribution API's MANIFEST_UNKNOWN / NAME_UNKNOWN: the registry simply has no
    # such image (or repository yet); anything else is a failure to report.
    if not any(code in message.lower() for code in ("manifest unknown", "name unknown")):
        raise SandboxError(f"pull of {ref} failed: {message}", reference=ref)


def _layers(attrs: Mapping[str, Any]) -> list[str]:
    return list((attrs.get("RootFS") or {}).get("Layers") or [])


def _write_context(out: IO[bytes], containerfile: str, closure: Path) -> None:
    """A build context tar: the Containerfile and ``closure/`` (root-owned, modes kept)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = containerfile.encode()
        info = tarfile.TarInfo("Containerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        tar.add(closure, arcname="closure", recursive=True, filter=_root_owned)


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if not (info.isfile() or info.isdir()):
        return None  # sealed closures hold only files and directories
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info
