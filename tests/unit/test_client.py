"""The Celery contract and the client's pure parts (no Redis, no broker)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from worker.cli import _build_parser, main
from worker.cli.service import EXIT_BY_STATUS, _pause, _render, reaper_argv, serve_argv
from worker.client import JobState, StreamEvent
from worker.client.client import _completes, spec_digest
from worker.client.queue import (
    HARD_MARGIN_S,
    MAX_JOB_TIMEOUT_S,
    RUN_TASK,
    celery_config,
    fill_time_limits,
    time_limits,
    visibility_timeout,
)
from worker.errors import EventsTrimmed
from worker.jobs.spec import Limits, parse_job
from worker.settings import Settings
from worker.store.url import DEFAULT_REDIS_URL, RedisChoice, choose_redis

JOB = {
    "v": 1,
    "job_id": "j",
    "pack": {"name": "cursor-emulator"},
    "workspace": {"kind": "local", "path": "/tmp"},
    "prompt": "p",
    "limits": {"timeout_s": 60},
}


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


def test_with_nothing_configured_the_broker_is_the_commands_default_redis() -> None:
    nothing = Settings(redis_url=None, broker_url=None)
    assert celery_config(nothing)["broker_url"] == DEFAULT_REDIS_URL
    given = Settings(redis_url=None, broker_url="redis://elsewhere:6379/3")
    assert celery_config(given)["broker_url"] == "redis://elsewhere:6379/3"


def test_the_default_redis_is_taken_only_when_nothing_names_one() -> None:
    assert choose_redis(None, "redis://h:1/2") == RedisChoice("redis://h:1/2", defaulted=False)
    assert choose_redis("redis://flag:1/0", "redis://h:1/2").url == "redis://flag:1/0"
    chosen = choose_redis(None, "")
    assert chosen == RedisChoice(DEFAULT_REDIS_URL, defaulted=True)
    assert chosen.notice is not None
    assert DEFAULT_REDIS_URL in chosen.notice
    assert choose_redis("redis://flag:1/0").notice is None


def test_job_state_never_shows_the_fencing_token_or_the_spec() -> None:
    fields = {"token": "7", "fence": "7", "job": "{}", "worker": "w", "attempt_after": "1-0"}
    state = JobState("j", 2, "running", fields)
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


def test_serve_passes_concurrency_through_and_runs_no_beat(settings: Settings) -> None:
    args = argparse.Namespace(concurrency=3, loglevel="INFO")
    argv = serve_argv(args, settings)
    assert argv[argv.index("--concurrency") + 1] == "3"
    assert argv[argv.index("-Q") + 1] == "runs"
    assert "--beat" not in argv  # serve reaps its host itself; the 0.1 flag is gone
    # Nothing of the service uses Celery's worker-to-worker features (docs/operating.md).
    assert {"--without-gossip", "--without-mingle"} <= set(argv)
    assert "--without-heartbeat" not in argv  # Flower shows workers online by them


def test_serve_refuses_the_removed_beat_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--beat"])
    assert info.value.code == 2
    assert "--beat" in capsys.readouterr().err


async def test_an_error_while_rendering_ends_the_streamed_line_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def items() -> Iterator[StreamEvent]:
        event = {**ENVELOPE, "type": "message.delta"}
        event["data"] = {"role": "assistant", "text": "half a"}
        yield StreamEvent.from_line("1-0", json.dumps(event))
        raise EventsTrimmed("trimmed", job_id="j")

    with pytest.raises(EventsTrimmed):
        await _render(items(), as_json=False)
    assert capsys.readouterr().err == "  agent: half a\n"  # main's error line starts afresh


def test_serve_reaps_by_default_and_says_so_only_when_asked_not_to() -> None:
    parser = _build_parser()
    assert parser.parse_args(["serve"]).reaper is True
    assert parser.parse_args(["serve", "--no-reaper"]).reaper is False
    args = parser.parse_args(["serve", "--json"])
    argv = reaper_argv(args, 4242)
    assert argv[1:] == ["-m", "worker.cli", "reap", "--loop", "--parent", "4242", "--json"]
    assert parser.parse_args(argv[3:]).parent == 4242


def test_the_reaper_loop_stops_once_its_parent_is_gone() -> None:
    assert not _pause(30.0, parent=-1)  # not our parent: returns at once, not in 30 s
    assert _pause(0.01, parent=None)


# --- time limits of messages published without them ------------------------------------


def _message(job: object, timelimit: object = (None, None)) -> tuple[dict[str, object], object]:
    return {"task": RUN_TASK, "timelimit": timelimit}, ((job,), {}, {})


def test_a_message_without_limits_gets_its_jobs(settings: Settings) -> None:
    headers, body = _message(JOB)
    fill_time_limits(headers, body, settings)
    soft, hard = time_limits(60, settings)
    assert headers["timelimit"] == (hard, soft)
    headers, _ = _message(None)
    fill_time_limits(headers, ((), {"job": JOB}, {}), settings)  # the job as a keyword
    assert headers["timelimit"] == (hard, soft)


def test_limits_the_producer_set_are_kept(settings: Settings) -> None:
    soft = time_limits(60, settings)[0]
    headers, body = _message(JOB, [100.0, 50.0])
    fill_time_limits(headers, body, settings)
    assert headers["timelimit"] == [100.0, 50.0]
    headers, body = _message(JOB, [100.0, None])  # hard only: soft stays below it
    fill_time_limits(headers, body, settings)
    assert headers["timelimit"] == (100.0, min(soft, 100.0))
    headers, body = _message(JOB, [None, 10_000.0])  # soft only: hard stays above it
    fill_time_limits(headers, body, settings)
    assert headers["timelimit"] == (10_000.0 + HARD_MARGIN_S, 10_000.0)


def test_the_apps_defaults_count_as_not_set(settings: Settings) -> None:
    """What Celery writes for ``tasks.run_job.apply_async`` without limits."""
    soft, hard = time_limits(60, settings)
    default_soft, default_hard = time_limits(MAX_JOB_TIMEOUT_S, settings)
    headers, body = _message(JOB, [default_hard, default_soft])
    fill_time_limits(headers, body, settings)
    assert headers["timelimit"] == (hard, soft)


def test_an_invalid_job_is_left_to_the_worker(settings: Settings) -> None:
    for job in ("not a job", {"v": 1, "job_id": "x"}, 42):
        headers, body = _message(job)
        fill_time_limits(headers, body, settings)
        assert headers["timelimit"] == (None, None)


# --- one job id, one spec; one attempt's completion ----------------------------------------


ENVELOPE: dict[str, Any] = {"v": 1, "job_id": "j", "attempt": 1, "seq": 1, "ts": "t"}
COMPLETED = {"status": "succeeded", "stop_reason": "end_turn", "error": None, "duration_ms": 1}
NOTICE = {"level": "info", "code": "c", "message": "m"}


def test_the_spec_digest_ignores_spelling_not_meaning() -> None:
    spelled_out = {**JOB, "limits": {"timeout_s": 60.0, "memory_mb": 2048}}
    reordered = dict(reversed(list(JOB.items())))
    digest = spec_digest(parse_job(JOB))
    assert digest.startswith("sha256:")
    assert spec_digest(parse_job(spelled_out)) == digest
    assert spec_digest(parse_job(reordered)) == digest
    assert spec_digest(parse_job({**JOB, "prompt": "q"})) != digest


def test_only_the_completion_of_the_followed_attempt_or_a_later_one_ends_a_follow() -> None:
    def event(type_: str, attempt: int) -> StreamEvent:
        data = COMPLETED if type_ == "job.completed" else NOTICE
        line = json.dumps({**ENVELOPE, "type": type_, "attempt": attempt, "data": data})
        return StreamEvent.from_line("1-0", line)

    assert not _completes(event("job.completed", 1), 2)
    assert _completes(event("job.completed", 2), 2)
    assert _completes(event("job.completed", 3), 2)  # 2's was before the cursor
    assert not _completes(event("notice", 2), 2)
    assert _completes(event("job.completed", 1), None)  # a job without state


def test_a_closed_stdout_ends_the_cli_quietly() -> None:
    """`acp-worker schema | head -c 10`: the reader is gone; exit 141, no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "worker.cli", "schema"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141
