"""The reaper: settles jobs whose owner vanished and destroys what it left behind.

One pass (``reap_once``) does six sweeps, each safe to run from any process at any
time and concurrently with other reapers (``reap_pass`` also serializes the passes of
one host on a lock file next to ``work_dir``):

1. jobs in ``acpw:leases`` whose lease expired and that never settled get exactly one
   ``job.completed`` ``lost`` (``worker.store.lease.settle_lost`` refuses a job that
   settled, whose lease is alive, or that moved to another attempt);
2. every sandbox of every configured backend whose job is over is destroyed (its job,
   if this Redis holds it with an expired lease, is settled as in 1). Over means:

   - its owner process (``acpw.owner``, see :mod:`worker.store.owner`) can be judged
     from here (same boot, same pid namespace): over once that process is gone, even
     when this Redis never heard of the job (expired or flushed state); never while it
     lives, whatever the tokens say (the job id may be another deployment's, and a
     worker that lost its lease cancels its own job);
   - otherwise: its ``acpw.token`` was issued by this Redis (not above the job's fence
     counter) and is not the job's live lease token. A token-``0`` sandbox
     (``acp-worker run`` without a lease) whose owner cannot be judged is never over.

3. every labelled job directory under ``work_dir`` whose job is over in the same sense
   is removed once any ``keep_until`` the job asked for has passed, and never while a
   sandbox of the same job, attempt, token and owner is still there (it may hold the
   directory's workspace disk mounted).
4. every attempt directory under ``results_dir`` (a captured patch) untouched for
   ``results_keep_s`` is removed (never when that setting is 0);
5. every recorded session of the session store (``settings.session_root``) neither
   saved nor resumed for ``session_keep_s`` is removed (never when that setting is 0);
6. every job left ``queued`` with its broker message lost (a failover took it
   mid-delivery) is requeued (:mod:`worker.service.stranded`).

A served job whose worker died while its lease still lives loses its sandbox at once,
but is settled ``lost`` only by step 1, once that lease has expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions

from worker import metrics
from worker.client.queue import settled_ttl
from worker.errors import LeaseLost, ServiceUnavailable, WorkerError
from worker.events.completed import job_completed
from worker.events.emitter import serialize, utc_timestamp
from worker.packs.cache import open_lock
from worker.sandbox import backend_config, get_backend
from worker.sandbox.base import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_SLOT,
    LABEL_TOKEN,
    SandboxBackend,
    SandboxInfo,
)
from worker.service.stranded import requeue_stranded
from worker.sessions import reap_sessions
from worker.settings import Settings
from worker.store import warm
from worker.store.lease import expired_leases, forget_lease, redis_client, settle_lost
from worker.store.owner import LABEL_OWNER, LABEL_STORE, owner_state, store_label
from worker.store.state import JobState, issued_fence, lease_holder
from worker.workspace.prepare import read_labels
from worker.workspace.stage import remove_staged

log = logging.getLogger(__name__)

NO_FENCE = "0"  # the token label of sandboxes made outside the service (`acp-worker run`)


@dataclass(frozen=True, slots=True)
class ReapReport:
    """What one pass did."""

    lost: tuple[str, ...]
    destroyed: tuple[str, ...]
    failed: tuple[str, ...]
    workspaces: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    sessions: tuple[str, ...] = ()
    requeued: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "lost": list(self.lost),
            "destroyed": list(self.destroyed),
            "failed": list(self.failed),
            "workspaces": list(self.workspaces),
            "results": list(self.results),
            "sessions": list(self.sessions),
            "requeued": list(self.requeued),
        }


Holder = tuple[str, str, str, str]
"""(job, attempt, token, owner): what ties a work directory to the sandboxes it serves."""


def holder_of(labels: Mapping[str, str]) -> Holder:
    return (
        labels.get(LABEL_JOB, ""),
        labels.get(LABEL_ATTEMPT, ""),
        labels.get(LABEL_TOKEN, NO_FENCE),
        labels.get(LABEL_OWNER, ""),
    )


@dataclass(slots=True)
class _Sweep:
    lost: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    kept: set[Holder] = field(default_factory=set)


async def reap_once(
    client: aioredis.Redis, settings: Settings, backends: Mapping[str, SandboxBackend]
) -> ReapReport:
    """One pass over expired leases, every backend's sandboxes, the work directories,
    the results and the session store."""
    sweep = _Sweep()
    for job in await expired_leases(client):
        if await _settle_expired(client, job, settings):
            sweep.lost.append(job)
    for name, backend in backends.items():
        before = len(sweep.destroyed)
        for info in await backend.list({}):
            await _sweep_sandbox(client, settings, backend, info, sweep)
        metrics.sandboxes_reaped(name, len(sweep.destroyed) - before)
    workspaces = await reap_workspaces(
        client, settings.work_dir, kept=frozenset(sweep.kept), store=store_label(settings.redis_url)
    )
    results = await asyncio.to_thread(
        reap_results, settings.results_dir, keep_s=settings.results_keep_s
    )
    sessions = await asyncio.to_thread(
        reap_sessions, settings.session_root, keep_s=settings.session_keep_s
    )
    requeued = await requeue_stranded(client, settings)
    return ReapReport(
        tuple(sweep.lost),
        tuple(sweep.destroyed),
        tuple(sweep.failed),
        tuple(workspaces),
        tuple(results),
        tuple(sessions),
        tuple(requeued),
    )


def reap_results(results_dir: Path, *, keep_s: float, now: float | None = None) -> list[str]:
    """Remove ``<job>/<attempt>`` directories of ``results_dir`` nothing in which changed
    for ``keep_s`` seconds (then their job directory, once empty); ``keep_s`` 0: none.

    Returns the ``job/attempt`` names removed. Links are never followed; what cannot be
    removed is logged and tried again by the next pass.
    """
    if keep_s <= 0 or not results_dir.is_dir():
        return []
    cutoff = (time.time() if now is None else now) - keep_s
    removed = []
    for job_dir in sorted(results_dir.iterdir()):
        if job_dir.is_symlink() or not job_dir.is_dir():
            continue
        for attempt_dir in sorted(job_dir.iterdir()):
            if attempt_dir.is_symlink() or not attempt_dir.is_dir():
                continue
            if _newest_mtime(attempt_dir) >= cutoff:
                continue
            try:
                shutil.rmtree(attempt_dir)
            except OSError as exc:
                log.warning("could not remove %s: %s", attempt_dir, exc)
                continue
            removed.append(f"{job_dir.name}/{attempt_dir.name}")
        with contextlib.suppress(OSError):
            job_dir.rmdir()  # only once empty
    return removed


def _newest_mtime(root: Path) -> float:
    newest = root.lstat().st_mtime
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
    return newest


async def _sweep_sandbox(
    client: aioredis.Redis,
    settings: Settings,
    backend: SandboxBackend,
    info: SandboxInfo,
    sweep: _Sweep,
) -> None:
    if not await _over(client, info.labels, store_label(settings.redis_url)):
        sweep.kept.add(holder_of(info.labels))
        return
    job_id = info.labels.get(LABEL_JOB, "")
    leased = info.labels.get(LABEL_TOKEN, NO_FENCE) != NO_FENCE
    if leased and await mark_lost(client, job_id, settings) == "lost":
        sweep.lost.append(job_id)
    if await _destroy(backend, info):
        sweep.destroyed.append(info.sandbox_id)
    else:
        sweep.failed.append(info.sandbox_id)
        sweep.kept.add(holder_of(info.labels))


async def reap_workspaces(
    client: aioredis.Redis,
    work_dir: Path,
    *,
    kept: frozenset[Holder] = frozenset(),
    store: str | None = None,
) -> list[str]:
    """Remove the job directories whose job is over (see the module docstring, 3).

    ``kept``: the holders of sandboxes still there; their directories stay. ``store``:
    this Redis's ``acpw.store`` label (None: every leased job is judged as this one's).
    """
    removed = []
    for job_dir in await asyncio.to_thread(_job_dirs, work_dir):
        try:
            if await _reap_one(client, job_dir, kept, store):
                removed.append(job_dir.name)
        except redis.exceptions.RedisError:
            raise  # Redis itself is down: the pass as a whole fails and is retried
        except Exception:  # one bad directory must not stop the others being reaped
            log.exception("could not reap the work directory %s; next pass", job_dir)
    return removed


async def _reap_one(
    client: aioredis.Redis, job_dir: Path, kept: frozenset[Holder], store: str | None
) -> bool:
    labels = read_labels(job_dir)
    if labels is None or holder_of(labels) in kept:
        return False
    if not await _workspace_done(client, labels, store) or not await _remove(job_dir):
        return False
    log.info("removed the work directory %s of job %s", job_dir.name, labels.get(LABEL_JOB))
    return True


async def _remove(job_dir: Path) -> bool:
    try:
        await asyncio.to_thread(remove_staged, job_dir)
    except OSError as exc:  # a concurrent reaper took it, or a mount is stuck: next pass
        log.error("could not remove the work directory %s: %s", job_dir, exc)
        return False
    return True


def _job_dirs(work_dir: Path) -> list[Path]:
    return sorted(work_dir.iterdir()) if work_dir.is_dir() else []


async def _workspace_done(
    client: aioredis.Redis, labels: Mapping[str, str], store: str | None
) -> bool:
    keep_until = labels.get("keep_until")
    if keep_until is not None and time.time() < float(keep_until):
        return False
    if LABEL_OWNER not in labels and labels.get(LABEL_TOKEN, NO_FENCE) == NO_FENCE:
        # Labelled before owners were: the pid alone (a reused pid keeps it, never the
        # other way round).
        return not _alive(int(labels.get("pid", "0") or 0))
    return await _over(client, labels, store)


async def _over(client: aioredis.Redis, labels: Mapping[str, str], store: str | None) -> bool:
    """Whether the job that labelled something is over.

    An owner process judged gone from here makes it over, even if this Redis does not
    know the job. A job whose lease this Redis issued (its ``acpw.store`` label is this
    Redis, or it has none: made before the label existed) is over once that lease is
    gone, whatever its owner (a worker that leaked a sandbox lives on). Anything else —
    another deployment's job, an ``acp-worker run`` without a lease — is over only when
    its owner is gone.
    """
    owner = owner_state(labels.get(LABEL_OWNER))
    if owner == "gone":
        return True
    foreign = store is not None and labels.get(LABEL_STORE, store) != store
    slot = labels.get(LABEL_SLOT)
    if slot is not None and labels.get(LABEL_TOKEN, NO_FENCE) == NO_FENCE:
        # An unclaimed warm slot: over once its record (the lease its pool renews) lapsed.
        return not foreign and not await warm.slot_recorded(client, slot)
    if labels.get(LABEL_TOKEN, NO_FENCE) == NO_FENCE:
        return False
    if foreign:
        return False
    return await _lease_lost(client, labels)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _settle_expired(client: aioredis.Redis, job_id: str, settings: Settings) -> bool:
    result = await mark_lost(client, job_id, settings)
    if result != "alive":
        await forget_lease(client, job_id)
    return result == "lost"


async def _lease_lost(client: aioredis.Redis, labels: Mapping[str, str]) -> bool:
    """Whether a token this Redis issued no longer holds the job's lease.

    A token above the job's fence counter (or a job this Redis does not know) was issued
    by another deployment sharing the host: not ours to destroy.
    """
    fence = labels.get(LABEL_TOKEN, NO_FENCE)
    job_id = labels.get(LABEL_JOB)
    if not fence.isdigit() or not job_id:
        return False
    issued = await issued_fence(client, job_id)
    if issued is None or int(fence) > issued:
        return False
    return await lease_holder(client, job_id) != fence


async def _destroy(backend: SandboxBackend, info: SandboxInfo) -> bool:
    try:
        await backend.destroy(info.sandbox_id)
    except WorkerError as exc:
        log.error("could not destroy orphan sandbox %s: %s", info.sandbox_id, exc.message)
        return False
    log.info("destroyed orphan sandbox %s of job %s", info.sandbox_id, info.labels.get(LABEL_JOB))
    return True


async def mark_lost(client: aioredis.Redis, job_id: str, settings: Settings) -> str:
    """Write ``job.completed`` ``lost`` unless the job settled or is alive.

    Returns the script's verdict: ``lost``, ``alive``, ``settled``, ``moved`` (or
    ``retry`` when events kept landing, which means the owner is alive after all).
    """
    verdict, state = await settle_lost(
        client,
        job_id,
        line=_lost_line,
        ttl_s=settings.events_ttl,
        maxlen=settings.events_maxlen,
        settled_ttl_s=settled_ttl(settings),
    )
    if verdict == "lost" and state is not None:
        metrics.job_settled("lost", None)
        log.warning("job %s attempt %s settled as lost", job_id, state.attempt)
    return verdict


def _lost_line(state: JobState) -> str:
    """The ``job.completed`` ``lost`` that follows the last event of ``state``'s attempt."""
    job_id, started_ms = state.job_id, state.started_at_ms
    error = LeaseLost(
        "the worker running this job stopped renewing its lease; the job was reaped",
        job_id=job_id,
    )
    duration = max(0.0, time.time() * 1000 - float(started_ms)) if started_ms else 0.0
    data = job_completed(status="lost", error=error, duration_ms=round(duration, 2), timings_ms={})
    return serialize(
        job_id=job_id, attempt=state.attempt, seq=state.last_seq + 1, ts=utc_timestamp(), data=data
    )


async def reap_pass(settings: Settings) -> ReapReport:
    """One pass with a fresh Redis client and every backend of ``settings.reap_backends``.

    The passes of one host take turns on a lock file next to ``work_dir``: several
    workers per host each run a reaper, and a pass waits for the one under way instead
    of destroying the same sandboxes at the same time.

    Raises:
        ServiceUnavailable: no Redis is configured, or it did not answer.
        InvalidInput: a configured backend does not exist.
    """
    backends = {
        name: get_backend(backend_config(settings, name)) for name in settings.reap_backends
    }
    client = redis_client(settings.redis_url, settings)
    try:
        async with _host_turn(settings.work_dir):
            return await reap_once(client, settings, backends)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise ServiceUnavailable(f"the reaper could not reach Redis: {exc}") from exc
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def _host_turn(work_dir: Path) -> AsyncIterator[None]:
    """Hold the host's reaper lock (a file next to ``work_dir``) while the body runs."""
    fd = open_lock(work_dir.with_name(f".{work_dir.name}.reaper.lock"))
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock
