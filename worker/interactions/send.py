"""The control-plane side of answering: check the record, then append to the control
stream. The worker validates again (it is the authority); checking here gives the
caller an immediate, typed refusal for the common mistakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from worker.errors import InteractionClosed, InteractionNotFound, InvalidAnswer
from worker.interactions.answers import AnswerInvalid, validate_answer
from worker.interactions.control import answer_fields
from worker.store.control import append_control
from worker.store.interactions import OPEN, read_record, read_records


def open_record(client: redis.Redis, job_id: str, interaction_id: str) -> dict[str, Any]:
    """The interaction's record when it is still open.

    Raises:
        InteractionNotFound: the job has no such interaction.
        InteractionClosed: it was resolved already.
    """
    record = read_record(client, job_id, interaction_id)
    if record is None:
        raise InteractionNotFound(
            f"job {job_id!r} has no interaction {interaction_id!r}",
            job_id=job_id,
            interaction_id=interaction_id,
        )
    if record.get("status") != OPEN:
        raise InteractionClosed(
            f"interaction {interaction_id!r} is already {record.get('status')}",
            interaction_id=interaction_id,
            resolved_by=record.get("resolved_by"),
        )
    return record


def send_answer(
    client: redis.Redis,
    job_id: str,
    interaction_id: str,
    answer: Mapping[str, object],
    *,
    current_attempt: int | None = None,
) -> str:
    """Append the answer to the job's control stream; returns the entry id.

    ``current_attempt`` (from the job's state, when the job service runs it) refuses
    answers to an interaction of an earlier attempt.

    Raises:
        InteractionNotFound, InteractionClosed: see :func:`open_record`.
        InvalidAnswer: the answer does not fit the interaction (``details.reason``).
    """
    record = open_record(client, job_id, interaction_id)
    attempt = int(record["attempt"])
    if current_attempt is not None and attempt != current_attempt:
        raise InteractionClosed(
            f"interaction {interaction_id!r} belongs to attempt {attempt}, not the current "
            f"attempt {current_attempt}",
            interaction_id=interaction_id,
        )
    try:
        validate_answer(record["kind"], record["request"], dict(answer), turn=record["turn"])
    except AnswerInvalid as exc:
        raise InvalidAnswer(
            f"the answer does not fit {interaction_id!r}: {exc.reason}",
            reason=exc.reason,
            check=exc.check,
        ) from None
    return append_control(
        client, job_id, answer_fields(job_id, attempt, interaction_id, dict(answer))
    )


def list_records(client: redis.Redis, job_id: str) -> list[dict[str, object]]:
    """Every interaction record of the job, oldest first."""
    return sorted(
        read_records(client, job_id), key=lambda r: (r.get("attempt", 0), r.get("requested_at", ""))
    )
