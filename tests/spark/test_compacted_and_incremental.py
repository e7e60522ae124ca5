"""Reads of a compacted stream's latest state (compacted=latest), before and after the
cleaner's passes, and incremental batch reads that read each record once across runs."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import jetstream.spark
from jetstream.client import Client
from jetstream.client.types import PublishMessage
from jetstream.server.process import BrokerProcess
from tests.integration.test_compaction import wait_for_passes
from tests.spark.helpers import publish, rows_of

KEYS = 40


async def test_compacted_latest_equals_the_latest_value_of_every_key(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=2,
                           cleanup_policy="compact", segment_bytes_max=4096,
                           min_cleanable_dirty_ratio=0.01, delete_retention_ms=0)
    model: dict[bytes, bytes] = {}
    batch = []
    for i in range(1200):
        key = b"k%03d" % (i % KEYS)
        value = b"v%05d" % i
        batch.append(PublishMessage(f"{stream_name}.in", value, key))
        model[key] = value
    for gone in (b"k000", b"k007"):  # tombstones delete keys
        batch.append(PublishMessage(f"{stream_name}.in", None, gone))
        del model[gone]
    await js.publish_batch(batch, window=200)

    def latest() -> dict[bytes, bytes]:
        df = (spark.read.format("jetstream").option("brokers", shared_broker.address)
              .option("stream", stream_name).option("compacted", "latest")
              .schema("key binary, value binary, offset long, partition int").load())
        rows = rows_of(df)
        assert len({r[0] for r in rows}) == len(rows)  # one row per key
        return {r[0]: r[1] for r in rows}

    assert latest() == model
    # A filter on offset applies to the latest rows (Spark's meaning), not before choosing
    # them: a key whose latest record is at or past the cut is absent, not older.
    df = (spark.read.format("jetstream").option("brokers", shared_broker.address)
          .option("stream", stream_name).option("compacted", "latest")
          .schema("key binary, offset long, partition int").load())
    rows = rows_of(df)
    cut = sorted(r[1] for r in rows)[len(rows) // 2]
    assert sorted(rows_of(df.where(F.col("offset") < cut))) == sorted(
        r for r in rows if r[1] < cut)
    await wait_for_passes(shared_broker, stream_name, 1)
    assert latest() == model
    # Files and brokers agree on a compacted stream too.
    via_brokers = (spark.read.format("jetstream").option("brokers", shared_broker.address)
                   .option("stream", stream_name).option("compacted", "latest")
                   .option("readFrom", "brokers").schema("key binary, value binary").load())
    assert dict(rows_of(via_brokers)) == model


async def test_incremental_runs_read_each_record_once(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=2)
    await publish(js, stream_name, 120, partitions=2)
    group = f"{stream_name}-nightly"
    options = {"brokers": shared_broker.address, "stream": stream_name}

    first = jetstream.spark.incremental(spark, group, **options)
    rows = rows_of(first.load("partition int, offset long"))
    assert len(rows) == 120 and first.record_count == 120
    assert rows_of(first.load("partition int, offset long")) == rows  # repeatable
    first.commit()

    await publish(js, stream_name, 30, partitions=2)
    second = jetstream.spark.incremental(spark, group, **options)
    new_rows = rows_of(second.load("partition int, offset long"))
    assert len(new_rows) == 30
    assert not set(new_rows) & set(rows)
    second.commit()
    assert second.ending_offsets == {stream_name: {"0": 75, "1": 75}}
    committed = await js.fetch_offsets(group)
    assert {key: c.offset for key, c in committed.items()} == {
        (stream_name, 0): 75, (stream_name, 1): 75}

    third = jetstream.spark.incremental(spark, group, **options)
    assert third.load().count() == 0
    # option("group") reads from the committed offsets too.
    await publish(js, stream_name, 10, partitions=2)
    df = (spark.read.format("jetstream").options(**options).option("group", group).load())
    assert df.count() == 10
