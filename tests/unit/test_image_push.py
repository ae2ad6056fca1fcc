"""What the engine's push stream says, read without an engine: the manifest digest."""

from __future__ import annotations

import pytest

from worker.errors import SandboxError
from worker.images.build import push_chunk
from worker.images.identity import ImageIdentity, PinnedImage, PushedImage

DIGEST = "sha256:" + "8e" * 32


def test_docker_reports_the_digest_in_aux() -> None:
    seen: list[str] = []
    chunk = {"progressDetail": {}, "aux": {"Tag": "t", "Digest": DIGEST, "Size": 425}}
    assert push_chunk(chunk, seen.append) == DIGEST
    assert seen == []


def test_the_final_status_line_carries_it_on_podman_and_docker() -> None:
    seen: list[str] = []
    assert push_chunk({"status": f"t1: digest: {DIGEST} size: 425"}, seen.append) == DIGEST
    assert push_chunk({"status": "Pushing", "id": "ad864d00f0ba"}, seen.append) is None
    assert seen == [f"t1: digest: {DIGEST} size: 425", "Pushing"]


def test_an_error_chunk_is_a_sandbox_error() -> None:
    chunk = {"error": "denied: requested access to the resource is denied", "errorDetail": {}}
    with pytest.raises(SandboxError, match="push failed: denied"):
        push_chunk(chunk, lambda _line: None)


def test_a_pin_reports_where_it_was_pushed() -> None:
    identity = ImageIdentity("sha256:" + "b" * 64, "sha256:" + "c" * 64)
    pushed = PushedImage("registry.example:5000/acpw-pack", identity.digest[7:], DIGEST)
    data = PinnedImage(identity, "sha256:" + "d" * 64, pushed).to_json()
    assert data["pushed"]["reference"] == f"registry.example:5000/acpw-pack@{DIGEST}"
    assert PushedImage.from_json(data["pushed"]) == pushed
    assert "pushed" not in PinnedImage(identity, "sha256:" + "d" * 64).to_json()
