"""What a pack image is: its identity, tag, labels and the pin that binds them.

    identity = sha256(canonical JSON of {base image id, closure digest, builder version})

The identity names the image (tag ``localhost/acpw-pack:<identity hex>``) and is carried
in its labels with its three inputs. A pin (``PinnedImage``) adds the engine's image id:
the id is the sha256 of the image config, which covers the labels and every layer's
digest, so a matching id proves the bytes are the ones that were built or resolved.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

# Bump when the pack layer's recipe changes (Containerfile, labels, permissions):
# every identity changes with it, so old images are never reused by a new builder.
BUILDER_VERSION = "acpw-image-builder/1"

PACK_REPO = "localhost/acpw-pack"
BASE_REPO = "localhost/acpw-base"

LABEL_IDENTITY = "acpw.image.identity"
LABEL_BASE = "acpw.image.base"
LABEL_CLOSURE = "acpw.image.closure"
LABEL_BUILDER = "acpw.image.builder"
LABEL_PACK = "acpw.pack.name"
LABEL_PACK_VERSION = "acpw.pack.version"
LABEL_BASE_RECIPE = "acpw.base.recipe"


@dataclass(frozen=True, slots=True)
class ImageIdentity:
    """The three inputs of a pack image and the digest over them."""

    base_id: str
    closure_digest: str
    builder: str = BUILDER_VERSION

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` over the canonical JSON of the inputs."""
        canonical = json.dumps(
            {"base": self.base_id, "builder": self.builder, "closure": self.closure_digest},
            sort_keys=True,
            separators=(",", ":"),
        )
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def tag(self) -> str:
        return f"{PACK_REPO}:{self.digest.removeprefix('sha256:')}"

    def labels(self) -> dict[str, str]:
        """The labels a pack image built for this identity carries."""
        return {
            LABEL_IDENTITY: self.digest,
            LABEL_BASE: self.base_id,
            LABEL_CLOSURE: self.closure_digest,
            LABEL_BUILDER: self.builder,
        }

    def mismatches(self, labels: Mapping[str, str] | None) -> dict[str, tuple[str, str | None]]:
        """Label name → (expected, actual) for every identity label that differs."""
        have = labels or {}
        return {k: (v, have.get(k)) for k, v in self.labels().items() if have.get(k) != v}


@dataclass(frozen=True, slots=True)
class PushedImage:
    """Where a pack image was pushed: ``<registry>/acpw-pack:<identity hex>``, and the
    manifest digest the registry stores it under (what a pull by digest asks for)."""

    repository: str
    tag: str
    digest: str

    @property
    def reference(self) -> str:
        """``<repository>@<manifest digest>``: what a worker elsewhere pulls."""
        return f"{self.repository}@{self.digest}"

    def to_json(self) -> dict[str, str]:
        return {
            "repository": self.repository,
            "tag": self.tag,
            "digest": self.digest,
            "reference": self.reference,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> PushedImage:
        return cls(data["repository"], data["tag"], data["digest"])


@dataclass(frozen=True, slots=True)
class PinnedImage:
    """An identity bound to one engine image id (and, once pushed, to its registry copy)."""

    identity: ImageIdentity
    image_id: str
    pushed: PushedImage | None = None

    @property
    def reference(self) -> str:
        """The digest-pinned reference ``<tag>@<image id>`` that ``image build`` prints."""
        return f"{self.identity.tag}@{self.image_id}"

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "reference": self.reference,
            "tag": self.identity.tag,
            "image_id": self.image_id,
            "identity": self.identity.digest,
            "base_id": self.identity.base_id,
            "closure_digest": self.identity.closure_digest,
            "builder": self.identity.builder,
        }
        if self.pushed is not None:
            data["pushed"] = self.pushed.to_json()
        return data
