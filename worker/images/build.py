"""Pack images: resolve (reuse) by identity, build when missing, check before start.

    resolve(closure)  tag ``localhost/acpw-pack:<identity>`` exists, its labels match the
                      identity, its layers are the base's plus one, and its id equals
                      the pin recorded when it was first built or resolved → reuse
    build(closure)    resolve, else build ``images/pack.Containerfile`` FROM the base id
                      with the closure as the one extra layer; record the pin
    check(pin)        before every container start: the image with the pinned id still
                      exists and carries the identity's labels

Anything that contradicts a pin raises :class:`~worker.errors.ImageMismatch`. Pins are
JSON files ``<images_dir>/pins/<identity hex>.json``, written atomically.
"""

from __future__ import annotations

import io
import json
import os
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
    ImageIdentity,
    PinnedImage,
)

if TYPE_CHECKING:
    import docker


def _quiet(_: str) -> None:
    return None


class PinStore:
    """Identity → image id, one small JSON file per identity."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, identity: ImageIdentity) -> Path:
        return self.root / f"{identity.digest.removeprefix('sha256:')}.json"

    def read(self, identity: ImageIdentity) -> str | None:
        try:
            data = json.loads(self._path(identity).read_text())
        except FileNotFoundError:
            return None
        return str(data["image_id"])

    def write(self, pin: PinnedImage) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(pin.identity)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(pin.to_json(), sort_keys=True))
        tmp.replace(path)

    def forget(self, identity: ImageIdentity) -> None:
        self._path(identity).unlink(missing_ok=True)


class PackImages:
    """Resolve, build and check pack images on one engine."""

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
        """The existing image for ``identity``, pinned; None when the engine has none.

        Raises:
            ImageMismatch: an image is tagged with the identity but is not it.
        """
        attrs = self._inspect(identity.tag)
        if attrs is None:
            return None
        pin = PinnedImage(identity, str(attrs["Id"]))
        self._check_attrs(pin, attrs)
        recorded = self.pins.read(identity)
        if recorded is not None and recorded != pin.image_id:
            raise ImageMismatch(
                f"{identity.tag} is image {pin.image_id}, but {recorded} was pinned for it",
                tag=identity.tag,
                expected=recorded,
                actual=pin.image_id,
            )
        self._check_layers(pin, attrs)
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
        """Reuse the image for ``identity`` or build it from the verified ``closure``.

        Raises:
            ImageMismatch: an existing image contradicts the identity.
            SandboxError: the build failed.
        """
        found = self.resolve(identity)
        if found is not None:
            return found
        labels = {**(pack_labels or {}), **identity.labels()}
        self.progress(f"building {identity.tag}")
        with tempfile.TemporaryFile() as context:
            _write_context(context, self._containerfile(), closure)
            context.seek(0)
            image_id = self._build(context, identity, labels)
        pin = PinnedImage(identity, image_id)
        self.check(pin)
        self.pins.write(pin)
        self._push(pin)
        return pin

    def check(self, pin: PinnedImage) -> None:
        """The pinned image still exists with its id and the identity's labels.

        Raises:
            ImageMismatch: it is gone or its labels differ.
        """
        attrs = self._inspect(pin.image_id)
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
        self._check_attrs(pin, attrs)

    # --- internals ----------------------------------------------------------------------

    def _inspect(self, ref: str) -> dict[str, Any] | None:
        import docker.errors

        with translate("inspect image", image=ref):
            try:
                attrs: dict[str, Any] = low_level_api(self.client).inspect_image(ref)
            except docker.errors.ImageNotFound:
                return None
        return attrs

    @staticmethod
    def _check_attrs(pin: PinnedImage, attrs: Mapping[str, Any]) -> None:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        wrong = pin.identity.mismatches(labels)
        if wrong:
            raise ImageMismatch(
                f"image {attrs.get('Id')} does not carry the labels of {pin.identity.digest}",
                image_id=str(attrs.get("Id")),
                labels={k: {"expected": e, "actual": a} for k, (e, a) in wrong.items()},
            )

    def _check_layers(self, pin: PinnedImage, attrs: Mapping[str, Any]) -> None:
        # A pack image is its base plus exactly one layer: an image derived from it
        # (same inherited labels, re-tagged) has more and is refused.
        base = self._inspect(pin.identity.base_id)
        layers = _layers(attrs)
        base_layers = _layers(base) if base is not None else None
        if base_layers is None or layers[:-1] != base_layers or len(layers) != len(base_layers) + 1:
            raise ImageMismatch(
                f"{pin.identity.tag} is not its base image plus one pack layer",
                image_id=pin.image_id,
                layers=len(layers),
                base_layers=None if base_layers is None else len(base_layers),
            )

    def _containerfile(self) -> str:
        path = self.images_src / "pack.Containerfile"
        try:
            return path.read_text()
        except OSError as exc:
            raise SandboxError(f"cannot read {path}: {exc.strerror}", path=str(path)) from exc

    def _build(self, context: IO[bytes], identity: ImageIdentity, labels: dict[str, str]) -> str:
        image_id: str | None = None

        with translate("build pack image", tag=identity.tag):
            for chunk in self.client.api.build(
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
                image_id = build_chunk(chunk, self.progress) or image_id
        if image_id is None:
            raise SandboxError("the engine's build reported no image id", tag=identity.tag)
        return image_id

    def _push(self, pin: PinnedImage) -> None:
        registry = self.config.registry
        if not registry:
            return
        repo = f"{registry.rstrip('/')}/acpw-pack"
        tag = pin.identity.digest.removeprefix("sha256:")
        with translate("push pack image", registry=registry):
            self.client.api.tag(pin.image_id, repo, tag)
            for chunk in self.client.api.push(repo, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    raise SandboxError(f"push failed: {chunk['error']}", registry=registry)
                self.progress(str(chunk.get("status", "")))


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
