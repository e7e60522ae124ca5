"""Structured Streaming from a stream (new data, restarts from the checkpoint, progress
committed to a consumer group) and writing DataFrames to streams (batch and streaming)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from jetstream.client import Client
from jetstream.idempotence.headers import PRODUCER
from jetstream.server.process import BrokerProcess
from tests.spark.helpers import publish, rows_of, stored


def run_stream(spark: SparkSession, broker: BrokerProcess, stream: str, out: Path,
               checkpoint: Path, **options: str) -> None:
    """One run of a streaming query writing Parquet, until it has processed what is there."""
    source = (spark.readStream.format("jetstream").option("brokers", broker.address)
              .option("stream", stream))
    for name, value in options.items():
        source = source.option(name, value)
    df = source.load().select("partition", "offset", "value")
    query = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()


async def test_a_streaming_query_reads_new_data_and_resumes_from_its_checkpoint(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        tmp_path: Path) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=2)
    await publish(js, stream_name, 100, partitions=2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    group = f"{stream_name}-spark"
    run_stream(spark, shared_broker, stream_name, out, checkpoint,
               startingOffsets="earliest", maxOffsetsPerTrigger="30", group=group)
    assert spark.read.parquet(str(out)).count() == 100
    committed = await js.fetch_offsets(group)
    assert sum(c.offset for c in committed.values()) == 100  # the group shows the progress

    await publish(js, stream_name, 40, partitions=2)
    run_stream(spark, shared_broker, stream_name, out, checkpoint, group=group)
    rows = rows_of(spark.read.parquet(str(out)).select("partition", "offset"))
    assert len(rows) == 140 and len(set(rows)) == 140  # each record once
    expected = [(r[1], r[2]) for r in await stored(js, stream_name, 2)]
    assert rows == expected


async def test_write_then_read_round_trips(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=3)
    data = [(f"v{i}".encode(), f"k{i}".encode() if i % 4 else None,
             {"n": str(i).encode()} if i % 2 else {}, i % 3) for i in range(300)]
    df = spark.createDataFrame(
        data, "value binary, key binary, headers map<string,binary>, partition int")
    (df.write.format("jetstream").option("brokers", shared_broker.address)
     .option("stream", stream_name).mode("append").save())
    back = (spark.read.format("jetstream").option("brokers", shared_broker.address)
            .option("stream", stream_name).load()
            .select("value", "key", "headers", "partition"))
    rows = rows_of(back)
    # Idempotent by default: each record carries its producer stamp (a reserved header).
    assert all(PRODUCER in headers for _v, _k, headers, _p in rows)
    unstamped = [(v, k, {n: h for n, h in headers.items() if n != PRODUCER}, p)
                 for v, k, headers, p in rows]
    assert sorted(unstamped, key=repr) == sorted(data, key=repr)

    # String columns are written as UTF-8; a partition column is honoured.
    text = spark.createDataFrame([("hello", "k", 1)], "value string, key string, partition int")
    (text.write.format("jetstream").option("brokers", shared_broker.address)
     .option("stream", stream_name).mode("append").save())
    found = await js.fetch(stream_name, 1, 100, max_wait_ms=0)
    assert [(m.value, m.key) for m in found.messages] == [(b"hello", b"k")]

    bad = spark.createDataFrame([(1, "x")], "amount int, value string")
    with pytest.raises(PySparkException, match=r"UNWRITABLE_SCHEMA|does not map"):
        (bad.write.format("jetstream").option("brokers", shared_broker.address)
         .option("stream", stream_name).mode("append").save())
    with pytest.raises(PySparkException, match=r"UNKNOWN_STREAM|nowhere"):
        (text.write.format("jetstream").option("brokers", shared_broker.address)
         .option("stream", "nowhere").mode("append").save())


async def test_a_streaming_query_writes_to_a_stream(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        tmp_path: Path) -> None:
    source, sink = f"{stream_name}src", f"{stream_name}dst"
    await js.create_stream(source, f"{source}.in", partitions=2)
    await js.create_stream(sink, f"{sink}.in")
    await publish(js, source, 50, partitions=2)
    df = (spark.readStream.format("jetstream").option("brokers", shared_broker.address)
          .option("stream", source).option("startingOffsets", "earliest").load()
          .selectExpr("key", "concat(value, cast('!' as binary)) as value"))
    query = (df.writeStream.format("jetstream").option("brokers", shared_broker.address)
             .option("stream", sink).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        # A second micro-batch: its rows are not taken for retries of the first batch's
        # (its tasks number their partitions from 0 again).
        await publish(js, source, 30, partitions=2)
        query.processAllAvailable()
    finally:
        query.stop()
    written = await stored(js, sink, 1)
    originals = await stored(js, source, 2)
    assert len(originals) == 80
    assert sorted(r[6] for r in written) == sorted(r[6] + b"!" for r in originals)
    assert len({r[7][PRODUCER].split(b":", 2)[2] for r in written}) >= 2  # two sessions


async def test_a_write_stamps_each_row_once(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=2)
    df = spark.createDataFrame([(f"v{i}".encode(), i % 2) for i in range(200)],
                               "value binary, partition int").repartition(3)
    (df.write.format("jetstream").option("brokers", shared_broker.address)
     .option("stream", stream_name).mode("append").save())
    records = await stored(js, stream_name, 2)
    assert sorted(r[6] for r in records) == sorted(f"v{i}".encode() for i in range(200))
    stamps = [r[7]["Jetstream-Producer"] for r in records]
    # (epoch, sequence, producer) once per row of each stream partition
    assert len({(r[1], r[7]["Jetstream-Producer"]) for r in records}) == 200
    assert {s.split(b":", 2)[2].rsplit(b"-", 1)[0] for s in stamps} == {
        stamps[0].split(b":", 2)[2].rsplit(b"-", 1)[0]}  # one write, one session per task
