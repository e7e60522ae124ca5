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
a gap (history that left the brokers' disks is still read from Parquet).
Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jetstream.errors import InvalidSparkOption
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


@dataclass(frozen=True, slots=True)
class PartitionFragments:
    """A partition's Parquet fragments as its leader lists them, with their URLs."""

    coverage: Coverage
    urls: Mapping[FragmentName, str] = field(default_factory=dict)

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


def partition_fragments(stream: str, partition: int, described: Iterable[Mapping[str, Any]]
                        ) -> PartitionFragments:
    """The Parquet fragments of a FRAGMENTS answer's `fragments` (jetstream.client.admin
    `fragments`); segment fragments are left out."""
    urls: dict[FragmentName, str] = {}
    listed: list[StoredFragment] = []
    for entry in described:
        if entry.get("format") != FragmentKind.PARQUET.value:
            continue
        name = FragmentName(int(entry["begin"]), int(entry["end"]), stream, partition,
                            int(entry["leader_epoch"]), str(entry["sha256"]),
                            Compression.NONE, FragmentKind.PARQUET)
        urls[name] = spark_url(str(entry["url"]))
        listed.append(StoredFragment(name, int(entry["size_bytes"]), int(entry["modified_ms"])))
    return PartitionFragments(Coverage(listed), urls)


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
                                   run[-1].end))
        files += len(run)
        if files > PARQUET_FILES_MAX:
            raise InvalidSparkOption(f"the read would open more than {PARQUET_FILES_MAX} "
                                     "Parquet files: read fewer streams or offsets",
                                     field="stream")
        tail[key] = (split, end)
    return StorePlan(tuple(pieces), tail)
