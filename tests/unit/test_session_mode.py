"""The job's ``mode`` is checked against the modes the agent offered before
``session/set_mode`` is sent (``worker.acp.session.check_mode``)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.acp.session import check_mode, offered_modes
from worker.errors import ModelUnavailable, ModeUnavailable

# claude-agent-acp's and codex-acp 2.6.0's offers (ids as in their code; fewer of claude's).
_CLAUDE = {
    "modes": {
        "currentModeId": "default",
        "availableModes": [
            {"id": "default", "name": "Default"},
            {"id": "acceptEdits", "name": "Accept Edits"},
            {"id": "plan", "name": "Plan Mode"},
        ],
    }
}
_CODEX = {
    "modes": {
        "currentModeId": "workspace-write",
        "availableModes": [
            {"id": "read-only", "name": "Read-only"},
            {"id": "workspace-write", "name": "Workspace access"},
            {"id": "agent", "name": "Auto review"},
            {"id": "agent-full-access", "name": "Full access"},
        ],
    }
}


@pytest.mark.parametrize(("session", "mode"), [(_CLAUDE, "acceptEdits"), (_CODEX, "read-only")])
def test_an_offered_mode_passes(session: dict[str, Any], mode: str) -> None:
    check_mode(session, mode)


def test_an_unknown_mode_names_the_offered_ids() -> None:
    with pytest.raises(ModeUnavailable) as info:
        check_mode(_CLAUDE, "yolo")
    error = info.value
    assert isinstance(error, ModelUnavailable)
    assert error.code == "model_unavailable"
    assert error.exit_code == 3
    assert error.details == {"mode": "yolo", "available": ["default", "acceptEdits", "plan"]}
    assert "default, acceptEdits, plan" in error.message


@pytest.mark.parametrize(
    "session",
    [{}, {"modes": None}, {"modes": {"availableModes": "x"}}, {"modes": {"availableModes": [1]}}],
)
def test_no_offer_refuses_every_mode(session: dict[str, Any]) -> None:
    assert offered_modes(session) == []
    with pytest.raises(ModeUnavailable, match="it offers: none"):
        check_mode(session, "plan")


def test_the_offer_shown_is_bounded() -> None:
    many = {"modes": {"availableModes": [{"id": f"{i}" + "m" * 200} for i in range(80)]}}
    with pytest.raises(ModeUnavailable) as info:
        check_mode(many, "plan")
    shown = info.value.details["available"]
    assert len(shown) == 50
    assert all(len(m) == 100 for m in shown)


def test_codex_packs_mode_and_exit_reach_its_launch_plan() -> None:
    """codex-acp's pack sets `agent-full-access` (its own sandbox cannot run in ours) and
    says it does not exit promptly on EOF; both reach the launch plan the session and the
    teardown read. (A job's own mode going first, ``spec.mode or wiring.default_mode``,
    is shown through the worker: ``test_full_turns.py`` runs codex in `workspace-write`.)"""
    from pathlib import Path

    from worker.packs.manifest import load_pack
    from worker.packs.runtime import PreparedPack
    from worker.packs.verify import VerifyStats

    codex = load_pack(Path(__file__).resolve().parents[2] / "provider_packs", "codex-acp")
    prepared = PreparedPack(
        pack=codex,
        target=codex.for_platform("linux-x64"),
        closure=Path("/nonexistent"),
        stats=VerifyStats(files=0, bytes=0, seconds=0.0),
    )
    plan = prepared.launch_plan({})
    assert plan.default_mode == "agent-full-access"
    assert plan.exits_on_eof is False  # codex takes 2 s to exit on EOF: signalled at once
    assert plan.env["CODEX_HOME"].endswith("/.codex")
