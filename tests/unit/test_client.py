"""The Celery contract and the client's pure parts (no Redis, no broker)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from worker.client import JobState, StreamEvent
from worker.client.queue import (
    MAX_JOB_TIMEOUT_S,
    RUN_TASK,
    celery_config,
    time_limits,
    visibility_timeout,
)
from worker.errors import EventsTrimmed
from worker.jobs.spec import Limits
from worker.service_cli import EXIT_BY_STATUS, _render, serve_argv
from worker.settings import Settings


@pytest.fixture
def settings() -> Settings:
    return Settings(redis_url="redis://127.0.0.1:6379/0")


def test_max_timeout_is_the_job_spec_ceiling() -> None:
    ceiling = [m.le for m in Limits.model_fields["timeout_s"].metadata if hasattr(m, "le")]
    assert ceiling == [MAX_JOB_TIMEOUT_S]


def test_time_limits_leave_room_for_cancel_and_teardown(settings: Settings) -> None:
    soft, hard = time_limits(60, settings)
    assert 60 + settings.cancel_grace < soft < hard


def test_visibility_timeout_outlives_the_longest_job(settings: Settings) -> None:
    assert visibility_timeout(settings) > time_limits(MAX_JOB_TIMEOUT_S, settings)[1]


def test_celery_settings_for_long_jobs(settings: Settings) -> None:
    conf = celery_config(settings)
    assert conf["task_acks_late"]
    assert conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_routes"][RUN_TASK] == {"queue": "runs"}
    assert conf["broker_url"] == settings.redis_url  # the broker defaults to the event Redis
    assert conf["beat_schedule"]["reap"]["schedule"] == settings.reaper_interval


def test_job_state_never_shows_the_fencing_token_or_the_spec() -> None:
    state = JobState("j", 2, "running", {"token": "7", "fence": "7", "job": "{}", "worker": "w"})
    assert state.to_dict() == {"worker": "w", "job_id": "j", "attempt": 2, "status": "running"}
    assert not state.settled


def test_exit_codes_follow_the_run_contract() -> None:
    assert EXIT_BY_STATUS == {
        "succeeded": 0,
        "failed": 1,
        "lost": 1,
        "cancelled": 4,
        "timed_out": 5,
    }


def test_serve_passes_concurrency_and_beat_through(settings: Settings) -> None:
    args = argparse.Namespace(concurrency=3, beat=True, loglevel="INFO")
    argv = serve_argv(args, settings)
    assert argv[argv.index("--concurrency") + 1] == "3"
    assert argv[argv.index("-Q") + 1] == "runs"
    assert "--beat" in argv


async def test_an_error_while_rendering_ends_the_streamed_line_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def items() -> Iterator[StreamEvent]:
        event = {"type": "message.delta", "data": {"role": "assistant", "text": "half a"}}
        yield StreamEvent("1-0", event, "{}")
        raise EventsTrimmed("trimmed", job_id="j")

    with pytest.raises(EventsTrimmed):
        await _render(items(), as_json=False)
    assert capsys.readouterr().err == "  agent: half a\n"  # main's error line starts afresh
