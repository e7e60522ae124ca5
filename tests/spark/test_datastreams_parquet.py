"""A `parquet` datastream's files, read back by Spark, equal the stream as the Jetstream
Spark source reads it (the sink writing through the object store layer, `file://`)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from jetstream.client import Client
from jetstream.datastreams.parquet_sink import read_manifest
from jetstream.server.process import BrokerProcess
from tests.spark.helpers import publish, rows_of, stored, wait_until

COLUMNS = ("stream", "partition", "offset", "timestamp", "key", "value", "headers")


async def test_parquet_files_equal_the_stream_in_spark(
        spark: SparkSession, shared_broker: BrokerProcess, js: Client, stream_name: str,
        tmp_path: Path) -> None:
    await js.create_stream(stream_name, f"{stream_name}.in", partitions=2)
    await publish(js, stream_name, 240, partitions=2)
    expected = await stored(js, stream_name, 2)
    lake = f"file://{tmp_path}/lake"
    await js.create_datastream(
        f"lake-{stream_name}", {"type": "jetstream", "settings": {"stream": stream_name}},
        {"type": "parquet", "settings": {"path": lake, "file_rows_max": 50, "roll_ms": 200}},
        max_tasks=2)

    async def ends() -> list[int]:
        return [(read_manifest(lake, p) or [{"end_offset": -1}])[-1]["end_offset"]
                for p in (0, 1)]

    await wait_until(ends, lambda found: found == [120, 120], deadline_s=60.0)
    files = spark.read.parquet(f"{tmp_path}/lake").withColumnRenamed("source", "stream") \
        .withColumnRenamed("timestamp_ms", "timestamp").select(*COLUMNS)
    source = spark.read.format("jetstream").option("brokers", shared_broker.address) \
        .option("stream", stream_name).load().select(*COLUMNS)
    from_files, from_stream = rows_of(files), rows_of(source)
    assert len(from_files) == 240
    assert from_files == from_stream
    assert from_files == [(r[0], r[1], r[2], r[3], r[5], r[6], r[7]) for r in expected]
    assert sum(f["rows"] for p in (0, 1) for f in read_manifest(lake, p)) == 240
    await js.delete_datastream(f"lake-{stream_name}")
