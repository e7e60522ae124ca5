"""`jetstream.spark.read(spark, ...)`: one DataFrame of streams whose history is in a
fragment store, read straight from the store, and whose live tail is read through the source.

    df = jetstream.spark.read(spark, brokers="127.0.0.1:9292", stream="orders")

Theory of operation: the shell around jetstream.spark.store_planning. At planning, on the
driver, one client resolves the streams, asks each stream with a `fragment_store` for its
partitions' fragments (FRAGMENTS, the leaders' fragment indexes) and plans the read as
`format("jetstream")` would (jetstream.spark.cluster_view: committed data only, end offsets
fixed now), its start reaching down into stored history that left the brokers' disks. Each
partition's range is then cut in three:
- a Parquet piece (fragment_format parquet or both): Spark's native Parquet reader reads its
  files, filtered to the piece's partition and offsets, where Spark reaches the store
  (`file://`, or a store whose Hadoop file system is on its class path: `s3://` is read as
  `s3a://` with hadoop-aws); elsewhere source tasks read them with the store library and
  pyarrow (jetstream.spark.fragment_reader);
- below the leader's local log start, what Parquet does not cover: source tasks reading the
  segment fragments straight from the store (readFrom files or auto: the store library,
  SHA-256 checked, the segment decoder; auto falls back to the leader when the store
  cannot be reached), or Fetching from the leader (readFrom brokers);
- the rest, the live tail: the source's planner (the leaders' segment files, or Fetch).
Every source task is planned here (jetstream.spark.planned_source), so all parts meet at the
same offsets however often the DataFrame is computed. The rows are the same either way: a
fragment holds its segment's committed records, a Parquet fragment in the source's schema.

Options are `format("jetstream")`'s (keyword arguments, dicts as JSON). A read with
`compacted=latest` goes wholly through the source (only a whole partition knows each key's
latest record). Executors reach the store with the brokers' store library and their own
environment's credentials and endpoint (`AWS_*`, `GOOGLE_*`, `AZURE_*`); `file://` stores
need a file system every executor shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

from jetstream.client.client import Client, connect
from jetstream.client.types import StreamInfo
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
    fragment_tasks,
    partition_fragments,
    plan_store_read,
)
from jetstream.tiered.names import FragmentKind
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
    stored = await stored_history(client, streams, options, parquet=parquet)
    source_plan = await plan_read(client, options, OffsetBounds(), stored.starts,
                                  tasks=False, streams=streams)
    store = plan_store_read(source_plan.ranges.ranges, stored.parquet)
    below, tails = tail_ranges(store, stored, options)
    tasks = below + plan_tasks(source_plan.listings, tails, options, OffsetBounds())
    return PlannedRead(source_plan, store, tuple(tasks))


@dataclass(frozen=True, slots=True)
class StoredHistory:
    """What the leaders' fragment indexes say of the streams with a fragment store."""

    #: Parquet fragments, per partition (streams with fragment_format parquet or both).
    parquet: dict[tuple[str, int], PartitionFragments] = field(default_factory=dict)
    #: Segment fragments, per partition (streams with fragment_format segment or both).
    segments: dict[tuple[str, int], PartitionFragments] = field(default_factory=dict)
    #: Each leader's local log start.
    local_starts: dict[tuple[str, int], int] = field(default_factory=dict)
    #: How far below the local log start the stored history reaches without a gap.
    starts: dict[tuple[str, int], int] = field(default_factory=dict)


async def stored_history(client: Client, streams: Sequence[StreamInfo], options: ReadOptions,
                         *, parquet: bool) -> StoredHistory:
    """FRAGMENTS of every partition of the streams with a store (none for a compacted=latest
    read: only a whole partition read through the source knows each key's latest)."""
    out = StoredHistory()
    if options.compacted_latest:
        return out
    for info in streams:
        store = str(info.config.get("fragment_store") or "")
        if not store:
            continue
        form = FragmentFormat(info.config.get("fragment_format") or FragmentFormat.SEGMENT)
        for entry in await client.fragments(info.name):
            key = (info.name, int(entry["partition"]))
            local = out.local_starts[key] = int(entry["local_log_start_offset"])
            starts = []
            if parquet and form.parquet:
                found = out.parquet[key] = partition_fragments(
                    key[0], key[1], entry["fragments"], store=store)
                starts.append(found.stored_start(local))
            if form.segments:
                found = out.segments[key] = partition_fragments(
                    key[0], key[1], entry["fragments"], FragmentKind.SEGMENT, store)
                starts.append(found.stored_start(local))
            known = [start for start in starts if start is not None]
            if known:
                out.starts[key] = min(known)
    return out


def tail_ranges(store: StorePlan, stored: StoredHistory, options: ReadOptions
                ) -> tuple[list[ReadTask], Ranges]:
    """Tasks reading the part of each tail below its leader's local log start (where Parquet
    stopped short of it): straight from the store's segment fragments (readFrom files or
    auto), else Fetched from the leader (which serves them from its segment fragments, or
    says DATA_LOSS); and the rest of each tail, for the source's planner (the leaders'
    segment files hold it)."""
    below: list[ReadTask] = []
    rest: dict[tuple[str, int], tuple[int, int]] = {}
    for key, (start, end) in store.tail.items():
        stop = min(stored.local_starts.get(key, start), end)
        segments = stored.segments.get(key)
        if start < stop and segments is not None and options.read_from != "brokers":
            tasks, start = fragment_tasks(key, start, stop, segments,
                                          split_records=options.split_records,
                                          fall_back=options.read_from == "auto")
            below += tasks
        if start < stop:
            below.append(ReadTask(key[0], key[1], start, stop, None))
            start = stop
        if start < end:
            rest[key] = (start, end)
    return below, Ranges(rest)


def dataframe(spark: SparkSession, planned: PlannedRead, options: Mapping[str, str]
              ) -> DataFrame:
    """The union of the Parquet pieces and the tail read of `planned`. Spark's own Parquet
    reader reads the pieces where it can reach their store; elsewhere (`s3://` without
    hadoop-aws, say) tasks of the source read them with the store library and pyarrow."""
    frames: list[DataFrame] = []
    store = planned.store
    tasks = list(planned.tail_tasks)
    schemes = {url.split("://", 1)[0] if "://" in url else "file" for url in store.urls}
    if store.pieces and not all(native_parquet(spark, scheme) for scheme in schemes):
        tasks = [task for piece in store.pieces for task in piece.tasks()] + tasks
    elif store.pieces:
        files = spark.read.schema(SPARK_DDL).parquet(*store.urls)
        cut = [p for p in store.pieces if (p.start, p.end) != (p.files_begin, p.files_end)]
        if cut:  # rows of files reaching past a piece's range are dropped
            files = files.where(reduce(lambda a, b: a & b, (_piece_rows(p) for p in cut)))
        frames.append(files)
    if tasks or not frames:
        frames.append(spark.read.format(PLANNED).options(**options)
                      .option(TASKS_OPTION, encode_tasks(tasks)).load())
    return reduce(lambda a, b: a.unionByName(b), frames)


#: The Hadoop file system class Spark needs for each URL scheme it does not read itself.
_HADOOP_FILE_SYSTEMS = {"s3a": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                        "gs": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
                        "abfs": "org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem",
                        "abfss": "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem"}


def native_parquet(spark: SparkSession, scheme: str) -> bool:
    """Whether Spark's own reader can open URLs of `scheme`: local files, or a store whose
    Hadoop file system class is on Spark's class path."""
    if scheme == "file":
        return True
    name = _HADOOP_FILE_SYSTEMS.get(scheme)
    if name is None:
        return False
    try:
        spark._jvm.java.lang.Class.forName(name)  # type: ignore[union-attr]
    except Exception:  # py4j: ClassNotFoundException
        return False
    return True


def _piece_rows(piece: ParquetPiece) -> Column:
    """Rows of other partitions, and rows of the piece's partition in its range."""
    from pyspark.sql import functions as F
    return (~((F.col("stream") == piece.stream) & (F.col("partition") == piece.partition))
            | ((F.col("offset") >= piece.start) & (F.col("offset") < piece.end)))
