"""``acp-worker image base|build|resolve``: the sandbox base image and pack images.

``image build PACK`` verifies the pack's closure (materializing it into the cache when
needed), builds the base image if the engine lacks it, then reuses or builds the pack
image and prints its digest-pinned reference ``<tag>@<image id>``; with a registry
configured (``ACPW_IMAGE_REGISTRY``) it also pushes it there (``--json`` adds
``pushed``: repository, tag, manifest digest). ``image resolve PACK`` never builds: it
reuses the engine's image, or pulls it from the configured registry (by the manifest
digest recorded at push when there is one); no image anywhere is a refusal (exit 3).
"""

from __future__ import annotations

import argparse
import json
import sys

from worker.cli import add_json_flag
from worker.cli.packs import resolve_pack
from worker.errors import ImageMismatch
from worker.images.build import PackImages
from worker.images.engine import connect
from worker.images.identity import LABEL_PACK, LABEL_PACK_VERSION, PinnedImage
from worker.packs.names import PLATFORMS
from worker.packs.runtime import prepare_pack
from worker.sandbox import DockerConfig
from worker.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``image base|build|resolve`` to the ``acp-worker`` parser."""
    image = sub.add_parser("image", help="build or resolve digest-pinned sandbox images")
    add_json_flag(image)
    actions = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    base = actions.add_parser("base", help="build the sandbox base image (once, ~70 s)")
    add_json_flag(base)
    base.set_defaults(handler=base_command)
    for name, handler, text in (
        ("build", build_command, "reuse or build the pack image; print its reference"),
        ("resolve", resolve_command, "reuse the pack image; refuse when none matches"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("pack", metavar="PACK", help="pack name or folder")
        action.add_argument("--platform", choices=PLATFORMS, help="default: this host's")
        add_json_flag(action)
        action.set_defaults(handler=handler)


def _progress(line: str) -> None:
    print(f"image: {line}", file=sys.stderr, flush=True)


def _images(settings: Settings, *, quiet: bool = False) -> PackImages:
    config = DockerConfig.from_settings(settings).engine()
    progress = (lambda _line: None) if quiet else _progress
    return PackImages(connect(config), config, progress=progress)


def _emit(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    print(json.dumps(data) if getattr(args, "json", False) else text)


def base_command(args: argparse.Namespace, settings: Settings) -> int:
    """``image base``: build the base image if the engine lacks it; print its id."""
    images = _images(settings)
    base_id = images.base_id(build=True)
    _emit(args, {"tag": images.recipe.tag, "image_id": base_id}, f"{images.recipe.tag}@{base_id}")
    return 0


def build_command(args: argparse.Namespace, settings: Settings) -> int:
    """``image build PACK``: verify the closure, reuse or build, print the reference."""
    pack = resolve_pack(args.pack, settings)
    prepared = prepare_pack(settings, pack, args.platform)
    images = _images(settings)
    identity = images.identity(prepared.target.pin.closure.digest, build_base=True)
    labels = {LABEL_PACK: pack.name, LABEL_PACK_VERSION: pack.manifest.version}
    pin = images.build(prepared.closure, identity, pack_labels=labels)
    _print_pin(args, pin)
    return 0


def resolve_command(args: argparse.Namespace, settings: Settings) -> int:
    """``image resolve PACK``: the existing image for the pack's identity, or exit 3."""
    pack = resolve_pack(args.pack, settings)
    target = pack.for_platform(args.platform)
    images = _images(settings, quiet=True)
    identity = images.identity(target.pin.closure.digest)
    pin = images.resolve(identity)
    if pin is None:
        raise ImageMismatch(
            f"no image for pack {pack.name!r} on this engine: run `acp-worker image build`",
            pack=pack.name,
            identity=identity.digest,
            reason="missing",
        )
    _print_pin(args, pin)
    return 0


def _print_pin(args: argparse.Namespace, pin: PinnedImage) -> None:
    _emit(args, pin.to_json(), pin.reference)
