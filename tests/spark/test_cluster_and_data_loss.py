"""Reads that outlive what they planned against: a partition leader killed while Spark reads
(files of the dead leader and Fetch from the new one give every committed record once), and
a streaming query whose checkpoint points at records retention removed (failOnDataLoss)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

import jetstream
from jetstream.client import Client
from jetstream.server.process import BrokerProcess
from tests.integration.test_cluster import cluster  # noqa: F401 (a fixture)
from tests.spark.helpers import publish, wait_until
from tests.spark.test_streaming_and_writer import run_stream

STREAM = "replicated"


async def test_reads_survive_the_leader_being_killed(spark: SparkSession,
                                                     cluster: list[BrokerProcess]) -> None:  # noqa: F811
    brokers = ",".join(b.address for b in cluster)
    async with jetstream.connect(brokers) as js:
        await js.create_stream(STREAM, f"{STREAM}.in", replication_factor=3, ack_policy="all",
                               segment_bytes_max=16_384)
        await publish(js, STREAM, 3000)
        leader_id = (await js.stream_info(STREAM)).partitions[0].leader
    leader = next(b for b in cluster if b.broker_id == leader_id)

    def read(read_from: str) -> object:
        return (spark.read.format("jetstream").option("brokers", brokers)
                .option("stream", STREAM).option("readFrom", read_from)
                .option("maxRecordsPerPartition", "250")
                .schema("offset long").load().rdd)

    from_files = read("files")
    from_brokers = read("brokers")
    # Planned now (cut at segment boundaries for files): at most 250 offsets a task.
    assert from_files.getNumPartitions() >= 12 and from_brokers.getNumPartitions() >= 12
    leader.stop(signal.SIGKILL)
    # Planned against the dead leader: its files are still there; Fetch finds the new leader.
    offsets_files = sorted(row.offset for row in from_files.collect())
    offsets_brokers = sorted(row.offset for row in from_brokers.collect())
    assert offsets_files == offsets_brokers == list(range(3000))
    # Planned after the failover, through the new leader.
    assert sorted(row.offset for row in read("auto").collect()) == list(range(3000))


async def test_fail_on_data_loss(spark: SparkSession, shared_broker: BrokerProcess, js: Client,
                                 stream_name: str, tmp_path: Path) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", segment_bytes_max=4096,
                           retention_messages=200)
    await publish(js, stream_name, 100)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_stream(spark, shared_broker, stream_name, out, checkpoint, startingOffsets="earliest")
    assert spark.read.parquet(str(out)).count() == 100

    await publish(js, stream_name, 1500)  # retention then drops the checkpoint's offset 100

    async def log_start() -> int:
        return await js.offset_for_timestamp(stream_name, 0, -2)

    start = await wait_until(log_start, lambda s: s > 100)
    with pytest.raises(PySparkException, match=r"DATA_LOSS|is gone"):
        run_stream(spark, shared_broker, stream_name, out, checkpoint)
    run_stream(spark, shared_broker, stream_name, out, checkpoint, failOnDataLoss="false")
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())
    assert offsets[:100] == list(range(100))
    assert offsets[100] >= start and offsets[-1] == 1599
    assert offsets[100:] == list(range(offsets[100], 1600))
