"""Planning a read that takes a stream's history from its Parquet fragments and the rest (the
live tail) through the source.

Theory of operation: a stream with `fragment_format` parquet or both has Parquet fragments in
its fragment store (jetstream.tiered.parquet), each holding the committed records of one
sealed segment in the source's schema. Given each partition's planned range [start, end)
(jetstream.spark.planning: end fixed at planning, at or below the high watermark) and the
Parquet fragments its leader's index lists, a partition's read is cut in two:
- [start, split): the run of Parquet fragments covering `start` without a gap (resolved by
  offset coverage like every fragment index), up to `end` — a native Parquet read of those
  files, rows outside [start, split) dropped by a filter Spark pushes to the row groups'
  offset statistics;
- [split, end): everything else, read by `format("jetstream")` with both offsets given.
A partition with no Parquet fragment at `start` is read wholly by the source. Parquet
fragments are only made of committed segments, so both halves hold committed records only.
`stored_start` says how far below the leader's log start the Parquet history reaches without
a gap (history that left the brokers' disks is still read from Parquet). Below the leader's
local log start, the part of a tail Parquet does not cover is read from the segment
fragments (`fragment_tasks`: tasks holding the fragments' names, cut where fragments end, read
straight from the store by jetstream.spark.fragment_reader); a Parquet piece can be read the
same way where Spark's own reader cannot reach the store (`ParquetPiece.tasks`).
Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jetstream.errors import InvalidSparkOption
from jetstream.spark.fragment_reader import FragmentSplit
from jetstream.spark.planning import ReadTask
from jetstream.spark.segment_reader import split_offsets
from jetstream.tiered.index import Coverage, StoredFragment
from jetstream.tiered.names import Compression, FragmentKind, FragmentName

#: Most Parquet files one read plans (each is a segment's records: this is many TB).
PARQUET_FILES_MAX = 1_000_000


@dataclass(frozen=True, slots=True)
class ParquetPiece:
    """Rows [start, end) of one partition, from these Parquet files (URLs, in offset
    order)."""

    stream: str
    partition: int
    start: int
    end: int
    urls: tuple[str, ...]
    #: The offsets the files hold together ([files_begin, files_end) covers [start, end)).
    files_begin: int = 0
    files_end: int = 0
    #: The files' fragment names and their store (for a read through the store library).
    names: tuple[FragmentName, ...] = ()
    store: str = ""

    def tasks(self) -> list[ReadTask]:
        """The piece as tasks reading its files with the store library, one per file."""
        return [ReadTask(self.stream, self.partition, start, end, None,
                         fragments=FragmentSplit(self.stream, self.partition, start, end,
                                                 self.store, (name,)))
                for name in self.names
                if (start := max(self.start, name.begin)) < (end := min(self.end, name.end))]


@dataclass(frozen=True, slots=True)
class PartitionFragments:
    """A partition's Parquet fragments as its leader lists them, with their URLs."""

    coverage: Coverage
    urls: Mapping[FragmentName, str] = field(default_factory=dict)
    #: The stream's fragment store URL.
    store: str = ""

    def stored_start(self, log_start_offset: int) -> int | None:
        """The lowest offset from which Parquet covers every offset up to the log start
        (None: Parquet does not reach the log start)."""
        start = self.coverage.start_offset(log_start_offset)
        return start if start < log_start_offset else None


@dataclass(frozen=True, slots=True)
class StorePlan:
    pieces: tuple[ParquetPiece, ...]
    #: Each partition's [start, end) read through the source (start == end: nothing).
    tail: Mapping[tuple[str, int], tuple[int, int]]

    @property
    def urls(self) -> list[str]:
        return [url for piece in self.pieces for url in piece.urls]


def partition_fragments(stream: str, partition: int, described: Iterable[Mapping[str, Any]],
                        kind: FragmentKind = FragmentKind.PARQUET, store: str = ""
                        ) -> PartitionFragments:
    """The fragments of one `kind` of a FRAGMENTS answer's `fragments`
    (jetstream.client.admin `fragments`)."""
    urls: dict[FragmentName, str] = {}
    listed: list[StoredFragment] = []
    for entry in described:
        if entry.get("format", FragmentKind.SEGMENT.value) != kind.value:
            continue
        name = FragmentName(int(entry["begin"]), int(entry["end"]), stream, partition,
                            int(entry["leader_epoch"]), str(entry["sha256"]),
                            Compression(entry.get("compression", Compression.NONE.value)),
                            kind)
        urls[name] = spark_url(str(entry["url"]))
        listed.append(StoredFragment(name, int(entry["size_bytes"]), int(entry["modified_ms"])))
    return PartitionFragments(Coverage(listed), urls, store)


def spark_url(url: str) -> str:
    """A fragment URL as Spark's (Hadoop's) file systems name it: S3 is `s3a://`."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


def plan_store_read(ranges: Mapping[tuple[str, int], tuple[int, int]],
                    fragments: Mapping[tuple[str, int], PartitionFragments]) -> StorePlan:
    """Cut each planned range into a Parquet piece and a tail (see the module docstring)."""
    pieces: list[ParquetPiece] = []
    tail: dict[tuple[str, int], tuple[int, int]] = {}
    files = 0
    for key, (start, end) in sorted(ranges.items()):
        found = fragments.get(key)
        run = found.coverage.run_from(start, end) if found is not None and start < end else []
        if not run:
            tail[key] = (start, end)
            continue
        assert found is not None
        split = min(run[-1].end, end)
        pieces.append(ParquetPiece(key[0], key[1], start, split,
                                   tuple(found.urls[f.name] for f in run), run[0].begin,
                                   run[-1].end, tuple(f.name for f in run), found.store))
        files += len(run)
        if files > PARQUET_FILES_MAX:
            raise InvalidSparkOption(f"the read would open more than {PARQUET_FILES_MAX} "
                                     "Parquet files: read fewer streams or offsets",
                                     field="stream")
        tail[key] = (split, end)
    return StorePlan(tuple(pieces), tail)


def fragment_tasks(key: tuple[str, int], start: int, end: int, found: PartitionFragments,
                   *, split_records: int, fall_back: bool,
                   timestamp_min_ms: int | None = None, timestamp_max_ms: int | None = None
                   ) -> tuple[list[ReadTask], int]:
    """Tasks reading [start, x) of a partition straight from the store's segment fragments
    (jetstream.spark.fragment_reader), for the largest x up to `end` the fragments reach
    from `start` without a gap (an overlap is fine: each fragment is read from where the one
    before it ended), cut where fragments end into at most `split_records` offsets each;
    and x (`start`: no fragment holds it)."""
    chain: list[tuple[int, StoredFragment]] = []  # (where its reading starts, fragment)
    at = start
    while at < end:
        fragment = found.coverage.covering(at)
        if fragment is None:
            break
        chain.append((at, fragment))
        at = fragment.end
    stop = min(at, end)
    tasks: list[ReadTask] = []
    for piece_start, piece_end in split_offsets(start, stop, [f.end for _, f in chain],
                                                split_records):
        names = tuple(f.name for begin, f in chain if begin < piece_end and f.end > piece_start)
        tasks.append(ReadTask(key[0], key[1], piece_start, piece_end, None, timestamp_min_ms,
                              timestamp_max_ms, fragments=FragmentSplit(
                                  key[0], key[1], piece_start, piece_end, found.store,
                                  names, fall_back)))
    return tasks, stop
