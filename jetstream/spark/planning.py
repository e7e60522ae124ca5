"""Planning a bulk read: which offsets of which partitions each Spark task reads, and from where.

Theory of operation: the shell (jetstream.spark.cluster_view) asks each partition's leader for
its committed range and segment list (LIST_SEGMENTS) once, at planning. This module turns those
listings and the read options into tasks, with no IO:
- Each partition's range is [start, end). `end` is fixed here and never past the high
  watermark as of planning, so a read is repeatable and never sees uncommitted records.
  `start` comes from, in order: the consumer group's committed offset (option group), the
  per-partition startingOffsets, startingTimestamp, the default (earliest/latest). Pushed
  filters on `offset` narrow the range further; filters on `partition` and `stream` drop
  partitions.
- An explicit offset outside [log start, high watermark] is an error naming the valid range
  (below the log start: DataLoss, unless failOnDataLoss is false, then the log start).
- A range is cut into tasks of at most `split_records` offsets, at segment boundaries where
  possible, so one big partition keeps every core busy. A compacted=latest read keeps one task
  per partition: only the whole partition knows which record of a key is the latest.
- A task reads segment files when the planner may (readFrom files, or auto and the files are
  reachable), else Fetches from the partition's leader; so does a task below the first
  segment file (a start the leader found in its fragment store, tiered storage). A file
  task that finds its segment gone (compaction or retention removed it after planning)
  reads the rest from the broker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jetstream.errors import DataLoss, InvalidSparkOption, OffsetOutOfRange
from jetstream.spark.fragment_reader import FragmentSplit
from jetstream.spark.options import EARLIEST, LATEST, ReadOptions
from jetstream.spark.segment_reader import FileSplit, SegmentFile, segments_for, split_offsets

#: Most Spark tasks one read plans; more means a larger maxRecordsPerPartition is needed.
TASKS_MAX = 100_000


@dataclass(frozen=True, slots=True)
class PartitionListing:
    """What planning knows of one partition (from its leader's LIST_SEGMENTS answer)."""

    stream: str
    partition: int
    high_watermark: int
    log_start_offset: int
    #: (base_offset, path or URL of <base>.log) of each segment, in order; empty when the
    #: segment files are not to be read (readFrom brokers, or unreachable).
    segment_files: tuple[tuple[int, str], ...] = ()
    version_path: str | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetBounds:
    """Bounds from pushed-down filters: offsets in [low, high), and the partitions and streams
    allowed (None: any)."""

    low: int = 0
    high: int = 2**63 - 1
    partitions: frozenset[int] | None = None
    streams: frozenset[str] | None = None
    timestamp_min_ms: int | None = None
    timestamp_max_ms: int | None = None

    def allows(self, stream: str, partition: int) -> bool:
        return ((self.partitions is None or partition in self.partitions)
                and (self.streams is None or stream in self.streams))


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark input partition: offsets [start, end) of one stream partition."""

    stream: str
    partition: int
    start: int
    end: int
    #: The segment files to read, or None to Fetch from the leader.
    files: FileSplit | None
    #: Rows whose timestamp is outside these bounds (ms, inclusive) are dropped.
    timestamp_min_ms: int | None = None
    timestamp_max_ms: int | None = None
    #: Keep only each key's latest record, and drop keys whose latest is a tombstone.
    compacted_latest: bool = False
    #: The fragments to read straight from the fragment store (offsets below the leader's
    #: local log start, jetstream.spark.store_planning); None: `files`, else Fetch.
    fragments: FragmentSplit | None = None


@dataclass(frozen=True, slots=True)
class Ranges:
    """Each planned partition's [start, end), the query's offsets as Kafka's JSON form."""

    ranges: Mapping[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def starts(self) -> dict[str, dict[str, int]]:
        return offsets_json({key: start for key, (start, _end) in self.ranges.items()})

    def ends(self) -> dict[str, dict[str, int]]:
        return offsets_json({key: end for key, (_start, end) in self.ranges.items()})


def offsets_json(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Per-partition offsets in Kafka's JSON form, {"orders": {"0": 42}}."""
    out: dict[str, dict[str, int]] = {}
    for (stream, partition), offset in sorted(offsets.items()):
        out.setdefault(stream, {})[str(partition)] = offset
    return out


def resolve_start(listing: PartitionListing, options: ReadOptions, *,
                  committed: int | None, timestamp_offset: int | None) -> int:
    """Where a read of the partition starts (see the module docstring)."""
    explicit = options.starting.per_partition.get(listing.stream, {}).get(listing.partition)
    if committed is not None:
        wanted = committed
    elif explicit is not None and explicit >= 0:
        wanted = explicit
    elif timestamp_offset is not None:
        return timestamp_offset
    else:
        marker = explicit if explicit is not None else options.starting.default
        return listing.log_start_offset if marker == EARLIEST else listing.high_watermark
    if wanted > listing.high_watermark:
        raise OffsetOutOfRange(wanted, listing.log_start_offset, listing.high_watermark)
    return not_below_log_start(listing, wanted, options)


def not_below_log_start(listing: PartitionListing, offset: int, options: ReadOptions) -> int:
    """`offset`, unless retention removed it: then DataLoss, or with failOnDataLoss=false
    the log start offset."""
    if offset < listing.log_start_offset:
        if options.fail_on_data_loss:
            raise DataLoss(listing.stream, listing.partition, offset, listing.log_start_offset)
        return listing.log_start_offset
    return offset


def resolve_end(listing: PartitionListing, options: ReadOptions, *,
                timestamp_offset: int | None) -> int:
    """Where a batch read of the partition ends (exclusive), never past the high watermark."""
    explicit = options.ending.per_partition.get(listing.stream, {}).get(listing.partition)
    if explicit is not None and explicit >= 0:
        if explicit > listing.high_watermark:
            raise OffsetOutOfRange(explicit, listing.log_start_offset, listing.high_watermark)
        return explicit
    if timestamp_offset is not None:
        return min(timestamp_offset, listing.high_watermark)
    assert options.ending.default == LATEST
    return listing.high_watermark


def plan_tasks(listings: Sequence[PartitionListing], ranges: Ranges, options: ReadOptions,
               bounds: OffsetBounds) -> list[ReadTask]:
    """The tasks reading `ranges` (already resolved, bounds applied)."""
    tasks: list[ReadTask] = []
    by_key = {(listing.stream, listing.partition): listing for listing in listings}
    for key, (start, end) in sorted(ranges.ranges.items()):
        if start >= end:
            continue
        listing = by_key[key]
        bases = [base for base, _path in listing.segment_files]
        if options.compacted_latest:
            pieces = [(start, end)]
        else:
            pieces = split_offsets(start, end, bases, options.split_records)
        for piece_start, piece_end in pieces:
            files = None
            # Offsets below the first segment file (a timestamp found in the leader's
            # fragment store) are Fetched: the leader serves them from the store.
            if listing.segment_files and piece_start >= bases[0]:
                segments = tuple(SegmentFile(base, path) for base, path in listing.segment_files)
                files = FileSplit(listing.stream, listing.partition, piece_start, piece_end,
                                  tuple(segments_for(piece_start, piece_end, segments)),
                                  listing.version_path, listing.version)
            tasks.append(ReadTask(listing.stream, listing.partition, piece_start, piece_end,
                                  files, bounds.timestamp_min_ms, bounds.timestamp_max_ms,
                                  options.compacted_latest))
        if len(tasks) > TASKS_MAX:
            raise InvalidSparkOption(f"the read would take more than {TASKS_MAX} Spark tasks: "
                                     "raise maxRecordsPerPartition", field="maxRecordsPerPartition")
    return tasks


def narrow(start: int, end: int, bounds: OffsetBounds) -> tuple[int, int]:
    """[start, end) within the pushed-down offset bounds."""
    return max(start, bounds.low), min(end, bounds.high)
