"""The pure pieces of draining: which ``job.completed`` hands a job back, the switch a
pool process trips from its signal handler, and the default grace's sizing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.errors import HandedBack, LeaseLost
from worker.events import notices
from worker.events.completed import job_completed
from worker.service.drain import HandBack
from worker.settings import Settings
from worker.store.fenced import HANDED_BACK, terminal_marker


def _completed(status: Any, error: Any = None) -> dict[str, Any]:
    data = job_completed(status=status, error=error, duration_ms=0.0).model_dump(mode="json")
    return {"type": "job.completed", "seq": 9, "data": data}


@pytest.mark.parametrize(
    ("event", "marker"),
    [
        (_completed("cancelled", HandedBack("drained", next_attempt=2)), HANDED_BACK),
        (_completed("cancelled"), "cancelled"),
        (_completed("failed", LeaseLost("gone")), "failed"),
        (_completed("succeeded"), "succeeded"),
        ({"type": "notice", "seq": 3, "data": {"status": "cancelled"}}, ""),
    ],
)  # fmt: skip
def test_only_a_cancelled_completion_carrying_handed_back_hands_back(
    event: dict[str, Any], marker: str
) -> None:
    assert terminal_marker(event) == marker


def test_the_handed_back_notice_names_the_next_attempt() -> None:
    notice = notices.handed_back(3, "w-1", 10.0)
    assert (notice.level, notice.code) == ("warning", "handed_back")
    assert notice.details == {"next_attempt": 4, "worker_id": "w-1", "drain_grace_s": 10.0}


def test_handed_back_is_a_cancel_of_the_attempt_not_a_failure() -> None:
    error = HandedBack("drained", next_attempt=2)
    assert (error.code, error.exit_code) == ("handed_back", 4)
    assert error.to_dict()["details"] == {"next_attempt": 2}


async def test_a_switch_tripped_before_or_during_a_job_sets_its_cancel() -> None:
    switch = HandBack()
    during, before, after = asyncio.Event(), asyncio.Event(), asyncio.Event()
    with switch.watching(during):
        assert not during.is_set()
        switch.trip()
        await asyncio.wait_for(during.wait(), 5)  # set on the job's loop, not in the handler
    with switch.watching(before):
        assert before.is_set()  # tripped for good: a job started later is handed back too
    switch.trip()
    assert not after.is_set()  # nothing watched outside a block


def test_the_drain_grace_default_leaves_room_for_the_hand_back_in_30_s() -> None:
    """Kubernetes' default terminationGracePeriodSeconds is 30: the default grace plus the
    longest a hand-back waits on the agent (cancel, then EOF and SIGTERM) fits in it."""
    s = Settings()
    hand_back = s.cancel_grace + s.shutdown_eof_grace + s.shutdown_term_grace
    assert s.drain_grace_s + hand_back <= 30 - 5
