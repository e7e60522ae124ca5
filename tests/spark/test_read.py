"""Batch reads through `format("jetstream")` against a real broker: every column equals what
was published, from segment files and from brokers alike; narrow schemas; offsets, timestamps
and pushed-down filters; selectors; committed data only; clear errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from tests.spark.helpers import COLUMNS, publish, rows_of, stored

SEGMENT_BYTES = 4096


def reader(spark: SparkSession, broker: BrokerProcess, stream: str, **options: str):  # type: ignore[no-untyped-def]
    read = spark.read.format("jetstream").option("brokers", broker.address)
    read = read.option("stream", stream)
    for name, value in options.items():
        read = read.option(name, value)
    return read


async def make_stream(js: Client, name: str, partitions: int = 3, **options: object) -> None:
    await js.create_stream(name, f"{name}.in", partitions=partitions,
                           segment_bytes_max=SEGMENT_BYTES, **options)  # type: ignore[arg-type]


async def test_files_and_brokers_read_what_was_published(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await make_stream(js, stream_name)
    await publish(js, stream_name, 900, partitions=3)
    expected = await stored(js, stream_name, 3)
    assert len(expected) == 900

    # Small splits: each partition is read by several tasks, cut inside segments too.
    files = reader(spark, shared_broker, stream_name, maxRecordsPerPartition="70").load()
    assert files.columns == list(COLUMNS)
    assert rows_of(files) == expected
    brokers = reader(spark, shared_broker, stream_name, readFrom="brokers").load()
    assert rows_of(brokers) == expected
    forced = reader(spark, shared_broker, stream_name, readFrom="files").load()
    assert rows_of(forced) == expected


async def test_a_narrow_schema_reads_only_its_columns(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await make_stream(js, stream_name, partitions=2)
    await publish(js, stream_name, 300, partitions=2)
    expected = [(r[1], r[2], r[5]) for r in await stored(js, stream_name, 2)]
    df = reader(spark, shared_broker, stream_name).schema(
        "partition int, offset long, key binary").load()
    assert df.columns == ["partition", "offset", "key"]
    assert rows_of(df) == expected

    with pytest.raises(PySparkException, match=r"INVALID_SPARK_OPTION|no column"):
        reader(spark, shared_broker, stream_name).schema("nope int").load().collect()


async def test_offsets_timestamps_and_pushed_filters(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await make_stream(js, stream_name, partitions=2)
    await publish(js, stream_name, 200, partitions=2)
    first_half = await stored(js, stream_name, 2)
    await asyncio.sleep(0.02)  # the second half's timestamps are later
    await publish(js, stream_name, 200, partitions=2)
    rows = await stored(js, stream_name, 2)
    cut_ms = max(r[3] for r in first_half) + 1

    ranged = reader(spark, shared_broker, stream_name,
                    startingOffsets=json.dumps({stream_name: {"0": 10, "1": -2}}),
                    endingOffsets=json.dumps({stream_name: {"0": 50}})).load()
    assert rows_of(ranged) == [r for r in rows if (r[1] == 0 and 10 <= r[2] < 50) or r[1] == 1]

    since = reader(spark, shared_broker, stream_name, startingTimestamp=str(cut_ms)).load()
    assert rows_of(since) == [r for r in rows if r[3] >= cut_ms]

    df = reader(spark, shared_broker, stream_name).load()
    filtered = df.where((F.col("partition") == 1) & (F.col("offset") >= 20)
                        & (F.col("offset") < 40))
    assert rows_of(filtered) == [r for r in rows if r[1] == 1 and 20 <= r[2] < 40]
    later = df.where(F.col("timestamp") >= datetime.fromtimestamp(cut_ms / 1000))
    assert rows_of(later) == [r for r in rows if r[3] >= cut_ms]
    plan = filtered._jdf.queryExecution().executedPlan().toString()
    assert re.search(r"\bFilter \(", plan) is None, plan  # the source took every filter

    with pytest.raises(PySparkException, match=r"OFFSET_OUT_OF_RANGE|outside the readable"):
        reader(spark, shared_broker, stream_name,
               endingOffsets=json.dumps({stream_name: {"0": 10_000}})).load().collect()


async def test_a_selector_reads_every_matching_stream(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    team = stream_name  # a label value no other test uses
    names = [f"{stream_name}a", f"{stream_name}b", f"{stream_name}c"]
    for name, tier in zip(names, ("gold", "gold", "bronze"), strict=True):
        await js.create_stream(name, f"{name}.in", labels={"team": team, "tier": tier})
        await publish(js, name, 20)
    df = (spark.read.format("jetstream").option("brokers", shared_broker.address)
          .option("selector", f"team={team},tier=gold").load())
    counts = {row["stream"]: row["count"] for row in df.groupBy("stream").count().collect()}
    assert counts == {names[0]: 20, names[1]: 20}

    with pytest.raises(PySparkException, match=r"UNKNOWN_STREAM|no-such-stream"):
        reader(spark, shared_broker, "no-such-stream").load().collect()


async def test_only_committed_records_are_read_while_publishers_run(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await make_stream(js, stream_name, partitions=2, ack_policy="all")
    stop = threading.Event()

    async def keep_publishing() -> None:
        i = 0
        while not stop.is_set():
            await publish(js, stream_name, 50, partitions=2)
            i += 1
            await asyncio.sleep(0)

    publisher = asyncio.create_task(keep_publishing())
    try:
        await asyncio.sleep(0.3)
        for _ in range(2):
            df = reader(spark, shared_broker, stream_name).schema(
                "partition int, offset long").load()
            stats = await asyncio.to_thread(
                lambda df=df: df.groupBy("partition").agg(F.count("*").alias("n"),
                                                           F.max("offset").alias("last"))
                .collect())
            for row in stats:
                assert row["n"] == row["last"] + 1  # no gap, no duplicate
                hw = await js.offset_for_timestamp(stream_name, row["partition"], -1)
                assert row["last"] < hw
    finally:
        stop.set()
        await publisher


async def test_spark_finds_the_source_without_registering_it(
        shared_broker: BrokerProcess, js: Client, stream_name: str) -> None:
    await make_stream(js, stream_name, partitions=1)
    await publish(js, stream_name, 25)
    script = (
        "import os, sys\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[1]')\n"
        "         .config('spark.driver.host', '127.0.0.1')\n"
        "         .config('spark.driver.bindAddress', '127.0.0.1')\n"
        "         .config('spark.ui.enabled', 'false').getOrCreate())\n"
        "df = spark.read.format('jetstream').option('brokers', sys.argv[1])\n"
        "print('rows', df.option('stream', sys.argv[2]).load().count())\n"
        "spark.stop()\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script, shared_broker.address, stream_name],
        env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 25" in done.stdout
