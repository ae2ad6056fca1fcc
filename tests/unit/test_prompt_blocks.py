"""Image and resource-link prompt blocks: checked in the job spec (size, base64, the
bytes' own signature, workspace-only links), then against the agent's advertised
capabilities and the staged workspace before the prompt is sent."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from worker.acp.prompt import check_capabilities, check_links
from worker.errors import InvalidJobSpec, PromptRefused, Unsupported
from worker.jobs import prompt
from worker.jobs.spec import parse_job
from worker.sandbox.base import WORKSPACE
from worker.sandbox.hostfiles import HostWorkspaceFiles

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 24
GIF = b"GIF89a" + b"\x00" * 24
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _job(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "v": 1,
        "job_id": "job-1",
        "pack": {"name": "cursor-emulator"},
        "workspace": {"kind": "local", "path": "/tmp/ws"},
        "prompt": blocks,
    }


def _image(mime: str, raw: bytes) -> dict[str, Any]:
    return {"type": "image", "mimeType": mime, "data": _b64(raw)}


def _refused(blocks: list[dict[str, Any]]) -> str:
    with pytest.raises(InvalidJobSpec) as info:
        parse_job(json.dumps(_job(blocks)))
    return info.value.message


@pytest.mark.parametrize(
    ("mime", "raw"),
    [("image/png", PNG), ("image/jpeg", JPEG), ("image/gif", GIF), ("image/webp", WEBP)],
)
def test_an_allowed_image_is_sent_as_given(mime: str, raw: bytes) -> None:
    spec = parse_job(json.dumps(_job([{"type": "text", "text": "see"}, _image(mime, raw)])))
    assert spec.prompt_blocks()[1] == {"type": "image", "mimeType": mime, "data": _b64(raw)}


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (_image("image/png", JPEG), "signature does not match"),  # the bytes decide
        (_image("image/webp", b"RIFF\x10\x00\x00\x00WAVEfmt "), "signature does not match"),
        (_image("image/svg+xml", b"<svg/>"), "image type must be one of"),
        (_image("IMAGE/PNG", PNG), "image type must be one of"),
        ({"type": "image", "mimeType": "image/png", "data": "iVBO R w0K"}, "not base64"),
        ({"type": "image", "mimeType": "image/png", "data": "iVBORw0K\n"}, "not base64"),
        ({"type": "image", "mimeType": "image/png", "data": "iVBORw0"}, "not base64"),
        ({"type": "image", "mimeType": "image/png", "data": "ï" * 8}, "not base64"),
        ({"type": "image", "mimeType": "image/png", "data": ""}, "signature does not match"),
        ({"type": "image", "mimeType": "image/png"}, "data"),
        ({"type": "image", "mime_type": "image/png", "data": _b64(PNG)}, "mimeType"),
        ({**_image("image/png", PNG), "uri": "https://x"}, "uri"),
    ],
)
def test_a_bad_image_is_refused_naming_why(block: dict[str, Any], problem: str) -> None:
    assert problem in _refused([block])


def test_huge_base64_is_refused_before_it_is_decoded() -> None:
    size = prompt.MAX_IMAGE_BASE64 + 4
    message = _refused([{"type": "image", "mimeType": "image/png", "data": "A" * size}])
    assert f"at most {prompt.MAX_IMAGE_BASE64} characters" in message


def test_an_image_just_over_the_decoded_bound_is_refused() -> None:
    raw = PNG + b"\x00" * (prompt.MAX_IMAGE_BYTES + 1 - len(PNG))
    assert prompt.image_problem("image/png", _b64(raw)) == (
        f"image larger than {prompt.MAX_IMAGE_BYTES} bytes"
    )
    at_bound = PNG + b"\x00" * (prompt.MAX_IMAGE_BYTES - len(PNG))
    assert prompt.image_problem("image/png", _b64(at_bound)) is None


def test_the_whole_prompt_is_bounded() -> None:
    four_mib = PNG + b"\x00" * (4 * 1024 * 1024 - len(PNG))
    message = _refused([_image("image/png", four_mib), _image("image/png", four_mib)])
    assert f"at most {prompt.MAX_PROMPT_BYTES} bytes" in message
    too_many = [{"type": "text", "text": "x"}] * (prompt.MAX_BLOCKS + 1)
    assert f"at most {prompt.MAX_BLOCKS} blocks" in _refused(too_many)


@pytest.mark.parametrize(
    ("uri", "sent"),
    [
        ("src/main.py", "file:///workspace/src/main.py"),
        ("file:///workspace/src/main.py", "file:///workspace/src/main.py"),
        ("file:///workspace/my%20notes.md", "file:///workspace/my%20notes.md"),
        ("my notes.md", "file:///workspace/my%20notes.md"),
        ("dir/a:b.txt", "file:///workspace/dir/a%3Ab.txt"),
    ],
)
def test_a_workspace_link_is_sent_as_a_workspace_uri(uri: str, sent: str) -> None:
    spec = parse_job(json.dumps(_job([_link(uri, mimeType="text/x-python")])))
    assert spec.prompt_blocks() == [
        {"type": "resource_link", "uri": sent, "name": "f", "mimeType": "text/x-python"}
    ]


def _link(uri: str, **extra: Any) -> dict[str, Any]:
    return {"type": "resource_link", "uri": uri, "name": "f", **extra}


@pytest.mark.parametrize(
    "uri",
    [
        "../etc/passwd",
        "src/../../etc/passwd",
        "/etc/passwd",
        "/workspace/src/main.py",  # an absolute path: only the file URI form
        "file:///etc/passwd",
        "file:///workspace/../etc/passwd",
        "file:///workspace/%2E%2E/etc/passwd",
        "file:///workspace/a%2F..%2F..%2Fetc",
        "file:///workspace/a%00b",
        "file:///workspace/",
        "file:///workspace",
        "file://host/workspace/a",
        "file:///workspace/a?x=1",
        "file:///workspace/a#frag",
        "https://example.com/a",
        "workspace://a",
        "a:b.txt",  # a colon in the first component reads as a scheme
        "./a",
        "a//b",
        "a\nb",
        "",
    ],
)
def test_a_link_outside_the_workspace_is_refused(uri: str) -> None:
    assert "prompt" in _refused([_link(uri)])


def test_the_agent_root_is_the_sandbox_workspace() -> None:
    assert prompt.AGENT_ROOT == WORKSPACE


INIT_CURSOR = {"agentCapabilities": {"promptCapabilities": {"image": True, "audio": False}}}


def test_an_image_needs_the_image_capability() -> None:
    blocks = [{"type": "text", "text": "x"}, {"type": "image", "mimeType": "image/png"}]
    check_capabilities(INIT_CURSOR, blocks)
    for init in (
        {"agentCapabilities": {"promptCapabilities": {"image": False}}},
        {"agentCapabilities": {"promptCapabilities": {"image": "yes"}}},
        {"agentCapabilities": {}},
        {"agentCapabilities": []},
        {},
    ):
        with pytest.raises(Unsupported) as info:
            check_capabilities(init, blocks)
        assert info.value.details == {"capability": "promptCapabilities.image", "block": 1}


def test_text_and_links_need_no_capability() -> None:
    check_capabilities({}, [{"type": "text", "text": "x"}, _link("a")])


def test_links_are_checked_against_the_staged_workspace(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print(1)\n")
    (tmp_path / "inside-link").symlink_to(tmp_path / "src" / "main.py")
    (tmp_path / "escape").symlink_to("/etc")
    check = HostWorkspaceFiles(tmp_path).artifact
    check_links([_link("file:///workspace/src/main.py")], check)
    for path, reason in [
        ("escape/passwd", "symlink"),
        ("inside-link", "symlink"),  # any link: the agent would resolve it elsewhere
        ("missing.txt", "missing"),
        ("src", "not_regular_file"),
    ]:
        with pytest.raises(PromptRefused) as info:
            check_links([{"type": "text", "text": "x"}, _link(f"file:///workspace/{path}")], check)
        assert info.value.details == {"block": 1, "path": path, "reason": reason}
    assert os.path.exists(tmp_path / "escape" / "passwd")  # the link did lead out
