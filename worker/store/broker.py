"""What kombu's Redis transport keeps in the broker, read for the reaper's stranded-job
sweep: which jobs have a ``tasks.run_job`` message waiting in the queue or delivered and
not acknowledged yet.

kombu's names (``kombu.transport.redis``, no ``global_keyprefix``, which acp-worker never
sets): a queue ``Q`` is the list ``Q`` (priority 0, every message ``send_run`` publishes)
and one list per other priority step, ``Q\\x06\\x16<step>``; a message taken by a consumer
and not acknowledged is a field of the hash ``unacked`` (its delivery tag -> ``[message,
exchange, routing key]``), its delivery time in the zset ``unacked_index``. A message is
the JSON payload kombu publishes: ``body`` (base64 of the Celery protocol-2 body
``[args, kwargs, embed]``), ``headers``, ``properties``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable

import redis.asyncio as aioredis

PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)  # kombu's default priority_steps
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"

Delivery = tuple[str, int | None]
"""(job id, attempt) a ``tasks.run_job`` message names; attempt None: the message does
not say (the worker then runs the state's current attempt)."""


def queue_lists(queue: str) -> list[str]:
    """The lists kombu keeps ``queue``'s messages in, one per priority step."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


async def deliveries(client: aioredis.Redis, queue: str) -> set[Delivery]:
    """Every job a message in ``queue``'s lists or in ``unacked`` names.

    The lists are read before ``unacked`` in one transaction: a consumer moves a message
    from a list to ``unacked`` (pop, then record), so a message mid-move is in neither for
    that instant only; the reaper asks twice, a pass apart, before it calls it gone.
    """
    pipe = client.pipeline(transaction=True)
    for name in queue_lists(queue):
        pipe.lrange(name, 0, -1)
    pipe.hvals(UNACKED)
    replies = await pipe.execute()
    found: set[Delivery] = set()
    for reply in replies:
        found.update(_named(reply))
    return found


def _named(raws: Iterable[bytes | str]) -> Iterable[Delivery]:
    for raw in raws:
        delivery = delivery_of(raw)
        if delivery is not None:
            yield delivery


def delivery_of(raw: bytes | str) -> Delivery | None:
    """The job a queued (or unacked) kombu message runs; None for anything else."""
    try:
        message = json.loads(raw)
        if isinstance(message, list) and message:  # unacked: [message, exchange, key]
            message = message[0]
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs = json.loads(body)[:2]
        job = args[0] if args else kwargs.get("job")
        if isinstance(job, str | bytes):
            job = json.loads(job)
        attempt = kwargs.get("attempt")
        return str(job["job_id"]), int(attempt) if attempt is not None else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, binascii.Error):
        return None
