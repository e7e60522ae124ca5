"""A compacted R3 stream on a 3-broker cluster: every replica compacts its own copy, the
leader is killed while the cleaners run, and afterwards every key's latest acked value is
what `get` answers, from the new leader and from each in-sync replica alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import jetstream
from jetstream.client import BrokerConnection, PublishMessage
from jetstream.natsd import restartable_ports
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import TUNING, eventually

DEADLINE_S = 30.0
STREAM, SUBJECT, KEYS = "table", "table.in", 20


@pytest.fixture
def cleaning_cluster(tmp_path: Path, nats_url: str) -> Iterator[list[BrokerProcess]]:
    raft_ports = restartable_ports(3)
    spec = ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(raft_ports))
    brokers = [BrokerProcess(tmp_path / f"broker{i}", nats_url, broker_id=i,
                             extra_args=("--cluster", spec, *TUNING,
                                         "--cleaner-backoff-ms", "50",
                                         "--key-index-interval-ms", "20"))
               for i in range(3)]
    try:
        for broker in brokers:
            broker.start(wait=False)
        for broker in brokers:
            broker.wait_ready(DEADLINE_S)
        yield brokers
    finally:
        for broker in brokers:
            broker.kill()


async def passes(broker: BrokerProcess) -> int | None:
    """Cleaning passes of this broker's replica of partition 0 (None: none yet)."""
    async with httpx.AsyncClient(base_url=broker.http_url, timeout=10) as http:
        partition = (await http.get(f"/streams/{STREAM}")).json()["partitions"][0]
    found = (partition.get("compaction") or {}).get("passes", 0)
    return found if found >= 1 else None


async def replica_get(broker: BrokerProcess, key: bytes, min_offset: int) -> m.GetResponse:
    conn = BrokerConnection(broker.address, client_id="test")
    await conn.open()
    try:
        response = await conn.request(m.GetRequest(STREAM, 0, key, min_offset, 5000,
                                                   read_replica=True))
    finally:
        await conn.close()
    return m.expect_response(response, m.GetResponse)


async def test_failover_while_cleaning_keeps_every_latest_value(
        cleaning_cluster: list[BrokerProcess]) -> None:
    brokers = cleaning_cluster
    addresses = ",".join(b.address for b in brokers)
    async with jetstream.connect(addresses) as js:
        await js.create_stream(STREAM, SUBJECT, cleanup_policy="compact",
                               segment_bytes_max=4096, min_cleanable_dirty_ratio=0.01,
                               delete_retention_ms=0)
        acks = await js.publish_batch(
            [PublishMessage(SUBJECT, b"v%04d" % i, key=b"k%02d" % (i % KEYS))
             for i in range(800)], window=100)
        assert len(acks) == 800
        for broker in brokers:  # every replica compacts its own copy
            await eventually(lambda b=broker: passes(b), f"a pass on broker {broker}")
        leader_id = (await js.stream_info(STREAM)).partitions[0].leader
    brokers[leader_id].kill()
    live = [b for b in brokers if b.running]
    latest: dict[bytes, tuple[bytes, int]] = {}
    async with jetstream.connect(",".join(b.address for b in live)) as js:
        for i in range(800, 860):
            key, value = b"k%02d" % (i % KEYS), b"v%04d" % i

            async def publish(key: bytes = key, value: bytes = value) -> int | None:
                ack = await js.publish(SUBJECT, value, key=key, timeout=2.0)
                return None if ack is None else ack.offset

            latest[key] = (value, await eventually(publish, f"ack of {value!r}"))
        last = max(offset for _value, offset in latest.values())
        for key, (value, offset) in latest.items():
            entry = await js.get(STREAM, key, min_offset=offset)
            assert entry is not None and entry.value == value, key
    # Each surviving replica answers the same, once it has committed the last write.
    deadline = time.monotonic() + DEADLINE_S
    for broker in live:
        for key, (value, _offset) in latest.items():
            while True:
                answer = await replica_get(broker, key, last)
                if answer.found or time.monotonic() > deadline:
                    break
            assert (answer.found, answer.value) == (True, value), (broker, key)
