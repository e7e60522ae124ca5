"""Replication is multiplexed per broker pair: each broker fetches every partition it follows
at another broker through one fetch session, so the requests between idle brokers do not
grow with the number of partitions, and a new partition's first records need not wait out
the session's long poll. Structural counters (/metrics), not timings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client import Client, PublishMessage
from jetstream.client.connection import BrokerConnection
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from jetstream.stream.format import decode_batches
from tests.integration.test_cluster import TUNING, eventually, running_cluster

FEW = 6
MANY = 150
#: A window long enough for several long polls (replica_fetch_wait_ms is 500 by default).
WINDOW_S = 3.0


@pytest.fixture
def cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    with running_cluster(tmp_path, nats_url, TUNING) as brokers:
        yield brokers


async def metrics(broker: BrokerProcess) -> dict[str, float]:
    """The broker's metrics, a labelled sample by its name and labels (`name{a="b"}`)."""
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def total(brokers: list[BrokerProcess], name: str) -> float:
    values = [(await metrics(b))[name] for b in brokers]
    return sum(values)


async def create(js: Client, first: int, count: int) -> None:
    for i in range(first, first + count):
        await js.create_stream(f"idle-{i}", f"idle.{i}", replication_factor=3)


async def all_in_sync(js: Client, streams: int, brokers: list[BrokerProcess]) -> None:
    async def full() -> bool | None:
        for i in range(streams):
            info = await js.stream_info(f"idle-{i}")
            if len(info.partitions[0].isr) != 3:
                return None
        # Every follower replica is in a session at its leader.
        held = await total(brokers, "jetstream_fetch_session_partitions")
        return True if held == 2 * streams else None
    await eventually(full, f"{streams} streams fully in sync", 120.0)


async def request_rate(brokers: list[BrokerProcess]) -> float:
    """REPLICA_FETCH requests per second, all brokers together, while idle."""
    before = await total(brokers, "jetstream_replica_fetch_requests_total")
    started = time.monotonic()
    await asyncio.sleep(WINDOW_S)  # the measured window itself, not a wait for a condition
    after = await total(brokers, "jetstream_replica_fetch_requests_total")
    return (after - before) / (time.monotonic() - started)


async def test_idle_fetch_requests_do_not_grow_with_partitions(
        cluster: list[BrokerProcess]) -> None:
    brokers = cluster
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await create(js, 0, FEW)
        await all_in_sync(js, FEW, brokers)
        few = await request_rate(brokers)
        await create(js, FEW, MANY - FEW)
        await all_in_sync(js, MANY, brokers)
        many = await request_rate(brokers)
    # 3 brokers x 2 sessions each, one request per 500 ms long poll when idle.
    sessions = await total(brokers, "jetstream_replica_fetchers")
    assert sessions == 6
    bound = sessions * 2 * 1.5 + 2
    assert few <= bound, f"{few:.1f} requests/s between idle brokers with {FEW} partitions"
    assert many <= bound, f"{many:.1f} requests/s between idle brokers with {MANY} partitions"
    # Per-partition fetching would send MANY / FEW times as many.
    assert many <= few * 1.5 + 2, (few, many)


async def test_records_and_the_hw_reach_followers_through_the_session(
        cluster: list[BrokerProcess]) -> None:
    brokers = cluster
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await create(js, 0, 3)
        await all_in_sync(js, 3, brokers)
        # A stream created while the sessions wait at their leaders: its first `all` publish
        # is acked once both followers hold it, well within the long poll's 500 ms.
        await js.create_stream("fresh", "fresh.x", replication_factor=3)
        started = time.monotonic()
        ack = await js.publish("fresh.x", b"first", ack_policy="all")
        first_ack_s = time.monotonic() - started
        assert ack is not None and ack.offset == 0
        for i in range(50):
            await js.publish("idle.1", b"v%d" % i, ack_policy="all")
        # Followers learn the HW from the session: a read at an in-sync follower serves
        # every committed record.
        info = await js.stream_info("idle-1")
        leader = info.partitions[0].leader
        follower = next(b for b in brokers if b.broker_id != leader)

        conn = BrokerConnection(follower.address, client_id="test")
        await conn.open()
        try:
            async def caught_up() -> bool | None:
                _response, payload = await conn.fetch(m.FetchRequest(
                    "idle-1", 0, 0, 1 << 20, 0, read_replica=True))
                records = decode_batches(payload, min_offset=0)
                return True if len(records) == 50 else None
            await eventually(caught_up, "the follower serving all 50 committed records")
        finally:
            await conn.close()
    assert first_ack_s < 5.0, first_ack_s


def segment_files(broker: BrokerProcess, stream: str) -> list[str]:
    return sorted(p.name for p in (broker.data_dir / "logs" / f"{stream}-0").glob("*.log"))


@pytest.fixture
def retaining(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    with running_cluster(tmp_path, nats_url, (*TUNING, "--retention-check-ms", "100")
                         ) as brokers:
        yield brokers


async def test_followers_apply_retention_once_the_leader_did(
        retaining: list[BrokerProcess]) -> None:
    brokers = retaining
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await js.create_stream("short", "short.x", replication_factor=3,
                               segment_bytes_max=4096, retention_messages=100)
        for i in range(400):
            await js.publish("short.x", b"%04d" % i * 50, ack_policy="all")

        async def every_replica_retained() -> bool | None:
            starts = [segment_files(b, "short")[0] for b in brokers]
            counts = [len(segment_files(b, "short")) for b in brokers]
            # Every replica deleted its oldest segments, and keeps about as many as the
            # leader (100 messages of 200 B in 4 KiB segments: ~5 sealed ones, plus one).
            return True if all(s != f"{0:020d}.log" for s in starts) and \
                max(counts) <= 8 else None
        await eventually(every_replica_retained, "every replica applied retention")


async def test_every_partition_is_served_when_its_create_returns(
        cluster: list[BrokerProcess]) -> None:
    """A create returns once each partition's leader broker serves it: a publish to any of
    them right after is acked, never NO_STREAM_FOR_SUBJECT (a leader not subscribed yet).
    Followers whose first fetches find their leader's role still starting (its broker names
    itself the leader) wait for it rather than report it failed: every partition keeps its
    first leader. The leaders started together share the round trips that confirm their
    NATS subscriptions."""
    brokers = cluster
    pings = await total(brokers, "jetstream_roles_nats_confirm_pings_total")
    started = await total(brokers, "jetstream_roles_leaders_started_total")
    async with jetstream.connect(",".join(b.address for b in brokers)) as js:
        await js.create_stream("wide", "wide", partitions=200, replication_factor=3)
        assert await total(brokers, "jetstream_roles_leaders_started_total") - started == 200
        confirmed = await total(brokers, "jetstream_roles_nats_confirm_pings_total") - pings
        assert confirmed < 100, f"{confirmed} round trips confirmed 200 subscriptions"
        first = {p.partition: p.leader_epoch for p in (await js.stream_info("wide")).partitions}
        acks = await js.publish_batch([PublishMessage("wide", b"x", partition=p)
                                       for p in range(200)])
        assert sorted(ack.partition for ack in acks) == list(range(200))
        now = {p.partition: p.leader_epoch for p in (await js.stream_info("wide")).partitions}
    assert now == first
