"""`jetstream.spark.read`: a stream whose history is in Parquet fragments (a real broker
offloading to a `file://` store) read as one DataFrame — Parquet pieces through Spark's
native reader, the live tail through the source — equals a read through the broker, row for
row; history that left the broker's disk is read from Parquet. On moto's S3, segment
fragments are read straight from the store by the source's tasks (readFrom files), and so
are Parquet fragments (Spark has no S3 file system without hadoop-aws): the same rows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from pyspark.sql import SparkSession

import jetstream.spark
from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from jetstream.spark import store_read
from jetstream.spark.options import parse_read_options
from jetstream.spark.source import options_of
from jetstream.tiered.local_s3 import LocalS3
from tests.spark.helpers import COLUMNS, publish, rows_of, stored, wait_until

SEGMENT_BYTES = 4096


async def parquet_end(js: Client, stream: str) -> list[int]:
    """Per partition, where the Parquet fragments from offset 0 end without a gap."""
    ends = []
    for entry in await js.fragments(stream):
        at = 0
        for f in sorted((f for f in entry["fragments"] if f["format"] == "parquet"),
                        key=lambda f: f["begin"]):
            if f["begin"] <= at < f["end"]:
                at = f["end"]
        ends.append(at)
    return ends


async def store_reads(broker: BrokerProcess, stream: str) -> int:
    """How many reads the broker served from its fragment store for the stream."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{broker.http_url}/metrics")).text
    found = re.search(rf'^jetstream_partition_fragment_store_reads_total\{{stream="{stream}",'
                      r'partition="0"\} (\d+)$', text, re.MULTILINE)
    assert found is not None
    return int(found.group(1))


async def make_stream(js: Client, name: str, store: Path, partitions: int,
                      **tiered: Any) -> None:
    await js.create_stream(name, f"{name}.in", partitions=partitions,
                           segment_bytes_max=SEGMENT_BYTES,
                           tiered={"fragment_store": f"file://{store}", **tiered})


async def test_parquet_history_and_live_tail_equal_a_read_through_the_broker(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        tmp_path: Path) -> None:
    await make_stream(js, stream_name, tmp_path / "store", 2, fragment_format="both")
    await publish(js, stream_name, 800, partitions=2)
    await wait_until(lambda: parquet_end(js, stream_name), lambda ends: min(ends) >= 200,
                     deadline_s=60)
    await publish(js, stream_name, 60, partitions=2)  # a live tail past the fragments
    expected = await stored(js, stream_name, 2)
    assert len(expected) == 860
    options = {"brokers": shared_broker.address, "stream": stream_name}

    planned = store_read.plan(parse_read_options(options_of(options)))
    assert {(p.stream, p.partition, p.start) for p in planned.store.pieces} == {
        (stream_name, 0, 0), (stream_name, 1, 0)}
    assert all(p.urls and all(u.endswith(".parquet") for u in p.urls)
               for p in planned.store.pieces)
    assert all(start < end for start, end in planned.store.tail.values())  # a tail each
    assert all(p.end == planned.store.tail[(p.stream, p.partition)][0]
               for p in planned.store.pieces)

    df = jetstream.spark.read(spark, **options)
    assert df.columns == list(COLUMNS)
    through_broker = spark.read.format("jetstream").options(**options) \
        .option("readFrom", "brokers").load()
    assert rows_of(df) == rows_of(through_broker) == expected
    assert rows_of(jetstream.spark.read(spark, parquet=False, **options)) == expected
    # Fixed at planning: what is published after a read was planned is not in it.
    await publish(js, stream_name, 20, partitions=2)
    assert rows_of(df) == expected


async def test_history_gone_from_the_disk_is_read_from_parquet(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        tmp_path: Path) -> None:
    await make_stream(js, stream_name, tmp_path / "store", 1, fragment_format="both",
                      fragment_compression="zstd", local_retention_bytes=1)
    await publish(js, stream_name, 500)
    extents = await wait_until(lambda: js.fragments(stream_name),
                               lambda e: e[0]["local_log_start_offset"] >= 200, deadline_s=60)
    local_start = extents[0]["local_log_start_offset"]
    expected = await stored(js, stream_name, 1)  # the client reads below it from the store
    assert [r[2] for r in expected] == list(range(500))
    options = {"brokers": shared_broker.address, "stream": stream_name}
    df = jetstream.spark.read(spark, **options)
    assert rows_of(df) == expected
    # More history leaves the disk after planning: the planned tail is read from the store
    # through the broker, the same rows.
    await publish(js, stream_name, 300)
    await wait_until(lambda: js.fragments(stream_name),
                     lambda e: e[0]["local_log_start_offset"] >= 500, deadline_s=60)
    assert rows_of(df) == expected
    # The source alone starts at the broker's local log start (which offload may move on).
    everything = await stored(js, stream_name, 1)
    source = rows_of(spark.read.format("jetstream").options(**options).load())
    assert source[0][2] >= local_start and source == everything[source[0][2]:]
    assert rows_of(jetstream.spark.read(spark, **options)) == everything
    # A start by time found in the store: the source Fetches below its files (the leader
    # serves them from the store).
    wanted = everything[10][3]
    first = min(r[2] for r in everything if r[3] >= wanted)
    by_time = spark.read.format("jetstream").options(**options) \
        .option("startingTimestamp", str(wanted)).load()
    assert first <= 10 and rows_of(by_time) == everything[first:]
    # Explicit offsets below the local log start come from Parquet too.
    part = jetstream.spark.read(spark, startingOffsets={stream_name: {"0": 10}},
                                endingOffsets={stream_name: {"0": 450}}, **options)
    assert rows_of(part) == [r for r in expected if 10 <= r[2] < 450]


async def test_fragments_on_s3_are_read_straight_from_the_store(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        local_s3: LocalS3) -> None:
    bucket = local_s3.create_bucket(f"spark-{stream_name}")
    await js.create_stream(stream_name, f"{stream_name}.in", segment_bytes_max=SEGMENT_BYTES,
                           tiered={"fragment_store": f"{bucket}/history",
                                   "fragment_format": "both", "fragment_compression": "zstd",
                                   "local_retention_bytes": 1})
    await publish(js, stream_name, 400)
    await wait_until(lambda: js.fragments(stream_name),
                     lambda e: e[0]["local_log_start_offset"] >= 200, deadline_s=60)
    await publish(js, stream_name, 30)  # a live tail on the broker's disk
    # Every sealed segment offloaded and gone from the disk: nothing moves after planning.
    await wait_until(lambda: js.list_segments(stream_name, 0),
                     lambda listing: len(listing.segments) == 1, deadline_s=60)
    expected = await stored(js, stream_name, 1)  # through the broker, from the store below
    assert [r[2] for r in expected] == list(range(430))
    options = {"brokers": shared_broker.address, "stream": stream_name}

    # Segment fragments: tasks download them with the store library, SHA-256 checked.
    segments = store_read.plan(parse_read_options(options_of(
        {**options, "readFrom": "files"})), parquet=False)
    from_store = [t for t in segments.tail_tasks if t.fragments is not None]
    assert from_store and from_store[0].start == 0
    assert all(t.fragments.store.startswith("s3://") for t in from_store)  # type: ignore[union-attr]
    df = jetstream.spark.read(spark, parquet=False, readFrom="files", **options)
    served = await store_reads(shared_broker, stream_name)
    assert rows_of(df) == expected
    assert await store_reads(shared_broker, stream_name) == served  # none via the broker
    # Parquet fragments on s3://: Spark's own reader has no S3 file system here, so the
    # source's tasks read them with pyarrow.
    assert not store_read.native_parquet(spark, "s3a")
    planned = store_read.plan(parse_read_options(options_of(options)))
    assert planned.store.pieces and planned.store.pieces[0].start == 0
    assert rows_of(jetstream.spark.read(spark, **options)) == expected
    # Through the broker alone (Fetch below the local log start): the same rows.
    assert rows_of(jetstream.spark.read(spark, parquet=False, readFrom="brokers",
                                        **options)) == expected
    assert await store_reads(shared_broker, stream_name) > served
