"""The Python client against a real broker and nats-server: publishing (envelopes, keys,
partitions, load-balance groups, wildcards), reading from every start position, long polls,
errors, and restarts that must keep every acked message.

Waits are conditions with deadlines (asyncio.wait_for around an iteration that ends on its
own); nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import signal
import time
import zlib

import pytest

import jetstream
from jetstream.client import BrokerConnection, Client, Message, PublishMessage, Start, sync
from jetstream.errors import (
    AckTimeout,
    BrokerUnavailable,
    InvalidStreamConfig,
    NoStreamForSubject,
    OffsetOutOfRange,
    ProtocolError,
    RecordTooLarge,
    StreamExists,
    UnknownPartition,
    UnknownStream,
)
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess

DEADLINE_S = 10.0


async def read_all(js: Client, stream: str, partition: int = 0,
                   stop: str | int = "latest") -> list[Message]:
    """Every message of the partition from the start until `stop`, within the deadline."""
    async def collect() -> list[Message]:
        return [msg async for msg in js.subscribe(stream, partition, stop=stop)]

    return await asyncio.wait_for(collect(), DEADLINE_S)


# -- publishing -----------------------------------------------------------------------------


async def test_publish_is_acked_and_stored_with_key_and_headers(js: Client) -> None:
    info = await js.create_stream("events", "events.created")
    assert (info.name, info.subject, info.partition_count) == ("events", "events.created", 1)
    assert info.partitions[0].leader == 0

    ack = await js.publish("events.created", b"hello", key=b"k1", headers={"h": b"v"})

    assert (ack.stream, ack.partition, ack.offset, ack.subject) == (
        "events", 0, 0, "events.created")
    assert ack.ack_policy == jetstream.AckPolicy.ALL
    assert ack.correlation_id is not None
    (msg,) = (await js.fetch("events")).messages
    assert (msg.stream, msg.partition, msg.offset) == ("events", 0, 0)
    assert (msg.key, msg.value, dict(msg.headers), msg.subject) == (
        b"k1", b"hello", {"h": b"v"}, "events.created")
    assert abs(msg.timestamp_ms - time.time() * 1000) < 60_000


async def test_publish_batch_returns_acks_in_order(js: Client) -> None:
    await js.create_stream("batch", "batch.in")
    items = [PublishMessage("batch.in", b"%d" % i) for i in range(3000)]

    acks = await js.publish_batch(items, window=500)

    assert [a.offset for a in acks] == list(range(3000))
    assert {a.stream for a in acks} == {"batch"}
    values = [msg.value for msg in await read_all(js, "batch")]
    assert values == [b"%d" % i for i in range(3000)]


async def test_wildcard_stream_gets_every_matching_subject(js: Client) -> None:
    await js.create_stream("orders", "orders.*")

    await js.publish("orders.new", b"1")
    await js.publish("orders.paid", b"2")

    assert [(msg.subject, msg.value) for msg in await read_all(js, "orders")] == [
        ("orders.new", b"1"), ("orders.paid", b"2")]


async def test_two_streams_on_one_subject_each_get_every_message(js: Client) -> None:
    await js.create_stream("copy-a", "shared.subject")
    await js.create_stream("copy-b", "shared.subject")

    await js.publish_batch([("shared.subject", b"%d" % i) for i in range(100)])

    expected = [b"%d" % i for i in range(100)]
    for stream in ("copy-a", "copy-b"):
        assert [msg.value for msg in await read_all(js, stream, stop=100)] == expected


async def test_a_load_balance_group_splits_a_subject_between_its_streams(js: Client) -> None:
    await js.create_stream("worker-1", "jobs", ingest_group="workers")
    with pytest.warns(DeprecationWarning, match="ingest_group"):
        second_info = await js.create_stream("worker-2", "jobs", group="workers")
    assert second_info.ingest_group == "workers"

    acks = await js.publish_batch([("jobs", b"%d" % i) for i in range(200)])

    first = await read_all(js, "worker-1")
    second = await read_all(js, "worker-2")
    assert len(first) == sum(a.stream == "worker-1" for a in acks)
    assert len(second) == sum(a.stream == "worker-2" for a in acks)
    assert first and second  # 200 messages all landing on one member: p = 2**-199
    values = [msg.value for msg in first + second]
    assert sorted(values) == sorted(b"%d" % i for i in range(200))  # each exactly once


async def test_keys_pick_partitions_and_unkeyed_messages_round_robin(js: Client) -> None:
    await js.create_stream("keyed", "keyed", partitions=4)
    keys = [b"user-%d" % i for i in range(40)]

    keyed = await js.publish_batch([PublishMessage("keyed", b"v", key=k) for k in keys * 2])
    unkeyed = [await js.publish("keyed", b"rr") for _ in range(8)]
    explicit = await js.publish("keyed", b"p3", partition=3)

    assert [a.partition for a in keyed] == [zlib.crc32(k) % 4 for k in keys * 2]
    assert {a.partition for a in keyed} == {0, 1, 2, 3}
    assert [a.partition for a in unkeyed] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert (explicit.partition, explicit.subject) == (3, "keyed.3")
    for partition in range(4):
        stored = await read_all(js, "keyed", partition)
        assert {msg.key for msg in stored if msg.key} == {
            k for k in keys if zlib.crc32(k) % 4 == partition}


async def test_publish_without_a_reader_fails_fast(js: Client) -> None:
    await js.create_stream("two", "two", partitions=2)
    started = time.monotonic()

    with pytest.raises(NoStreamForSubject) as caught:
        await js.publish("nobody.reads.this", b"x", timeout=DEADLINE_S)
    with pytest.raises(NoStreamForSubject):
        await js.publish("two", b"x", partition=5, timeout=DEADLINE_S)

    assert time.monotonic() - started < DEADLINE_S / 2
    assert caught.value.code == "NO_STREAM_FOR_SUBJECT"
    assert caught.value.subject == "nobody.reads.this"


async def test_publish_with_ack_policy_none_returns_at_once_and_is_stored(js: Client) -> None:
    await js.create_stream("quiet", "quiet")

    assert await js.publish("quiet", b"x", ack_policy="none", timeout=0.3) is None
    assert await js.publish_batch([("quiet", b"y"), ("quiet", b"z")], ack_policy="none") == []
    # Stored all the same: only the ack was not asked for.
    values = [msg.value for msg in await read_all(js, "quiet", stop=3)]
    assert values == [b"x", b"y", b"z"]


async def test_no_ack_within_the_timeout_raises_ack_timeout(js: Client) -> None:
    # The stream's own policy is none, so a publish that waits for an ack waits in vain.
    await js.create_stream("silent", "silent", ack_policy="none")

    with pytest.raises(AckTimeout) as caught:
        await js.publish("silent", b"x", timeout=0.3)

    assert caught.value.code == "ACK_TIMEOUT"
    assert caught.value.retriable
    assert isinstance(caught.value, TimeoutError)
    assert [msg.value for msg in await read_all(js, "silent", stop=1)] == [b"x"]


async def test_oversize_message_gets_an_error_ack(js: Client) -> None:
    await js.create_stream("small", "small", max_message_bytes=100)

    with pytest.raises(RecordTooLarge) as caught:
        await js.publish("small", b"x" * 200)
    with pytest.raises(RecordTooLarge):
        await js.publish_batch([("small", b"ok"), ("small", b"x" * 200)])
    ack = await js.publish("small", b"fits")

    assert caught.value.code == "MESSAGE_TOO_LARGE"
    assert (caught.value.size, caught.value.limit) == (200, 100)
    assert ack.offset == 1  # "ok" took offset 0; nothing else was stored
    assert [msg.value for msg in await read_all(js, "small")] == [b"ok", b"fits"]


# -- streams -------------------------------------------------------------------------------


async def test_stream_admin(js: Client) -> None:
    created = await js.create_stream("admin", "admin.>", labels={"app": "shop"},
                                     retention_messages=1000, ack_policy="leader")
    again = await js.create_stream("admin", "admin.>", labels={"app": "shop"},
                                   retention_messages=1000, ack_policy="leader")

    assert again.config == created.config
    assert (created.labels, created.ack_policy) == ({"app": "shop"}, "leader")
    assert created.config["retention_messages"] == 1000
    with pytest.raises(StreamExists):
        await js.create_stream("admin", "other.subject")
    assert [s.name for s in await js.list_streams()] == ["admin"]
    await js.publish("admin.x", b"1")
    info = await js.stream_info("admin")
    assert (info.partitions[0].high_watermark, info.partitions[0].log_end_offset) == (1, 1)
    await js.delete_stream("admin")
    assert await js.list_streams() == []
    with pytest.raises(UnknownStream):
        await js.stream_info("admin")
    with pytest.raises(UnknownStream):
        await js.delete_stream("admin")


@pytest.mark.parametrize("name, subject, options, field", [
    ("bad name!", "ok", {}, "name"),
    ("x" * 65, "ok", {}, "name"),
    ("ok", "a..b", {}, "subject"),
    ("ok", "a b", {}, "subject"),
    ("ok", "many.>", {"partitions": 2}, "subject"),
    ("ok", "ok", {"partitions": 0}, "partitions"),
    ("ok", "ok", {"max_message_bytes": 1}, "max_message_bytes"),
    ("ok", "ok", {"ack_policy": "sometimes"}, "ack_policy"),
])
async def test_bad_stream_configs_are_refused(js: Client, name: str, subject: str,
                                              options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidStreamConfig) as caught:
        await js.create_stream(name, subject, **options)  # type: ignore[arg-type]

    assert caught.value.code == "INVALID_STREAM_CONFIG"
    assert caught.value.field == field
    # The broker keeps serving.
    assert (await js.create_stream("fine", "fine")).name == "fine"


async def test_unknown_streams_and_partitions(js: Client) -> None:
    await js.create_stream("known", "known")

    with pytest.raises(UnknownStream) as caught:
        await js.fetch("unknown")
    with pytest.raises(UnknownStream):
        await js.offset_for_timestamp("unknown", 0, 0)
    with pytest.raises(UnknownPartition):
        await js.fetch("known", 1)

    assert (caught.value.code, caught.value.stream) == ("UNKNOWN_STREAM", "unknown")


# -- reading -------------------------------------------------------------------------------


async def test_fetch_out_of_range_reports_the_readable_range(js: Client) -> None:
    await js.create_stream("ranged", "ranged")
    await js.publish_batch([("ranged", b"%d" % i) for i in range(10)])

    with pytest.raises(OffsetOutOfRange) as caught:
        await js.fetch("ranged", 0, 50)

    assert caught.value.code == "OFFSET_OUT_OF_RANGE"
    assert (caught.value.offset, caught.value.oldest, caught.value.newest) == (50, 0, 10)
    result = await js.fetch("ranged", 0, 10)
    assert (result.messages, result.high_watermark, result.next_offset) == ([], 10, 10)
    result = await js.fetch("ranged", 0, 4)
    assert [msg.offset for msg in result.messages] == list(range(4, 10))
    assert (result.log_start_offset, result.log_end_offset, result.next_offset) == (0, 10, 10)


async def test_subscribe_from_every_start_position(js: Client) -> None:
    await js.create_stream("positions", "positions")
    for i in range(10):
        await js.publish("positions", b"%d" % i)
    stored = (await js.fetch("positions")).messages
    target = stored[6].timestamp_ms
    first_at_target = min(msg.offset for msg in stored if msg.timestamp_ms >= target)

    async def offsets(**kwargs: object) -> list[int]:
        async def collect() -> list[int]:
            return [msg.offset async for msg in js.subscribe("positions", **kwargs)]
        return await asyncio.wait_for(collect(), DEADLINE_S)

    assert await offsets(start=Start.EARLIEST, stop="latest") == list(range(10))
    assert await offsets(start=Start.LATEST, stop="latest") == [9]
    assert await offsets(start=Start.OFFSET, offset=4, stop=7) == [4, 5, 6]
    assert await offsets(start=Start.TIMESTAMP, timestamp_ms=target, stop="latest") == list(
        range(first_at_target, 10))
    assert await offsets(start=Start.TIMESTAMP, timestamp_ms=2**50, stop="latest") == []
    assert await offsets(start=Start.NEW_ONLY, stop="latest") == []
    with pytest.raises(ProtocolError):
        js.subscribe("positions", start=Start.OFFSET)

    new_only = await js.subscribe("positions", start=Start.NEW_ONLY, stop=11)
    latest = await js.subscribe("positions", start=Start.LATEST, stop=11)
    await js.publish("positions", b"10")
    assert [msg.offset async for msg in new_only] == [10]
    assert [msg.offset async for msg in latest] == [9, 10]


async def test_latest_on_an_empty_partition_starts_at_the_next_message(js: Client) -> None:
    await js.create_stream("empty", "empty")
    async with js.subscribe("empty", start=Start.LATEST, stop=1) as sub:
        await js.publish("empty", b"first")
        messages = await asyncio.wait_for(sub.next_batch(), DEADLINE_S)
    assert messages is not None and [msg.value for msg in messages] == [b"first"]


async def test_a_following_subscription_gets_later_messages_at_once(js: Client) -> None:
    await js.create_stream("tail", "tail")
    async with js.subscribe("tail", start=Start.NEW_ONLY, max_wait_ms=30_000) as sub:
        waiting = asyncio.ensure_future(anext(sub))
        started = time.monotonic()
        await js.publish("tail", b"late")
        msg = await asyncio.wait_for(waiting, DEADLINE_S)
    assert (msg.offset, msg.value) == (0, b"late")
    # A long poll wakes on the commit, it does not run out its 30 s.
    assert time.monotonic() - started < DEADLINE_S


async def test_fetch_never_returns_offsets_at_or_above_the_high_watermark(js: Client) -> None:
    await js.create_stream("hw", "hw")
    publishing = asyncio.ensure_future(js.publish_batch([("hw", b"x" * 64)] * 5000))

    async def read_while_publishing() -> int:
        offset = 0
        while offset < 5000:
            result = await js.fetch("hw", 0, offset, max_bytes=64 * 1024, max_wait_ms=100)
            assert all(msg.offset < result.high_watermark for msg in result.messages)
            assert [msg.offset for msg in result.messages] == list(
                range(offset, offset + len(result.messages)))
            offset = result.next_offset
        return offset

    assert await asyncio.wait_for(read_while_publishing(), DEADLINE_S * 3) == 5000
    assert len(await publishing) == 5000


async def test_subscription_close_stops_the_fetch_in_flight(js: Client) -> None:
    await js.create_stream("closing", "closing")
    sub = await js.subscribe("closing", start=Start.NEW_ONLY, max_wait_ms=30_000)
    waiting = asyncio.ensure_future(anext(sub))
    await asyncio.wait_for(sub.close(), DEADLINE_S)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, DEADLINE_S)


# -- failures and restarts -----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_restart_keeps_every_acked_message(broker: BrokerProcess, js: Client,
                                                 sig: int) -> None:
    await js.create_stream("durable", "durable", partitions=2)
    acks = await js.publish_batch([PublishMessage("durable", b"%d" % i, key=b"%d" % i)
                                   for i in range(2000)])

    await asyncio.to_thread(broker.restart, sig=sig)

    # The same client: its connection died; it refreshes metadata and reconnects.
    stored = [msg for p in (0, 1) for msg in await read_all(js, "durable", p, stop="latest")]
    assert sorted((msg.partition, msg.offset) for msg in stored) == sorted(
        (a.partition, a.offset) for a in acks)
    assert sorted(msg.value for msg in stored) == sorted(b"%d" % i for i in range(2000))
    assert (await js.publish("durable", b"after", partition=0)).offset == sum(
        a.partition == 0 for a in acks)


async def test_a_subscription_follows_the_partition_through_a_restart(
        broker: BrokerProcess, js: Client) -> None:
    await js.create_stream("through", "through")
    await js.publish_batch([("through", b"%d" % i) for i in range(100)])
    async with js.subscribe("through", stop=200) as sub:
        first = await asyncio.wait_for(anext(sub), DEADLINE_S)
        await asyncio.to_thread(broker.restart)
        await js.publish_batch([("through", b"%d" % i) for i in range(100, 200)])
        rest = await asyncio.wait_for(_drain(sub), DEADLINE_S)
    assert [msg.value for msg in [first, *rest]] == [b"%d" % i for i in range(200)]


async def _drain(sub: jetstream.Subscription) -> list[Message]:
    return [msg async for msg in sub]


async def test_lost_connection_fails_requests_in_flight(broker: BrokerProcess) -> None:
    conn = BrokerConnection(broker.address, client_id="loss-test")
    hello = await conn.open()
    assert hello.broker_id == 0
    await conn.request(m.CreateStreamRequest({"name": "lost", "subject": "lost"}))
    long_poll = asyncio.ensure_future(conn.fetch(m.FetchRequest("lost", 0, 0, 1024, 30_000)))
    await asyncio.wait_for(_until_in_flight(conn), DEADLINE_S)

    await asyncio.to_thread(broker.kill)

    with pytest.raises(BrokerUnavailable) as caught:
        await asyncio.wait_for(long_poll, DEADLINE_S)
    assert isinstance(caught.value, ConnectionError) and caught.value.retriable
    assert caught.value.code == "BROKER_UNAVAILABLE"
    with pytest.raises(BrokerUnavailable):
        await conn.request(m.ListStreamsRequest())
    await conn.close()
    with pytest.raises(BrokerUnavailable):
        await BrokerConnection(broker.address, client_id="x", connect_timeout_s=2).open()


async def test_cancelling_a_close_cancels_its_caller(broker: BrokerProcess) -> None:
    # A task stopped while it closes a connection must stop, not carry on (a follower's
    # loop did, and the broker waiting for it to stop hung).
    conn = BrokerConnection(broker.address, client_id="cancel-test")
    await conn.open()
    closing = asyncio.ensure_future(conn.close())
    await asyncio.sleep(0)  # `closing` now waits for the connection's reader task to end
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert conn.closed


async def _until_in_flight(conn: BrokerConnection) -> None:
    # A request is pending from the moment its frame is written until its answer comes.
    while not conn._pending:
        await asyncio.sleep(0.01)


async def test_connect_reads_brokers_from_the_environment(
        broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSTREAM_BROKERS", f"127.0.0.1:1,{broker.address}")
    async with jetstream.connect() as js:
        assert [(b.id, b.address, b.nats_url) for b in js.brokers] == [
            (0, broker.address, broker.nats_url)]
    monkeypatch.delenv("JETSTREAM_BROKERS")
    with pytest.raises(ProtocolError):
        jetstream.connect()
    with pytest.raises(BrokerUnavailable):
        await jetstream.connect("127.0.0.1:1", connect_timeout_s=2)


# -- the sync facade -----------------------------------------------------------------------


def test_sync_client(broker: BrokerProcess) -> None:
    with sync.connect(broker.address) as js:
        js.create_stream("scripted", "scripted.*", partitions=1)
        ack = js.publish("scripted.one", b"1", key=b"k")
        acks = js.publish_batch([("scripted.two", b"2"), ("scripted.three", b"3")])
        with js.subscribe("scripted", stop="latest") as sub:
            values = [msg.value for msg in sub]
        fetched = js.fetch("scripted", 0, 1)
        with pytest.raises(UnknownStream):
            js.stream_info("nope")
        assert js.offset_for_timestamp("scripted", 0, m.LATEST_TIMESTAMP) == 3
        assert [s.name for s in js.list_streams()] == ["scripted"]
    assert (ack.offset, [a.offset for a in acks]) == (0, [1, 2])
    assert values == [b"1", b"2", b"3"]
    assert [msg.subject for msg in fetched.messages] == ["scripted.two", "scripted.three"]
    assert not js._thread.is_alive()  # close() stopped the loop's thread


def test_sync_consumer_group_member(broker: BrokerProcess) -> None:
    with sync.connect(broker.address) as js:
        js.create_stream("chores", "chores", partitions=2)
        js.publish_batch([PublishMessage("chores", b"%d" % i, partition=i % 2)
                          for i in range(6)])
        with js.subscribe("chores", group="house", auto_commit=False) as member:
            got = []
            for msg in member:
                got.append((msg.partition, msg.offset))
                if len(got) == 6:
                    break
            assert member.assignment == {("chores", 0), ("chores", 1)}
            member.commit()
        assert sorted(got) == [(p, o) for p in (0, 1) for o in range(3)]
        assert js.fetch_offsets("house").keys() == {("chores", 0), ("chores", 1)}
        assert js.fetch_offset("house", "chores", 1) == 3
        assert [g.group for g in js.list_groups()] == ["house"]
