"""Spark reading a stream whose history is in Parquet fragments, beside Spark reading the same
rows from a plain Parquet dataset (part of bench.tiered).

- Data: `records` records (8 B key, 128 B value) in 2 partitions of a stream on one broker
  with `fragment_format=parquet`, `fragment_compression=snappy` and a `file://` fragment
  store, published with the pipelined raw NATS publisher and acked, then waited on until the
  offload has written every sealed segment as a Parquet fragment (the active segments are
  the live tail).
- Ours (the figure): `jetstream.spark.read(spark, ...)` of the history, the offsets the
  Parquet fragments hold (`endingOffsets` at their end) — planning (FRAGMENTS and
  LIST_SEGMENTS at the leaders, again in every run) and Spark's native Parquet reader over
  the fragments — every column.
- The peer: the same rows (read once through ours) written by Spark as a plain Parquet
  dataset (snappy, its default file sizes), read with `spark.read.parquet`.
- Also: the whole stream, history and live tail (the active segments, read through the
  source's Python reader), ÷ the same plain Parquet read per row.
- The page cache is written back (`sync`) before the timed runs: the load leaves hundreds
  of megabytes dirty, whose writeback 30 s later would fall in some rounds and not others.
- Each figure is the median of `repeats` runs, after an untimed one, of an action that
  materialises every row and column (`write.format("noop")`), so only the reading is timed;
  the reads take turns within each round, so a machine shared with other work loads each
  alike;
  CPU per row counts this process and all its descendants (the Spark JVM, Python workers,
  the idle broker). The load generator is Spark itself: the same session and action on both
  sides.
A `file://` store: Spark reads S3 through Hadoop's s3a, which needs hadoop-aws (not a
dependency); obstore serves moto's S3 to the broker either way.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jetstream
from bench.common import JsonObject, Message, publish_pipelined
from bench.spark import timed, tree_cpu_seconds
from jetstream.natsd import NatsServer
from jetstream.protocol.envelope import encode_envelope
from jetstream.server.process import BrokerProcess

STREAM, PARTITIONS = "history", 2
VALUE = b"v" * 128
PUBLISH_CHUNK = 200_000


@dataclass(frozen=True, slots=True)
class Sizes:
    records: int
    segment_bytes: int
    repeats: int


QUICK = Sizes(400_000, 8 << 20, 7)
FULL = Sizes(2_000_000, 32 << 20, 7)


def _messages(start: int, count: int) -> list[Message]:
    return [(f"{STREAM}.in" if i % PARTITIONS == 0 else f"{STREAM}.in.{i % PARTITIONS}",
             encode_envelope(VALUE, b"k%07d" % i), None) for i in range(start, start + count)]


async def _parquet_written(broker: BrokerProcess, deadline_s: float) -> list[dict[str, Any]]:
    """Wait until no partition has a segment waiting for its Parquet fragment."""
    async with jetstream.connect(broker.address) as js:
        deadline = time.monotonic() + deadline_s
        while True:
            found = await js.fragments(STREAM)
            if all(e.get("listed") and e.get("backlog_bytes", 1) == 0 for e in found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"Parquet fragments not written in {deadline_s} s: "
                                     f"{[e.get('backlog_bytes') for e in found]}")
            await asyncio.sleep(0.2)


async def _load(broker: BrokerProcess, nats_url: str, store: str, sizes: Sizes) -> JsonObject:
    async with jetstream.connect(broker.address) as js:
        await js.create_stream(STREAM, f"{STREAM}.in", partitions=PARTITIONS,
                               ack_policy="leader", segment_bytes_max=sizes.segment_bytes,
                               tiered={"fragment_store": store, "fragment_format": "parquet",
                                       "fragment_compression": "snappy"})
    started = time.perf_counter()
    for start in range(0, sizes.records, PUBLISH_CHUNK):
        await publish_pipelined(nats_url, _messages(start, min(PUBLISH_CHUNK,
                                                               sizes.records - start)), 5000)
    published = time.perf_counter() - started
    found = await _parquet_written(broker, 300)
    parquet_files = sum(1 for e in found for f in e["fragments"] if f["format"] == "parquet")
    ends = {str(e["partition"]): max((f["end"] for f in e["fragments"]
                                      if f["format"] == "parquet"), default=0) for e in found}
    return {"publish_rows_per_s": sizes.records / published, "parquet_fragments": parquet_files,
            "parquet_bytes": sum(f["size_bytes"] for e in found for f in e["fragments"]),
            "parquet_ends": ends, "history_records": sum(ends.values()),
            "tail_records": sizes.records - sum(ends.values())}


def _figures(broker: BrokerProcess, work: Path, sizes: Sizes, ends: dict[str, int]
             ) -> JsonObject:
    import jetstream.spark
    from jetstream.spark import store_read
    from jetstream.spark.options import parse_read_options
    spark = jetstream.spark.local_session("bench-tiered-spark",
                                          **{"spark.driver.memory": "2g"})
    try:
        def ours(**options: Any) -> Any:
            return jetstream.spark.read(spark, brokers=broker.address, stream=STREAM,
                                        **options)

        def noop(frame: Any) -> Callable[[], object]:
            return lambda: frame().write.format("noop").mode("overwrite").save()

        history = {STREAM: ends}
        rows = ours(endingOffsets=history).count()
        assert rows == sum(ends.values()), (rows, ends)
        assert ours().count() == sizes.records
        plain = str(work / "plain.parquet")
        ours(endingOffsets=history).write.mode("overwrite") \
            .option("compression", "snappy").parquet(plain)
        assert spark.read.parquet(plain).count() == rows
        os.sync()  # the load's writes would be written back during the rounds otherwise
        fragments, dataset, whole = interleaved(
            [(noop(lambda: ours(endingOffsets=history)), rows),
             (noop(lambda: spark.read.parquet(plain)), rows),
             (noop(ours), sizes.records)], sizes.repeats)
        options = parse_read_options({"brokers": broker.address, "stream": STREAM})
        planning = timed(lambda: store_read.plan(options), sizes.repeats, rows)
    finally:
        spark.stop()
    return {"rows": rows, "parquet_fragments_read": fragments, "plain_parquet_read": dataset,
            "with_tail_read": whole, "planning_seconds": planning["seconds"],
            "spark_parquet_fragments_vs_parquet":
                fragments["rows_per_s"] / dataset["rows_per_s"],
            "round_ratios": [d / f for f, d in zip(fragments["runs"], dataset["runs"],
                                                   strict=True)],
            "with_tail_vs_parquet": whole["rows_per_s"] / dataset["rows_per_s"]}


def interleaved(actions: list[tuple[Callable[[], object], int]], repeats: int
                ) -> list[JsonObject]:
    """Each action (with the rows it reads) timed `repeats` times after an untimed run, the
    actions taking turns within each round (a machine shared with other work loads each
    alike): per action, the median seconds, rows/s, CPU µs per row and every run."""
    seconds: list[list[float]] = [[] for _ in actions]
    cpu: list[list[float]] = [[] for _ in actions]
    for action, _rows in actions:
        action()
    for _ in range(repeats):
        for i, (action, _rows) in enumerate(actions):
            cpu_before, started = tree_cpu_seconds(), time.perf_counter()
            action()
            seconds[i].append(time.perf_counter() - started)
            cpu[i].append(tree_cpu_seconds() - cpu_before)
    return [{"seconds": statistics.median(s), "rows_per_s": rows / statistics.median(s),
             "cpu_us_per_row": statistics.median(c) / rows * 1e6, "runs": s}
            for (_action, rows), s, c in zip(actions, seconds, cpu, strict=True)]


async def measure(tmp: Path, quick: bool) -> JsonObject:
    sizes = QUICK if quick else FULL
    with NatsServer(tmp / "spark-nats") as nats_server:
        broker = BrokerProcess(tmp / "spark-broker", nats_server.url).start()
        try:
            loaded = await _load(broker, nats_server.url, f"file://{tmp}/spark-store", sizes)
            # On this thread (Spark finds Python data sources through the calling thread's
            # active session); blocking is fine: the broker runs in its own process.
            figures = _figures(broker, tmp, sizes, loaded["parquet_ends"])
        finally:
            broker.stop()
    return {"records": sizes.records, "segment_bytes": sizes.segment_bytes, **loaded,
            **figures}
