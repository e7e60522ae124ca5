"""Tiered storage in a cluster: followers keep the fragment index from their own listings,
so a newly elected leader serves reads below its local log start from the store at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

import jetstream
from jetstream.client.connection import BrokerConnection
from jetstream.protocol import messages as m
from jetstream.server.process import BrokerProcess
from jetstream.stream.format import decode_batches
from tests.integration.test_cluster import (
    DEADLINE_S,
    STREAM,
    SUBJECT,
    TUNING,
    by_id,
    eventually,
    partition_state,
    publish_acked,
    running_cluster,
)

SEGMENT_BYTES = 4096
COUNT = 300
LISTINGS = "fragment_listings_total"


async def metric(broker: BrokerProcess, name: str) -> int:
    """The partition-0 value of the metric `jetstream_partition_<name>` (0 when absent)."""
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        text = (await http.get(f"{broker.http_url}/metrics")).text
    pattern = rf'^jetstream_partition_{name}\{{stream="{STREAM}",partition="0"\}} (\d+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return int(found.group(1)) if found else 0


async def extents(broker: BrokerProcess) -> dict[str, Any]:
    async with jetstream.connect(broker.address) as js:
        return (await js.fragments(STREAM, 0))[0]


async def test_a_new_leader_serves_stored_history_at_once(tmp_path: Path,
                                                          nats_url: str) -> None:
    store = f"file://{tmp_path / 'store'}"
    with running_cluster(tmp_path, nats_url, (*TUNING, "--retention-check-ms", "100")
                         ) as brokers:
        async with jetstream.connect(brokers[0].address) as js:
            await js.create_stream(STREAM, SUBJECT, replication_factor=2, min_isr=1,
                                   segment_bytes_max=SEGMENT_BYTES,
                                   tiered={"fragment_store": store,
                                           "local_retention_bytes": 2 * SEGMENT_BYTES})

        async def two_in_sync() -> dict[str, Any] | None:
            state = await partition_state(next(b for b in brokers if b.running))
            return state if len(state["isr"]) == 2 else None

        state = await eventually(two_in_sync, "both replicas in sync")
        sent = [b"value-%05d-" % i + b"x" * 150 for i in range(COUNT)]
        await publish_acked(brokers, sent)
        leader = by_id(brokers, state["leader"])
        follower = by_id(brokers, next(r for r in state["replicas"] if r != leader.broker_id))

        async def offloaded() -> bool | None:
            e = await extents(leader)
            return True if e["local_log_start_offset"] >= COUNT // 2 else None

        await eventually(offloaded, "history offloaded, local segments deleted", 60.0)
        # The leader fails over to the follower (whose disk holds everything) and comes
        # back as its follower (out of the ISR at the failover, in again once caught up):
        # its own log still starts above the stored start.
        leader.kill()
        await eventually(lambda: leads(follower, follower), "the follower elected leader")
        leader.start()
        await eventually(two_in_sync, "the old leader back in sync", 60.0)

        async def listed() -> int | None:
            return await metric(leader, LISTINGS) or None

        listed_while_following = await eventually(listed, "the old leader listed the store")
        follower.kill()
        await eventually(lambda: leads(leader, leader), "the old leader elected again")
        new = leader
        conn = BrokerConnection(new.address, client_id="test")
        await conn.open()
        try:
            async def first_read() -> list[bytes] | None:
                _, payload = await conn.fetch(m.FetchRequest(STREAM, 0, 0, 1 << 20, 0))
                records = decode_batches(payload, min_offset=0)
                return [r.value or b"" for r in records] or None

            first = await eventually(first_read, "a read of offset 0 from the new leader")
        finally:
            await conn.close()
        # Served from the store with the index listed while following: no listing since.
        assert await metric(new, LISTINGS) == listed_while_following
        assert await metric(new, "fragment_store_reads_total") >= 1
        assert first == sent[:len(first)]
        e = await extents(new)
        assert e["local_log_start_offset"] > 0 and e["stored_start_offset"] == 0
        async with jetstream.connect(new.address) as js:
            got: list[bytes] = []
            while len(got) < COUNT:
                result = await js.fetch(STREAM, 0, len(got), max_bytes=64 * 1024)
                got += [msg.value for msg in result.messages]
        assert got == sent


async def leads(asked: BrokerProcess, broker: BrokerProcess) -> dict[str, Any] | None:
    state = await partition_state(asked)
    return state if state["leader"] == broker.broker_id else None
