"""Spark reading and writing Jetstream streams, beside Spark's own Parquet reader and writer.

Theory of operation
- Data: `records` records of a 128 B value and an 8 B key in one partition of a stream on one
  broker, published with the pipelined raw NATS publisher (bench.common) and acked before
  anything is timed. Spark's parallelism comes from splitting the partition (500,000 offsets
  a task). The same rows (partition, offset, timestamp, key, value) are decoded from the
  segment files in this process (the decoder's one-core rate) and written to a Parquet file
  with pyarrow (snappy): the baseline a Spark user would otherwise read.
- Spark: local[2] in this process, Python workers on this interpreter. Every Spark figure is
  the median of `repeats` runs, after one untimed run, of an action that materialises every
  row and column it reads (`write.format("noop")`), so only the reading is timed.
  - files: format("jetstream") with the Parquet file's five columns, read from segment files.
  - parquet: Spark's native (vectorised) Parquet reader, same columns.
  - narrow: a user schema of `partition, offset, key`, against the full read of all columns.
  - filter 1 %: `partition = 0 AND offset` in a range holding 1 % of the partition, against
    reading the whole partition (both pushed down).
  - arrow ceiling: a Python data source that yields ready-made Arrow batches of the same
    shape (no decoding at all): the Python-to-JVM transfer this source cannot beat. It is this
    read's load generator: files/ceiling near 1 means decoding costs little beside transfer.
  - writer: `write_rows` rows (value, key) from the Parquet file, in 2 Spark partitions,
    written to a 2-partition stream with format("jetstream") (acked, the stream's ack policy
    `leader`), against Spark writing them
    to Parquet, and against the no-op sink (the load generator: Spark producing the rows;
    it must run >= 2x faster than the writer for the writer figure to be the writer's).
- The Python client: one asyncio client fetching every record of both partitions.
- CPU per row: utime+stime of this process and all its descendants (the Spark JVM, its
  Python workers, the broker), counting children that exited.

Run from the repository root: `python -m bench.spark [--quick] [--json]`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import jetstream
from bench.common import JsonObject, Message, bench_main, publish_pipelined
from jetstream.natsd import NatsServer
from jetstream.protocol.envelope import encode_envelope
from jetstream.server.process import BrokerProcess
from jetstream.spark.segment_reader import FileSplit, SegmentFile, read_split
from jetstream.stream.segment import log_file_name

# One partition: Spark's parallelism comes from splitting it (maxRecordsPerPartition).
STREAM, PARTITIONS = "bench", 1
WRITTEN_PARTITIONS = 2
VALUE = b"v" * 128
FIVE_COLUMNS = "partition int, offset long, timestamp timestamp, key binary, value binary"
FIVE_COLUMN_NAMES = ("partition", "offset", "timestamp", "key", "value")
PUBLISH_CHUNK = 250_000


@dataclass(frozen=True, slots=True)
class Plan:
    records: int
    write_rows: int
    repeats: int
    window: int = 5000


FULL = Plan(5_000_000, 1_000_000, 3)
QUICK = Plan(400_000, 100_000, 3)


def tree_cpu_seconds() -> float:
    """CPU of this process and every descendant (live ones, and exited ones through their
    parents' cutime/cstime)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / tick
    mine = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in mine} - mine
        grew = bool(found)
        mine |= found
    return sum(times[pid] for pid in mine)


def messages(start: int, count: int) -> list[Message]:
    return [(f"{STREAM}.in" if i % PARTITIONS == 0 else f"{STREAM}.in.{i % PARTITIONS}",
             encode_envelope(VALUE, b"k%07d" % i), None) for i in range(start, start + count)]


def timed(action: Callable[[], object], repeats: int, rows: int) -> JsonObject:
    """The median seconds of `repeats` runs of `action` after one untimed run (Spark's
    code generation and JIT, Python workers' imports), its rows/s and CPU µs per row."""
    action()
    seconds, cpu = [], []
    for _ in range(repeats):
        cpu_before, started = tree_cpu_seconds(), time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
        cpu.append(tree_cpu_seconds() - cpu_before)
    median = statistics.median(seconds)
    return {"seconds": median, "rows_per_s": rows / median,
            "cpu_us_per_row": statistics.median(cpu) / rows * 1e6, "runs": seconds}


CEILING_ROWS = 50_000


def ceiling_source() -> type:
    """A data source yielding one ready-made Arrow batch (the five columns' shapes) over and
    over: `rows` rows in `tasks` tasks."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):
        def __init__(self, rows: int, tasks: int) -> None:
            self.rows, self.tasks = rows, tasks

        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(i) for i in range(self.tasks)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            n = CEILING_ROWS
            batch = pa.RecordBatch.from_arrays([
                pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
                pa.array([b"k%07d" % i for i in range(n)], pa.binary()),
                pa.array([VALUE] * n, pa.binary())],
                names=["partition", "offset", "timestamp", "key", "value"])
            for _ in range(self.rows // self.tasks // n):
                yield batch

    class Ceiling(DataSource):
        @classmethod
        def name(cls) -> str:
            return "arrow_ceiling"

        def schema(self) -> str:
            return FIVE_COLUMNS

        def reader(self, schema: Any) -> DataSourceReader:
            return Reader(int(self.options["rows"]), int(self.options["tasks"]))

    return Ceiling


def spark_session() -> Any:
    import jetstream.spark
    spark = jetstream.spark.local_session("bench-spark", **{"spark.driver.memory": "4g"})
    spark.dataSource.register(ceiling_source())
    return spark


async def load(broker: BrokerProcess, nats_url: str, plan: Plan) -> JsonObject:
    async with jetstream.connect(broker.address) as js:
        await js.create_stream(STREAM, f"{STREAM}.in", partitions=PARTITIONS,
                               ack_policy="leader")
        # Where the writer's rows go.
        await js.create_stream("written", "written.in", partitions=WRITTEN_PARTITIONS,
                               ack_policy="leader")
    started = time.perf_counter()
    for start in range(0, plan.records, PUBLISH_CHUNK):
        await publish_pipelined(nats_url, messages(start, min(PUBLISH_CHUNK,
                                                              plan.records - start)),
                                plan.window)
    return {"publish_rows_per_s": plan.records / (time.perf_counter() - started)}


async def decode_to_parquet(broker: BrokerProcess, path: Path, plan: Plan) -> JsonObject:
    """The Parquet baseline: every record's five columns, decoded from the segment files in
    this process (one core: the decoder's own rate) and written by pyarrow (snappy)."""
    async with jetstream.connect(broker.address) as js:
        listings = [await js.list_segments(STREAM, p) for p in range(PARTITIONS)]
    started = time.perf_counter()
    batches: list[pa.RecordBatch] = []
    for listing in listings:
        segments = tuple(SegmentFile(base, f"{listing.directory}/{log_file_name(base)}")
                         for base, _size in listing.segments)
        split = FileSplit(STREAM, listing.partition, listing.log_start_offset,
                          listing.high_watermark, segments)
        batches.extend(read_split(split, FIVE_COLUMN_NAMES))
    decoded = time.perf_counter() - started
    table = pa.Table.from_batches(batches)
    assert table.num_rows == plan.records, (table.num_rows, plan.records)
    pq.write_table(table, str(path), compression="snappy")
    return {"decode_rows_per_s": plan.records / decoded}


async def client_read(broker: BrokerProcess, plan: Plan) -> JsonObject:
    rows = 0
    started = time.perf_counter()
    async with jetstream.connect(broker.address) as js:
        for partition in range(PARTITIONS):
            offset = 0
            while True:
                result = await js.fetch(STREAM, partition, offset, max_bytes=8 << 20,
                                        max_wait_ms=0)
                if not result.messages:
                    break
                rows += len(result.messages)
                offset = result.messages[-1].offset + 1
    assert rows == plan.records, (rows, plan.records)
    return {"client_rows_per_s": rows / (time.perf_counter() - started)}


def spark_figures(spark: Any, broker: BrokerProcess, work: Path, plan: Plan) -> JsonObject:
    from pyspark.sql import functions as F

    def jetstream_read(schema: str = FIVE_COLUMNS) -> Any:
        return (spark.read.format("jetstream").option("brokers", broker.address)
                .option("stream", STREAM).schema(schema).load())

    def noop(df: Any) -> Callable[[], object]:
        return lambda: df.write.format("noop").mode("overwrite").save()

    parquet_path = str(work / "bench.parquet")
    rows_in_files = jetstream_read().count()
    assert rows_in_files == plan.records, (rows_in_files, plan.records)
    r = plan.repeats
    out: JsonObject = {}
    out["files"] = timed(noop(jetstream_read()), r, plan.records)
    out["parquet"] = timed(noop(spark.read.parquet(parquet_path)), r, plan.records)
    from_brokers = (spark.read.format("jetstream").option("brokers", broker.address)
                    .option("stream", STREAM).option("readFrom", "brokers")
                    .schema(FIVE_COLUMNS).load())
    out["brokers"] = timed(noop(from_brokers), r, plan.records)
    out["narrow"] = timed(noop(jetstream_read("partition int, offset long, key binary")), r,
                          plan.records)
    everything = (spark.read.format("jetstream").option("brokers", broker.address)
                  .option("stream", STREAM).load())
    out["full_all_columns"] = timed(noop(everything), r, plan.records)
    per_partition = plan.records // PARTITIONS
    low = per_partition // 2
    high = low + per_partition // 100
    whole = jetstream_read().where(F.col("partition") == 0)
    part = whole.where((F.col("offset") >= low) & (F.col("offset") < high))
    assert part.count() == high - low
    out["partition_0"] = timed(noop(whole), r, per_partition)
    out["filter_1pct"] = timed(noop(part), r, high - low)
    tasks = max(2, plan.records // 500_000)
    ceiling = (spark.read.format("arrow_ceiling").option("rows", str(plan.records))
               .option("tasks", str(tasks)).load())
    out["arrow_ceiling"] = timed(noop(ceiling), r, plan.records // tasks // CEILING_ROWS
                                 * CEILING_ROWS * tasks)
    # The writer, against Parquet and against the no-op sink (the load generator).
    rows = (spark.read.parquet(parquet_path).select("key", "value").limit(plan.write_rows)
            .repartition(2))
    rows = rows.cache()
    rows.count()

    def write_stream() -> None:
        rows.write.format("jetstream").option("brokers", broker.address) \
            .option("stream", "written").mode("append").save()

    out["write_stream"] = timed(write_stream, r, plan.write_rows)
    out["write_parquet"] = timed(
        lambda: rows.write.mode("overwrite").parquet(str(work / "written.parquet")), r,
        plan.write_rows)
    out["write_noop"] = timed(noop(rows), r, plan.write_rows)
    rows.unpersist()
    return out


async def run(plan: Plan) -> JsonObject:
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        work = Path(tmp)
        with NatsServer(work / "nats") as nats_server:
            broker = BrokerProcess(work / "broker", nats_server.url).start()
            try:
                loaded = await load(broker, nats_server.url, plan)
                client = await client_read(broker, plan)
                decoded = await decode_to_parquet(broker, work / "bench.parquet", plan)
                spark = spark_session()
                try:
                    # On this thread: Spark finds Python data sources for writes through the
                    # calling thread's active session.
                    figures = spark_figures(spark, broker, work, plan)
                finally:
                    spark.stop()
            finally:
                broker.stop()
    f = figures
    return {
        "plan": asdict(plan), **loaded, **client, **decoded,
        "figures": f,
        "spark_files_rows_per_s": f["files"]["rows_per_s"],
        "spark_parquet_rows_per_s": f["parquet"]["rows_per_s"],
        "spark_brokers_rows_per_s": f["brokers"]["rows_per_s"],
        "files_vs_parquet_ratio": f["files"]["rows_per_s"] / f["parquet"]["rows_per_s"],
        "narrow_vs_full_ratio": f["narrow"]["rows_per_s"] / f["full_all_columns"]["rows_per_s"],
        "filter_1pct_speedup": f["partition_0"]["seconds"] / f["filter_1pct"]["seconds"],
        "arrow_ceiling_rows_per_s": f["arrow_ceiling"]["rows_per_s"],
        "files_vs_ceiling_ratio": f["files"]["rows_per_s"] / f["arrow_ceiling"]["rows_per_s"],
        "client_rows_per_s": client["client_rows_per_s"],
        "write_rows_per_s": f["write_stream"]["rows_per_s"],
        "write_parquet_rows_per_s": f["write_parquet"]["rows_per_s"],
        "write_vs_parquet_ratio": f["write_stream"]["rows_per_s"]
        / f["write_parquet"]["rows_per_s"],
        "writer_headroom": f["write_noop"]["rows_per_s"] / f["write_stream"]["rows_per_s"],
    }


def table(r: JsonObject) -> str:
    f = r["figures"]
    lines = [f"{'read':<34}{'rows/s':>14}{'s':>9}{'CPU µs/row':>12}"]
    for name in ("files", "parquet", "brokers", "narrow", "full_all_columns", "partition_0",
                 "filter_1pct", "arrow_ceiling", "write_stream", "write_parquet", "write_noop"):
        x = f[name]
        lines.append(f"{name:<34}{x['rows_per_s']:>14,.0f}{x['seconds']:>9.2f}"
                     f"{x['cpu_us_per_row']:>12.2f}")
    lines += [
        "",
        f"files vs Spark Parquet: {r['files_vs_parquet_ratio']:.2f}x (target >= 0.3)",
        f"files vs ready-made Arrow (transfer ceiling): {r['files_vs_ceiling_ratio']:.2f}x",
        f"narrow vs full: {r['narrow_vs_full_ratio']:.2f}x (target >= 3)",
        f"1 % offset filter speedup: {r['filter_1pct_speedup']:.1f}x (target >= 20)",
        (f"Python client: {r['client_rows_per_s']:,.0f} rows/s; decoder alone (one core, "
        f"five columns): {r['decode_rows_per_s']:,.0f} rows/s"),
        (f"writer: {r['write_rows_per_s']:,.0f} rows/s = {r['write_vs_parquet_ratio']:.2f}x "
         f"Spark's Parquet writer; no-op sink {r['writer_headroom']:.1f}x faster (>= 2 "
         "needed)"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("spark", __doc__, argv, lambda quick: run(QUICK if quick else FULL),
                      table)


if __name__ == "__main__":
    sys.exit(main())
