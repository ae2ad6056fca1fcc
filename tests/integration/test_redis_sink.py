"""The Redis Stream sink against a real Redis: order, contiguity, batching, MAXLEN."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from worker import keys
from worker.errors import SinkUnavailable
from worker.events.emitter import EventEmitter
from worker.events.sinks import RedisStreamSink


async def test_events_arrive_in_order_with_contiguous_seq(aredis: aioredis.Redis) -> None:
    sink = RedisStreamSink(aredis, "job-r1", maxlen=10_000)
    emitter = EventEmitter(job_id="job-r1", attempt=1, sinks=[sink])
    for i in range(500):
        await emitter.emit("notice", {"level": "info", "code": "n", "message": str(i)})
    await emitter.close()
    entries = await aredis.xrange(keys.events("job-r1"))
    events = [json.loads(fields[b"event"]) for _, fields in entries]
    assert [e["seq"] for e in events] == list(range(1, 501))
    assert [e["data"]["message"] for e in events] == [str(i) for i in range(500)]


async def test_stream_is_bounded_approximately(aredis: aioredis.Redis) -> None:
    sink = RedisStreamSink(aredis, "job-r2", maxlen=100)
    emitter = EventEmitter(job_id="job-r2", attempt=1, sinks=[sink])
    for i in range(2000):
        await emitter.emit("notice", {"level": "info", "code": "n", "message": str(i)})
    await emitter.close()
    length = await aredis.xlen(keys.events("job-r2"))
    assert 100 <= length < 2000
    last = await aredis.xrevrange(keys.events("job-r2"), count=1)
    assert json.loads(last[0][1][b"event"])["seq"] == 2000


async def test_unreachable_redis_is_a_typed_error() -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    sink = RedisStreamSink(client, "job-r3", maxlen=10)
    emitter = EventEmitter(job_id="job-r3", attempt=1, sinks=[sink])
    await emitter.emit("notice", {"level": "info", "code": "n", "message": "x"})
    with pytest.raises(SinkUnavailable):
        await emitter.close()
    await client.aclose()
