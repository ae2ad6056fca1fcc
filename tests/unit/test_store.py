"""The store's pure parts: the Lua programs name only known state fields, and the typed
view of the state hash reads what the programs write (no Redis)."""

from __future__ import annotations

import re

import pytest

from worker.store import fields, scripts
from worker.store.state import JobState

# KEYS[2] is the state hash, KEYS[5] the settlement record (written with the same names).
_HASH_CALL = re.compile(
    r"redis\.call\('(HSET|HMGET|HDEL|HEXISTS|HINCRBY)', KEYS\[[25]\],([^\n]*\n?)"
)


def _arguments(program: scripts.Program) -> list[tuple[str, list[str]]]:
    """(command, top-level arguments after the key) of every call on the state hash."""
    calls = []
    for command, start in _HASH_CALL.findall(program.source.replace("\n  ", " ")):
        depth, current, args = 1, "", []
        for char in start:
            depth += (char == "(") - (char == ")")
            if depth == 0 or (char == "," and depth == 1):
                args.append(current.strip())
                current = ""
                if depth == 0:
                    break
                continue
            current += char
        calls.append((command, args))
    return calls


def _field_names(command: str, args: list[str]) -> list[str]:
    named = args[::2] if command == "HSET" else args[:1] if command == "HINCRBY" else args
    return [arg.strip("'") for arg in named if arg.startswith("'")]


_STATE_PROGRAMS = {
    scripts.ACQUIRE,
    scripts.APPEND,
    scripts.MARK_LOST,
    scripts.SUBMIT,
    scripts.ENQUEUE,
    scripts.REFUSE,
}


@pytest.mark.parametrize("program", scripts.PROGRAMS, ids=lambda p: p.name)
def test_every_state_field_a_program_touches_is_a_known_one(program: scripts.Program) -> None:
    calls = _arguments(program)
    names = {name for command, args in calls for name in _field_names(command, args)}
    assert names <= fields.ALL, names - fields.ALL
    # The others take no state hash (PUT_INTERACTION's KEYS[2] is the interactions hash,
    # written under names it is given).
    assert bool(names) == (program in _STATE_PROGRAMS), (program.name, names)


def test_the_programs_are_whole_and_registered_once_per_client() -> None:
    import redis

    client = redis.Redis()
    assert "local function trim_events" in scripts.APPEND.source
    assert "local TERMINAL" in scripts.SUBMIT.source
    assert "{" + fields.TRIMMED_UNTIL + "}" not in scripts.APPEND.source  # no template left
    assert scripts.bound_sync(client, scripts.SUBMIT) is scripts.bound_sync(client, scripts.SUBMIT)
    other = redis.Redis()
    assert scripts.bound_sync(other, scripts.SUBMIT) is not scripts.bound_sync(
        client, scripts.SUBMIT
    )


def test_the_state_view_reads_the_hash_as_redis_returns_it() -> None:
    raw = {
        b"attempt": b"2",
        b"status": b"running",
        b"fence": b"7",
        b"ev_attempt": b"2",
        b"ev_seq": b"41",
        b"started_at": b"1700000000000",
        b"submitted_at": b"1700000000500",
        b"enqueued": b"1",
        b"attempt_after": b"5-0",
        b"job": b'{"job_id": "j"}',
        b"token": b"7",
    }
    state = JobState.from_hash("j", raw)
    assert (state.attempt, state.status, state.running, state.settled) == (
        2,
        "running",
        True,
        False,
    )
    assert (state.fence, state.last_seq, state.enqueued) == (7, 41, True)
    assert state.submitted_at == 1700000000.5
    assert state.attempt_after == "5-0"
    assert state.job_json == '{"job_id": "j"}'
    assert set(state.to_dict()) == {
        "attempt",
        "status",
        "ev_seq",
        "started_at",
        "submitted_at",
        "enqueued",
        "job_id",
    }


def test_events_of_an_earlier_attempt_do_not_count_as_this_ones() -> None:
    state = JobState.from_hash("j", {"attempt": "3", "ev_attempt": "2", "ev_seq": "9"})
    assert state.last_seq == 0
    assert state.status == fields.QUEUED  # a hash without one reads as queued
    assert state.fence is None
