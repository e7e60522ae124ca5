"""A datastream in `mirror` mode between two single-broker clusters (each its own
nats-server): the destination is its source batch for batch — offsets, timestamps, keys,
values, headers and subjects, a compacted source's gaps included — across a SIGKILL of the
broker running the task; it refuses every other write with its stable codes (a publish,
a copy of another source, a gap, an older task epoch) and says what it mirrors."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import jetstream
from jetstream.client import Client, PublishMessage
from jetstream.errors import MirrorFenced, MirrorMismatch, MirrorOffsetGap, StreamIsMirror
from jetstream.natsd import NatsServer
from jetstream.server.process import BrokerProcess
from jetstream.stream.format import Record, encode_batch
from tests.integration.test_datastreams import eventually

BATCH_BYTES = 1 << 20


@pytest.fixture
def source(tmp_path: Path) -> Iterator[BrokerProcess]:
    """The source cluster: its own nats-server and a broker whose cleaner runs often."""
    with NatsServer(tmp_path / "nats-src") as nats:
        process = BrokerProcess(tmp_path / "broker-src", nats.url,
                                extra_args=("--cleaner-backoff-ms", "50"))
        try:
            yield process.start()
        finally:
            process.stop()


def mirror(source: BrokerProcess, stream: str, **options: Any) -> dict[str, Any]:
    return {"source": {"type": "jetstream", "settings": {"brokers": source.address,
                                                         "stream": stream}},
            "destination": {"type": "jetstream", "settings": {"stream": stream,
                                                              "mode": "mirror"}},
            **options}


async def everything(js: Client, stream: str, partition: int) -> list[tuple[Any, ...]]:
    """Every committed record of the partition as (offset, timestamp, value, key, headers,
    subject)."""
    end = (await js.partition_status(stream, partition)).high_watermark or 0
    out: list[tuple[Any, ...]] = []
    offset = 0
    while offset < end:
        result = await js.fetch(stream, partition, offset, max_bytes=BATCH_BYTES)
        out.extend((m.offset, m.timestamp_ms, m.value, m.key, dict(m.headers), m.subject)
                   for m in result.messages)
        offset = result.next_offset
    return out


async def equal_ends(source: Client, destination: Client, stream: str,
                     partitions: int) -> None:
    async def caught_up() -> bool | None:
        for p in range(partitions):
            theirs = await source.partition_status(stream, p)
            ours = await destination.partition_status(stream, p)
            if (ours.high_watermark, ours.log_end_offset) != \
                    (theirs.high_watermark, theirs.log_end_offset):
                return None
        return True

    await eventually(caught_up, f"{stream} mirrored to the source's end")
    for p in range(partitions):
        assert await everything(destination, stream, p) == await everything(source, stream, p)


async def publish(js: Client, stream: str, first: int, count: int, partitions: int) -> None:
    await js.publish_batch([PublishMessage(
        stream, b"value %d" % i, key=b"k%d" % (i % 7), headers={"n": str(i).encode()},
        partition=i % partitions) for i in range(first, first + count)], window=500)


@contextlib.asynccontextmanager
async def clients(*brokers: BrokerProcess) -> AsyncIterator[list[Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(jetstream.connect(b.address)) for b in brokers]


async def test_a_mirror_is_its_source_and_refuses_other_writes(
        source: BrokerProcess, broker: BrokerProcess) -> None:
    async with clients(source, broker) as (src, dst):
        await src.create_stream("orders", "orders", partitions=2)
        await dst.create_stream("orders", "orders.copy", partitions=2)
        await publish(src, "orders", 0, 400, 2)
        await src.create_stream("table", "table", cleanup_policy="compact",
                                segment_bytes_max=4096, min_cleanable_dirty_ratio=0.01,
                                delete_retention_ms=0)
        await dst.create_stream("table", "table", cleanup_policy="compact")
        await src.publish_batch([PublishMessage("table", b"v%05d" % i, key=b"k%02d" % (i % 20))
                                 for i in range(1500)], window=500)
        await src.delete("table", b"k00")

        async def compacted() -> bool | None:  # some batches emptied or thinned
            records = await everything(src, "table", 0)
            return True if len(records) < 1501 else None

        await eventually(compacted, "the source's cleaner compacted the table")
        for stream in ("orders", "table"):
            definition = mirror(source, stream)
            await dst.create_datastream(f"{stream}-dr", definition["source"],
                                        definition["destination"], max_tasks=2)
        await equal_ends(src, dst, "orders", 2)
        await equal_ends(src, dst, "table", 1)
        table = await everything(dst, "table", 0)
        offsets = [r[0] for r in table]
        assert offsets != list(range(len(offsets)))  # the compacted source's gaps are kept

        # Records published while the mirror runs follow.
        await publish(src, "orders", 400, 200, 2)
        await equal_ends(src, dst, "orders", 2)

        # It says what it mirrors, and refuses every other write.
        info = await dst.stream_info("orders")
        assert info.mirror == f"{source.address}/orders"
        with pytest.raises(StreamIsMirror) as refused:
            await dst.publish("orders.copy", b"not from the source")
        assert refused.value.code == "STREAM_IS_MIRROR"
        with pytest.raises(StreamIsMirror):
            await dst.publish_batch([PublishMessage("orders.copy.1", b"x")])

        end = (await dst.partition_status("orders", 0)).log_end_offset or 0
        _, held = await src.fetch_batches("orders", 0, 0, max_bytes=BATCH_BYTES)
        with pytest.raises(MirrorMismatch) as foreign:
            await dst.append_copied("orders", 0, held, source="elsewhere/orders", owner="x",
                                    epoch=0)
        assert foreign.value.code == "MIRROR_MISMATCH"
        again = await dst.append_copied("orders", 0, held, source=info.mirror or "",
                                        owner="a retry", epoch=0)
        assert (again.appended_records, again.log_end_offset) == (0, end)
        gap = encode_batch(end + 10, 0, [Record(b"late", b"k")], int(time.time() * 1000))
        with pytest.raises(MirrorOffsetGap) as gapped:
            await dst.append_copied("orders", 0, gap, source=info.mirror or "",
                                    owner="a retry", epoch=0)
        assert gapped.value.fields["log_end_offset"] == end
        with pytest.raises(MirrorFenced):  # the running task's epoch is newer
            await dst.append_copied("orders", 0, gap, source=info.mirror or "",
                                    owner="orders-dr", epoch=0)
        assert (await dst.partition_status("orders", 0)).log_end_offset == end

        # A destination holding records that is not this mirror: the task is faulty.
        await dst.create_stream("busy", "busy", partitions=2)
        await dst.publish("busy", b"mine")
        definition = mirror(source, "orders")
        definition["destination"]["settings"]["stream"] = "busy"
        await dst.create_datastream("busy-dr", definition["source"],
                                    definition["destination"])

        async def faulty() -> str | None:
            found = await dst.datastream_diagnostics("busy-dr")
            errors = [t.get("last_error", "") for t in found["tasks"]]
            return next((e for e in errors if "MirrorMismatch" in e), None)

        assert "not empty" in await eventually(faulty, "busy-dr faulty")
        assert (await dst.stream_info("busy")).mirror is None


async def test_a_mirror_copies_exactly_once_across_a_sigkill(
        source: BrokerProcess, broker: BrokerProcess) -> None:
    async with clients(source) as (src,):
        await src.create_stream("orders", "orders", partitions=2)
        await publish(src, "orders", 0, 20_000, 2)
    async with clients(broker) as (dst,):
        await dst.create_stream("orders", "orders", partitions=2)
        definition = mirror(source, "orders")
        await dst.create_datastream("orders-dr", definition["source"],
                                    definition["destination"], max_tasks=1)

        async def copying() -> bool | None:
            ends = [(await dst.partition_status("orders", p)).log_end_offset or 0
                    for p in (0, 1)]
            return True if sum(ends) > 0 else None

        await eventually(copying, "the mirror started copying")
    await asyncio.to_thread(broker.kill)  # the broker running the task, mid-copy
    await asyncio.to_thread(broker.start)
    async with clients(source, broker) as (src, dst):
        await publish(src, "orders", 20_000, 2000, 2)
        await equal_ends(src, dst, "orders", 2)
        for p in (0, 1):
            assert (await dst.partition_status("orders", p)).log_end_offset == 11_000
