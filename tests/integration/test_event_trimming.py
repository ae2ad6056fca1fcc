"""The bounded event stream against a real Redis: trimming is recorded in the job's state
(``events_trimmed_until``) in the same program that trims, and ``Client.events`` turns a
cursor the trim went past into ``EventsTrimmed`` instead of a silent gap.

Writes go through the fenced sink's own call of the APPEND program; readers are driven
step by step from the test (the client's generator reads only when asked), so "a follower
that keeps up" is exact, not a matter of timing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from worker.cli import main
from worker.client import Client, StreamEvent
from worker.errors import EventsTrimmed, InvalidInput
from worker.service.reaper import mark_lost
from worker.settings import Settings
from worker.store import keys
from worker.store import lease as leases
from worker.store.fenced import FencedStreamSink, SinkPolicy, _Pending
from worker.store.fields import TRIMMED_UNTIL
from worker.store.lease import Lease

pytestmark = pytest.mark.integration


def _line(job_id: str, seq: int, type_: str = "notice") -> str:
    data: dict[str, object] = {"level": "info", "code": "t", "message": f"event {seq}"}
    if type_ == "job.completed":
        data = {"status": "succeeded", "stop_reason": "end_turn", "error": None}
    event = {"v": 1, "job_id": job_id, "attempt": 1, "seq": seq, "ts": "t", "type": type_}
    return json.dumps({**event, "data": data})


class _Writer:
    """The worker's side: numbered events appended through the fenced sink's program."""

    def __init__(self, client: aioredis.Redis, lease: Lease, maxlen: int) -> None:
        self.client = client
        self.job_id = lease.job_id
        self.sink = FencedStreamSink(client, lease, policy=SinkPolicy(maxlen=maxlen))
        self.seq = 0

    async def write(self, count: int, *, final: bool = False) -> None:
        batch = []
        for i in range(count):
            self.seq += 1
            type_ = "job.completed" if final and i == count - 1 else "notice"
            status = "succeeded" if type_ == "job.completed" else ""
            batch.append(_Pending(self.seq, status, _line(self.job_id, self.seq, type_)))
        assert await self.sink._append(batch) == count

    async def ids(self, after: str = "-") -> list[str]:
        entries = await self.client.xrange(keys.events(self.job_id), min=after)
        return [entry_id.decode() for entry_id, _ in entries]

    async def watermark(self) -> str | None:
        raw = await self.client.hget(keys.state(self.job_id), TRIMMED_UNTIL)
        return None if raw is None else raw.decode()


async def _writer(client: aioredis.Redis, job_id: str, maxlen: int) -> _Writer:
    got = await leases.acquire(client, job_id, worker_id="w1", ttl=30)
    assert isinstance(got, Lease), got
    return _Writer(client, got, maxlen)


def _record(item: StreamEvent) -> tuple[str, int]:
    return item.id, int(item.event["seq"])


def _pair(stream_id: str) -> tuple[int, int]:
    ms, seq = stream_id.split("-")
    return int(ms), int(seq)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    with Client(redis_url, settings=Settings(redis_url=redis_url)) as c:
        yield c


async def test_reading_a_trimmed_stream_from_the_start_is_refused(
    aredis: aioredis.Redis, client: Client
) -> None:
    writer = await _writer(aredis, "trim-a", maxlen=10)
    await writer.write(100)
    kept, until = await writer.ids(), await writer.watermark()
    assert len(kept) == 10
    assert until is not None
    assert _pair(until) < _pair(kept[0])
    for follow in (False, True):
        with pytest.raises(EventsTrimmed) as caught:
            next(client.events("trim-a", follow=follow, timeout=10))
        assert caught.value.code == "events_trimmed"
        assert caught.value.details == {
            "job_id": "trim-a",
            "after": "0-0",
            "trimmed_until": until,
            "first_available": kept[0],
        }
        assert kept[0] in caught.value.message
        assert f"resume after {until}" in caught.value.message


async def test_resuming_at_or_after_the_watermark_reads_the_rest_without_error(
    aredis: aioredis.Redis, client: Client
) -> None:
    writer = await _writer(aredis, "trim-b", maxlen=10)
    await writer.write(100)
    kept, until = await writer.ids(), await writer.watermark()
    assert until is not None
    rest = list(client.events("trim-b", after=until))
    assert [item.id for item in rest] == kept
    assert [item.event["seq"] for item in rest] == list(range(91, 101))
    for i, cursor in enumerate(kept):
        assert [item.id for item in client.events("trim-b", after=cursor)] == kept[i + 1 :]
    ms = until.split("-")[0]  # a bare millisecond is an id too (ms-0), below the watermark
    with pytest.raises(EventsTrimmed):
        list(client.events("trim-b", after=str(int(ms) - 1)))
    with pytest.raises(InvalidInput):
        list(client.events("trim-b", after="not-an-id"))


async def test_a_follower_that_keeps_up_never_sees_a_gap(
    aredis: aioredis.Redis, client: Client
) -> None:
    writer = await _writer(aredis, "trim-c", maxlen=8)
    follower = client.events("trim-c", follow=True, timeout=30)
    seen: list[tuple[str, int]] = []
    watermarks: set[str | None] = set()
    at_the_watermark = 0
    for round_ in range(60):
        count = 1 + (round_ * 5) % 8  # 1..8: never more than maxlen in one batch
        cursor = seen[-1][0] if seen else None
        await writer.write(count)
        watermark = await writer.watermark()
        watermarks.add(watermark)
        at_the_watermark += watermark == cursor  # the trim took everything it had read
        seen += [_record(next(follower)) for _ in range(count)]
    await writer.write(1, final=True)
    seen += [_record(item) for item in follower]  # ends with job.completed
    assert [seq for _, seq in seen] == list(range(1, writer.seq + 1))
    assert len(watermarks) > 20  # trimmed over and over while it followed
    assert at_the_watermark > 0  # and with its cursor exactly at the watermark


async def test_a_follower_that_falls_behind_is_told_where_to_resume(
    aredis: aioredis.Redis, client: Client
) -> None:
    writer = await _writer(aredis, "trim-f", maxlen=10)
    await writer.write(5)
    follower = client.events("trim-f", follow=True, timeout=30)
    read = [next(follower) for _ in range(5)]
    await writer.write(30)  # one batch: 35 events trimmed to 10, 20 of them never read
    with pytest.raises(EventsTrimmed) as caught:
        next(follower)
    kept, until = await writer.ids(), await writer.watermark()
    assert caught.value.details["after"] == read[-1].id
    assert caught.value.details["first_available"] == kept[0]
    assert caught.value.details["trimmed_until"] == until
    resumed = client.events("trim-f", after=until)
    assert [item.event["seq"] for item in resumed] == list(range(26, 36))


async def test_every_trimmed_event_is_at_or_below_the_watermark(
    aredis: aioredis.Redis, client: Client
) -> None:
    maxlen = 20
    writer = await _writer(aredis, "trim-d", maxlen=maxlen)
    written: list[str] = []
    removed: list[str] = []
    for round_ in range(80):
        count = 1 + (round_ * 7) % maxlen
        await writer.write(count)
        new = await writer.ids(after=f"({written[-1]}" if written else "-")
        assert len(new) == count  # a batch no longer than maxlen is kept whole
        written += new
        kept, until = await writer.ids(), await writer.watermark()
        assert len(kept) <= maxlen + 2  # maxlen + max(1, min(64, maxlen // 10))
        assert written[len(written) - len(kept) :] == kept  # only ever a prefix is gone
        removed = written[: len(written) - len(kept)]
        assert until == (removed[-1] if removed else None)  # neither behind nor ahead
    assert len(removed) > 10 * maxlen
    assert until is not None
    for cursor in (*removed[-3:], *kept[:3]):  # removed[-1] is the watermark itself
        if _pair(cursor) < _pair(until):
            with pytest.raises(EventsTrimmed):
                list(client.events("trim-d", after=cursor))
        else:
            rest = [item.id for item in client.events("trim-d", after=cursor)]
            assert rest == [k for k in kept if _pair(k) > _pair(cursor)]


async def test_the_reapers_lost_event_trims_and_records_too(aredis: aioredis.Redis) -> None:
    writer = await _writer(aredis, "trim-l", maxlen=10)
    await writer.write(11)  # maxlen + 1: at the bound, not over it
    before = await writer.ids()
    assert (len(before), await writer.watermark()) == (11, None)
    await aredis.delete(keys.lease("trim-l"))
    settings = Settings(redis_url="redis://unused", events_maxlen=10)
    assert await mark_lost(aredis, "trim-l", settings) == "lost"
    after = await writer.ids()
    assert after[:-1] == before[2:]
    assert await writer.watermark() == before[1]


async def _filled(url: str, job_id: str, count: int, maxlen: int) -> tuple[list[str], str]:
    client = aioredis.Redis.from_url(url)
    try:
        writer = await _writer(client, job_id, maxlen)
        await writer.write(count)
        until = await writer.watermark()
        assert until is not None
        return await writer.ids(), until
    finally:
        await client.aclose()


def test_the_cli_prints_one_error_line_and_fails(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kept, until = asyncio.run(_filled(redis_url, "trim-e", 50, maxlen=10))
    assert main(["events", "trim-e", "--json", "--redis", redis_url]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    error = json.loads(line)["error"]
    assert error["code"] == "events_trimmed"
    assert error["details"]["first_available"] == kept[0]
    assert main(["events", "trim-e", "--redis", redis_url]) == 1
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert line.startswith("acp-worker: events of job trim-e from the start were trimmed")
    assert line.endswith("[events_trimmed]")
    assert main(["events", "trim-e", "--after", until, "--json", "--redis", redis_url]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(x)["id"] for x in out.splitlines()] == kept
    assert err == ""


async def test_a_large_bound_is_kept_within_64_events(aredis: aioredis.Redis) -> None:
    writer = await _writer(aredis, "trim-g", maxlen=1000)
    await writer.write(1064)  # over by 64: not yet trimmed
    assert len(await writer.ids()) == 1064
    assert await writer.watermark() is None
    written = await writer.ids()
    await writer.write(1)  # over by 65: trimmed back to the bound, in pages
    kept = await writer.ids()
    assert len(kept) == 1000
    assert kept[:-1] == written[65:]
    assert await writer.watermark() == written[64]
