"""The blocks a job's prompt may hold besides text: images and links to workspace files.

Checked here, syntactically, when the job is validated; what needs the agent or the
staged workspace is checked again before the prompt is sent (``worker.job.turn``):

- ``image``: base64 (standard alphabet, padded, nothing else), at most
  :data:`MAX_IMAGE_BYTES` decoded, of an allowed type (:data:`IMAGE_TYPES`) that the
  decoded bytes' own signature confirms (a declared ``image/png`` whose bytes are a JPEG
  is refused, whatever the extension or the claim). Sent only to an agent whose
  ``initialize`` advertised ``promptCapabilities.image``.
- ``resource_link``: a file of the job's workspace, as a canonical relative path or a
  ``file:///workspace/…`` URI (percent-encoded); anything else (another scheme, an
  absolute path elsewhere, a ``..`` component, a control character) is refused. Sent
  as ``file:///workspace/<path>`` once the staged file is found to be a regular file
  reached through no link. ACP's baseline: every agent accepts links, no capability.

A whole prompt is bounded too (:data:`MAX_PROMPT_BYTES`, :data:`MAX_BLOCKS`): the job
spec travels through Redis and the broker, and the prompt goes to the agent as one line.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Literal
from urllib.parse import quote, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.safetree.names import path_problem

MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: Base64 of :data:`MAX_IMAGE_BYTES`: a longer string is refused before it is decoded.
MAX_IMAGE_BASE64 = 4 * -(-MAX_IMAGE_BYTES // 3)
MAX_PROMPT_BYTES = 8 * 1024 * 1024
MAX_BLOCKS = 64
#: The workspace as the agent sees it (``worker.sandbox.base.WORKSPACE``, which this
#: lower layer cannot import; a unit test holds them equal).
AGENT_ROOT = "/workspace"
_FILE_PREFIX = "file://" + AGENT_ROOT + "/"

#: Allowed image types and the signatures their bytes must start with.
IMAGE_TYPES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and b"WEBP" at offset 8, checked below
}


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=False)


class ImageBlock(_Block):
    """An image the agent is shown (ACP ``ImageContent``)."""

    type: Literal["image"]
    mime_type: str = Field(alias="mimeType", description="image/png, jpeg, gif or webp.")
    data: str = Field(
        max_length=MAX_IMAGE_BASE64, description="Base64 of at most 5 MiB, padded, no spaces."
    )

    @field_validator("mime_type")
    @classmethod
    def _allowed_type(cls, value: str) -> str:
        if value not in IMAGE_TYPES:
            raise ValueError(f"image type must be one of {', '.join(IMAGE_TYPES)}")
        return value

    @model_validator(mode="after")
    def _bytes_match_type(self) -> ImageBlock:
        problem = image_problem(self.mime_type, self.data)
        if problem is not None:
            raise ValueError(problem)
        return self

    def wire(self) -> dict[str, object]:
        return {"type": "image", "mimeType": self.mime_type, "data": self.data}


class ResourceLinkBlock(_Block):
    """A file of the workspace the agent is pointed at (ACP ``ResourceLink``)."""

    type: Literal["resource_link"]
    uri: str = Field(
        max_length=4096,
        description="A relative workspace path or file:///workspace/<path> (percent-encoded).",
    )
    name: str = Field(min_length=1, max_length=1024)
    mime_type: str | None = Field(default=None, alias="mimeType", max_length=255)
    title: str | None = Field(default=None, max_length=1024)
    description: str | None = Field(default=None, max_length=4096)

    @field_validator("uri")
    @classmethod
    def _inside_workspace(cls, value: str) -> str:
        workspace_path(value)  # raises ValueError naming the problem
        return value

    @property
    def path(self) -> str:
        """The canonical workspace-relative path the link names."""
        return workspace_path(self.uri)

    def wire(self) -> dict[str, object]:
        optional = {
            "mimeType": self.mime_type,
            "title": self.title,
            "description": self.description,
        }
        return {
            "type": "resource_link",
            "uri": _FILE_PREFIX + quote(self.path),
            "name": self.name,
            **{key: value for key, value in optional.items() if value is not None},
        }


def workspace_path(uri: str) -> str:
    """The canonical relative path of a link to a workspace file.

    Raises:
        ValueError: another scheme, a host, a query or fragment, a path outside
            ``/workspace``, or a path that is not canonical (``..``, ``.``, empty or
            control-character components).
    """
    if uri.startswith("file:"):
        parts = urlsplit(uri)
        if parts.netloc or parts.query or parts.fragment or "?" in uri or "#" in uri:
            raise ValueError("a file URI must be file:///workspace/<path>, nothing else")
        if not parts.path.startswith(AGENT_ROOT + "/"):
            raise ValueError("a file URI must name a file under /workspace")
        relative = unquote(parts.path[len(AGENT_ROOT) + 1 :], errors="strict")
    elif ":" in uri.split("/", 1)[0]:
        raise ValueError("only workspace files may be linked (a relative path or file://)")
    else:
        relative = uri
    problem = path_problem(relative)
    if problem is not None:
        raise ValueError(f"not a workspace file path: {problem}")
    return relative


def image_problem(mime_type: str, data: str) -> str | None:
    """Why ``data`` is not a base64 image of ``mime_type`` (size, encoding, signature)."""
    if len(data) > MAX_IMAGE_BASE64:
        return f"image larger than {MAX_IMAGE_BYTES} bytes"
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return "image data is not base64 (standard alphabet, padded, no spaces)"
    if len(raw) > MAX_IMAGE_BYTES:
        return f"image larger than {MAX_IMAGE_BYTES} bytes"
    if not _signature_matches(mime_type, raw):
        return f"image bytes are not {mime_type} (their signature does not match)"
    return None


def _signature_matches(mime_type: str, raw: bytes) -> bool:
    if not raw.startswith(IMAGE_TYPES.get(mime_type, ())):
        return False
    return mime_type != "image/webp" or raw[8:12] == b"WEBP"


def prompt_size(blocks: Sequence[object]) -> int:
    """What a list of prompt blocks weighs: the UTF-8 bytes of their text and data."""
    total = 0
    for block in blocks:
        for value in (getattr(block, "text", None), getattr(block, "data", None)):
            if isinstance(value, str):
                total += len(value.encode("utf-8", "replace"))
    return total


def check_prompt(blocks: Sequence[object]) -> None:
    """The whole prompt's bounds.

    Raises:
        ValueError: more than :data:`MAX_BLOCKS` blocks, or over :data:`MAX_PROMPT_BYTES`.
    """
    if len(blocks) > MAX_BLOCKS:
        raise ValueError(f"a prompt holds at most {MAX_BLOCKS} blocks")
    if prompt_size(blocks) > MAX_PROMPT_BYTES:
        raise ValueError(f"a prompt weighs at most {MAX_PROMPT_BYTES} bytes (text and data)")
