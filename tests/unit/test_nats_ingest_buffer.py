"""The pure parts of the ingest connection: a subscription's bounded buffer (batches, limits,
slow-consumer drops) and URL parsing. No sockets."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jetstream.server.nats_dial import ServerAddress, parse_url
from jetstream.server.nats_errors import NatsConnectionClosed, NatsUnsupported
from jetstream.server.nats_ingest import IngestConnection
from jetstream.server.nats_subscription import IngestSubscription
from jetstream.server.nats_wire import NatsMsg


def subscription(msgs_max: int = 1000, bytes_max: int = 10_000) -> IngestSubscription:
    conn = IngestConnection([ServerAddress("127.0.0.1", 4222)])  # never connected
    return IngestSubscription(conn, "1", "in", None, msgs_max, bytes_max)


def msgs(sizes: list[int], first: int = 0) -> list[NatsMsg]:
    return [("in", f"r.{first + i}", None, b"x" * size) for i, size in enumerate(sizes)]


def deliver(sub: IngestSubscription, batch: list[NatsMsg]) -> None:
    sub.deliver(batch, sum(len(m[3]) for m in batch))


def test_take_everything_when_it_fits() -> None:
    sub = subscription()
    deliver(sub, msgs([1, 2], 0))
    deliver(sub, msgs([3], 2))
    assert [m[1] for m in sub.take_batch()] == ["r.0", "r.1", "r.2"]
    assert (sub.pending_msgs, sub.pending_bytes, sub.take_batch()) == (0, 0, [])


def test_batches_respect_message_and_byte_limits() -> None:
    sub = subscription()
    deliver(sub, msgs([10] * 5, 0))
    deliver(sub, msgs([10] * 5, 5))
    assert [m[1] for m in sub.take_batch(max_msgs=3)] == ["r.0", "r.1", "r.2"]
    assert [m[1] for m in sub.take_batch(max_bytes=45)] == ["r.3", "r.4", "r.5", "r.6"]
    assert (sub.pending_msgs, sub.pending_bytes) == (3, 30)
    assert [m[1] for m in sub.take_batch()] == ["r.7", "r.8", "r.9"]


def test_a_message_larger_than_max_bytes_comes_alone() -> None:
    sub = subscription()
    deliver(sub, msgs([100, 5], 0))
    assert [m[1] for m in sub.take_batch(max_bytes=50)] == ["r.0"]
    assert [m[1] for m in sub.take_batch(max_bytes=50)] == ["r.1"]
    deliver(sub, msgs([100], 2))
    assert [m[1] for m in sub.take_batch(max_bytes=50)] == ["r.2"]
    assert sub.take_batch() == []


def test_a_full_buffer_drops_and_counts() -> None:
    sub = subscription(msgs_max=3, bytes_max=1000)
    deliver(sub, msgs([1, 1], 0))
    deliver(sub, msgs([1, 1, 1], 2))
    assert (sub.received, sub.dropped, sub.pending_msgs) == (5, 2, 3)
    assert [m[1] for m in sub.take_batch()] == ["r.0", "r.1", "r.2"]
    bytes_bound = subscription(msgs_max=100, bytes_max=25)
    deliver(bytes_bound, msgs([10, 10, 10], 0))
    assert (bytes_bound.dropped, bytes_bound.pending_bytes) == (1, 20)


@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=8), max_size=10),
       st.integers(1, 7), st.integers(1, 60), st.integers(1, 20), st.integers(1, 200))
def test_nothing_is_lost_reordered_or_over_the_limits(
        reads: list[list[int]], max_msgs: int, max_bytes: int, msgs_max: int,
        bytes_max: int) -> None:
    sub = subscription(msgs_max, bytes_max)
    sent = 0
    taken: list[NatsMsg] = []
    for sizes in reads:
        deliver(sub, msgs(sizes, sent))
        sent += len(sizes)
        assert sub.pending_msgs <= msgs_max and sub.pending_bytes <= bytes_max
        batch = sub.take_batch(max_msgs, max_bytes)
        assert len(batch) <= max_msgs
        assert len(batch) == 1 or sum(len(m[3]) for m in batch) <= max_bytes
        taken += batch
    while batch := sub.take_batch(max_msgs, max_bytes):
        taken += batch
    numbers = [int(m[1][2:]) for m in taken if m[1] is not None]
    assert numbers == sorted(numbers)
    assert len(taken) + sub.dropped == sent == sub.received
    assert (sub.pending_msgs, sub.pending_bytes) == (0, 0)


@pytest.mark.parametrize(("url", "expected"), [
    ("nats://127.0.0.1:4333", ServerAddress("127.0.0.1", 4333)),
    ("nats://localhost", ServerAddress("localhost", 4222)),
    ("127.0.0.1:5000", ServerAddress("127.0.0.1", 5000)),
    ("nats://alice:s%40cret@h:1", ServerAddress("h", 1, user="alice", password="s@cret")),
    ("nats://tok3n@h:1", ServerAddress("h", 1, auth_token="tok3n")),
    ("tls://h:4222", ServerAddress("h", 4222, tls=True)),
    ("tls://bob:pw@h", ServerAddress("h", 4222, user="bob", password="pw", tls=True)),
])
def test_urls(url: str, expected: ServerAddress) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize("url", ["ws://h:80", "wss://h:443"])
def test_websocket_urls_are_refused(url: str) -> None:
    with pytest.raises(NatsUnsupported, match="nats-py"):
        parse_url(url)


async def test_next_batch_waits_on_when_a_read_was_all_dropped() -> None:
    sub = subscription(msgs_max=10, bytes_max=10)
    waiting = asyncio.create_task(sub.next_batch())
    await asyncio.sleep(0)  # let it start waiting: no IO here, one loop turn
    deliver(sub, msgs([20], 0))  # too big for the buffer: dropped, wakes the waiter
    await asyncio.sleep(0)
    assert not waiting.done() and sub.dropped == 1
    deliver(sub, msgs([5], 1))
    assert [m[1] for m in await asyncio.wait_for(waiting, 5)] == ["r.1"]


async def test_next_batch_timeout_and_close() -> None:
    sub = subscription()
    assert await sub.next_batch(timeout_s=0.01) == []
    deliver(sub, msgs([1], 0))
    sub.close(NatsConnectionClosed("closed"))
    assert len(await sub.next_batch()) == 1  # what is left first
    with pytest.raises(NatsConnectionClosed):
        await sub.next_batch()
