"""`jetstream.spark.read(spark, ...)`: one DataFrame of streams whose history is in Parquet
fragments, read by Spark's native Parquet reader, and whose live tail is read through the
source.

    df = jetstream.spark.read(spark, brokers="127.0.0.1:9292", stream="orders")

Theory of operation: the shell around jetstream.spark.store_planning. At planning, on the
driver, one client resolves the streams, asks each stream with `fragment_format` parquet or
both for its partitions' fragments (FRAGMENTS, the leaders' fragment indexes) and plans the
read as `format("jetstream")` would (jetstream.spark.cluster_view: committed data only, end
offsets fixed now), its start reaching down into Parquet history that left the brokers'
disks. Each partition's range is then cut into a Parquet piece and a tail; the DataFrame is
the union (by column name) of one `spark.read.parquet` of every piece's files, filtered to
each piece's partition and offsets, and one read of the tails through the source's task
reader, its tasks planned here too (jetstream.spark.planned_source), so both halves meet at
the same offsets however often the DataFrame is computed. The rows are the same either way:
a Parquet fragment holds its segment's records in the source's schema.

Options are `format("jetstream")`'s (keyword arguments, dicts as JSON). A read with
`compacted=latest` goes wholly through the source (only a whole partition knows each key's
latest record). Parquet fragments are read at the URL the store gives them (`s3://` as
Hadoop's `s3a://`): the Spark session must reach the store (for S3, hadoop-aws and its
`spark.hadoop.fs.s3a.*` settings); `file://` stores need a file system every executor
shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from jetstream.client.client import Client, connect
from jetstream.spark.arrow_decode import SPARK_DDL
from jetstream.spark.cluster_view import Plan, plan_read, resolve_streams, run_sync
from jetstream.spark.options import ReadOptions, parse_read_options
from jetstream.spark.planned_source import NAME as PLANNED
from jetstream.spark.planned_source import TASKS_OPTION, PlannedDataSource, encode_tasks
from jetstream.spark.planning import OffsetBounds, Ranges, ReadTask, plan_tasks
from jetstream.spark.store_planning import (
    ParquetPiece,
    PartitionFragments,
    StorePlan,
    partition_fragments,
    plan_store_read,
)
from jetstream.tiered.settings import FragmentFormat

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

@dataclass(frozen=True, slots=True)
class PlannedRead:
    """A read planned on the driver: each partition's range (the source's planning), how
    each range is cut, and the source's tasks reading the tails."""

    plan: Plan
    store: StorePlan
    tail_tasks: tuple[ReadTask, ...]


def read(spark: SparkSession, *, parquet: bool = True, **options: Any) -> DataFrame:
    """The committed records of the streams the options name, as one DataFrame (the
    columns of `format("jetstream")`): history from Parquet fragments where the streams
    have them, the rest through the source. `parquet=False` reads everything through the
    source."""
    from jetstream.spark.source import options_of

    spark.dataSource.register(PlannedDataSource)
    text = options_of(options)
    planned = plan(parse_read_options(text), parquet=parquet)
    return dataframe(spark, planned, text)


def plan(options: ReadOptions, *, parquet: bool = True) -> PlannedRead:
    """Plan a read (see the module docstring), from synchronous code."""
    async def run() -> PlannedRead:
        async with connect(options.brokers, **options.tls.connect_options()) as client:
            return await plan_async(client, options, parquet=parquet)

    return run_sync(run())


async def plan_async(client: Client, options: ReadOptions, *, parquet: bool = True
                     ) -> PlannedRead:
    streams = await resolve_streams(client, options)
    fragments: dict[tuple[str, int], PartitionFragments] = {}
    stored_starts: dict[tuple[str, int], int] = {}
    local_starts: dict[tuple[str, int], int] = {}
    if parquet and not options.compacted_latest:
        for info in streams:
            if not _has_parquet(info.config):
                continue
            for entry in await client.fragments(info.name):
                key = (info.name, int(entry["partition"]))
                found = fragments[key] = partition_fragments(key[0], key[1],
                                                             entry["fragments"])
                local_starts[key] = int(entry["local_log_start_offset"])
                start = found.stored_start(local_starts[key])
                if start is not None:
                    stored_starts[key] = start
    source_plan = await plan_read(client, options, OffsetBounds(), stored_starts,
                                  tasks=False, streams=streams)
    store = plan_store_read(source_plan.ranges.ranges, fragments)
    below, tails = tail_ranges(store, local_starts)
    tasks = below + plan_tasks(source_plan.listings, tails, options, OffsetBounds())
    return PlannedRead(source_plan, store, tuple(tasks))


def tail_ranges(store: StorePlan, local_starts: Mapping[tuple[str, int], int]
                ) -> tuple[list[ReadTask], Ranges]:
    """Tasks Fetching the part of each tail below its leader's local log start (where
    Parquet stopped short of it: the leader serves it from its segment fragments, or it is
    DATA_LOSS), and the rest of each tail, for the source's planner (the leaders' segment
    files hold it)."""
    below: list[ReadTask] = []
    rest: dict[tuple[str, int], tuple[int, int]] = {}
    for key, (start, end) in store.tail.items():
        local = local_starts.get(key, start)
        if start < min(local, end):
            below.append(ReadTask(key[0], key[1], start, min(local, end), None))
            start = min(local, end)
        if start < end:
            rest[key] = (start, end)
    return below, Ranges(rest)


def _has_parquet(config: Mapping[str, Any]) -> bool:
    form = config.get("fragment_format")
    return bool(config.get("fragment_store")) and form is not None and \
        FragmentFormat(form).parquet


def dataframe(spark: SparkSession, planned: PlannedRead, options: Mapping[str, str]
              ) -> DataFrame:
    """The union of the Parquet pieces and the tail read of `planned`."""
    frames: list[DataFrame] = []
    store = planned.store
    if store.pieces:
        files = spark.read.schema(SPARK_DDL).parquet(*store.urls)
        cut = [p for p in store.pieces if (p.start, p.end) != (p.files_begin, p.files_end)]
        if cut:  # rows of files reaching past a piece's range are dropped
            files = files.where(reduce(lambda a, b: a & b, (_piece_rows(p) for p in cut)))
        frames.append(files)
    if planned.tail_tasks or not frames:
        frames.append(spark.read.format(PLANNED).options(**options)
                      .option(TASKS_OPTION, encode_tasks(planned.tail_tasks)).load())
    return reduce(lambda a, b: a.unionByName(b), frames)


def _piece_rows(piece: ParquetPiece) -> Column:
    """Rows of other partitions, and rows of the piece's partition in its range."""
    from pyspark.sql import functions as F
    return (~((F.col("stream") == piece.stream) & (F.col("partition") == piece.partition))
            | ((F.col("offset") >= piece.start) & (F.col("offset") < piece.end)))
