"""The reaper's stranded-job sweep: a queued job whose broker message is gone is
requeued.

A Redis failover can lose a message mid-delivery: a consumer popped it from the queue's
list and the primary died before kombu's ``unacked`` record of it reached the replica
(docs/durability.md, What a failover does). The promoted replica then holds the job
``queued`` with ``enqueued`` set and no message anywhere: nothing would ever run it.

A job is requeued (``Client.requeue``, the operator's own path) when all of these hold:

- it was published at least ``requeue_stranded_after_s`` ago (the index
  ``acpw:queued``, :mod:`worker.store.queued`) and is still ``queued``, ``enqueued``,
  with no lease and no live enqueue claim (no submit or requeue publishing it);
- two passes at least ``min(requeue_stranded_after_s, reaper_interval)`` apart found no
  message naming its attempt in the queue's lists (every priority step) nor in kombu's
  ``unacked`` hash (:mod:`worker.store.broker`). A consumer moves a message from the list
  to ``unacked`` in two steps a moment apart, then takes the lease; a job it is
  delivering is found by the second pass, or has its lease by then.

A false positive costs one refused delivery, never a second run: ``requeue`` claims the
publish atomically (a racing submit or requeue publishes it once), and of two messages
of one attempt the second delivery is refused the lease (``held`` while the first runs,
``settled`` after) and counted in the state's ``duplicates``.

The broker is read where the worker's Celery app publishes (``ACPW_BROKER_URL``, else
the store's Redis); a broker that is not Redis, or does not answer, skips the sweep with
a log line. A pass with candidates reads the queue's lists in full.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
import redis.exceptions

from worker import metrics
from worker.client import Client
from worker.client.client import REQUEUED
from worker.client.queue import broker_url
from worker.errors import WorkerError
from worker.settings import Settings
from worker.store import broker, queued
from worker.store.connect import redact
from worker.store.lease import redis_client

log = logging.getLogger(__name__)


async def requeue_stranded(
    client: aioredis.Redis, settings: Settings, *, now: float | None = None
) -> list[str]:
    """One sweep; returns the job ids it requeued."""
    grace = settings.requeue_stranded_after_s
    if grace <= 0:
        return []
    now = time.time() if now is None else now
    candidates = await _candidates(client, now - grace)
    if not candidates:
        return []
    present = await _deliveries(client, settings)
    if present is None:
        return []
    confirm = min(grace, settings.reaper_interval)
    gone = []
    for waiting in candidates:
        if (waiting.job_id, waiting.attempt) in present or (waiting.job_id, None) in present:
            await queued.not_stranded(client, waiting.job_id)
        elif await queued.seen_stranded(client, waiting.job_id, now) <= now - confirm:
            gone.append(waiting.job_id)
    requeued = await _requeue(settings, gone) if gone else []
    for job_id in gone:
        await queued.not_stranded(client, job_id)
    metrics.stranded_requeued(len(requeued))
    return requeued


async def _candidates(client: aioredis.Redis, cutoff: float) -> list[queued.Waiting]:
    """The jobs of the index published by ``cutoff`` that may have lost their message;
    those no longer queued leave the index."""
    ids = await queued.published_before(client, cutoff)
    candidates = []
    for waiting in await queued.read_waiting(client, ids) if ids else []:
        if waiting.status != "queued":  # started, settled or expired
            await queued.forget(client, waiting.job_id)
        elif waiting.stranded_candidate:
            candidates.append(waiting)
        else:  # leased, or being published: whatever an earlier pass found is void
            await queued.not_stranded(client, waiting.job_id)
    return candidates


async def _deliveries(client: aioredis.Redis, settings: Settings) -> set[broker.Delivery] | None:
    """The jobs the broker holds a message of; None (logged) when it cannot be read."""
    url = broker_url(settings)
    same = url == settings.redis_url
    try:
        reader = client if same else redis_client(url, settings)
    except WorkerError as exc:  # not a Redis URL (amqp://…): kombu's keys are not there
        log.info(
            "stranded-job sweep skipped: the broker %s is not readable as Redis: %s",
            redact(url),
            exc.message,
        )
        return None
    try:
        return await broker.deliveries(reader, settings.queue)
    except (redis.exceptions.RedisError, OSError) as exc:
        log.warning(
            "stranded-job sweep skipped: the broker %s did not answer: %s", redact(url), exc
        )
        return None
    finally:
        if not same:
            await reader.aclose()


async def _requeue(settings: Settings, job_ids: list[str]) -> list[str]:
    """``Client.requeue`` each job; returns those it published again."""

    def run() -> list[str]:
        done = []
        with Client(settings.redis_url or "", settings=settings) as client:
            for job_id in job_ids:
                try:
                    outcome = client.requeue(job_id).outcome
                except WorkerError as exc:
                    log.error("could not requeue stranded job %s: %s", job_id, exc.message)
                    continue
                if outcome == REQUEUED:
                    log.warning(
                        "job %s stayed queued without a broker message (lost in a "
                        "failover): requeued",
                        job_id,
                    )
                    done.append(job_id)
        return done

    return await asyncio.to_thread(run)
