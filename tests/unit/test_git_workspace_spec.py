"""The git workspace's job-spec contract: LFS and an unbound credential are refused
before anything starts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.errors import InvalidJobSpec
from worker.jobs.spec import GitWorkspace, parse_job


def _job(workspace: dict[str, Any]) -> str:
    return json.dumps(
        {
            "v": 1,
            "job_id": "job-1",
            "pack": {"name": "cursor-emulator"},
            "workspace": {"kind": "git", "url": "https://example.com/r.git", **workspace},
            "prompt": "hello",
        }
    )


def test_lfs_is_refused_as_unsupported() -> None:
    with pytest.raises(InvalidJobSpec, match="LFS fetch is not supported") as info:
        parse_job(_job({"lfs": True}))
    assert info.value.details["fields"] == ["workspace.git.lfs"]
    assert info.value.exit_code == 2


@pytest.mark.parametrize("workspace", [{}, {"lfs": False}])
def test_without_lfs_is_accepted(workspace: dict[str, Any]) -> None:
    spec = parse_job(_job(workspace))
    assert isinstance(spec.workspace, GitWorkspace)
    assert spec.workspace.lfs is False


def test_a_workspace_credential_must_be_bound() -> None:
    job = json.loads(_job({"credential": "GIT_TOKEN"}))
    with pytest.raises(InvalidJobSpec, match="GIT_TOKEN") as info:
        parse_job(job)
    assert "does not bind" in info.value.message
    job["credentials"] = {"GIT_TOKEN": "env:TOKEN"}
    assert parse_job(job).credentials == {"GIT_TOKEN": "env:TOKEN"}
