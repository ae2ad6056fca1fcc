"""``named_paths``: what a notification names that the normalizer checks as an artifact
(looked up first on a backend whose check answers from lookups)."""

from __future__ import annotations

from worker.events.artifacts import named_paths


def _tool(*blocks: object, kind: str = "tool_call") -> dict[str, object]:
    return {"sessionId": "s", "update": {"sessionUpdate": kind, "content": list(blocks)}}


def _link(uri: object) -> dict[str, object]:
    return {"type": "content", "content": {"type": "resource_link", "uri": uri, "name": "x"}}


def test_a_tools_resource_links_are_named_with_file_uris_made_paths() -> None:
    params = _tool(
        _link("file:///workspace/a.png"),
        _link("b/c.txt"),
        {"type": "content", "content": {"type": "text", "text": "file:///workspace/no"}},
        _link(7),
        _link(""),
        kind="tool_call_update",
    )
    assert named_paths("session/update", params) == ["/workspace/a.png", "b/c.txt"]


def test_generate_image_names_its_file_and_references() -> None:
    params = {"filePath": "/workspace/i.png", "referenceImagePaths": ["r.png", None, ""]}
    assert named_paths("cursor/generate_image", params) == ["/workspace/i.png", "r.png"]
    assert named_paths("cursor/generate_image", {"referenceImagePaths": "r.png"}) == []


def test_anything_else_names_nothing() -> None:
    assert named_paths("session/update", {"update": {"sessionUpdate": "plan"}}) == []
    assert named_paths("session/update", ["not", "an", "object"]) == []
    assert named_paths("cursor/update_todos", {"filePath": "/workspace/i.png"}) == []
    assert named_paths("session/update", _tool({"content": "not an object"})) == []
