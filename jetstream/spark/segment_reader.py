"""Reading one partition's offset range straight from its segment files, as Arrow batches.

Theory of operation: a Spark task gets a `FileSplit`, the offsets [start, end) of one
partition (the planner keeps end at or below the high watermark: every byte below it is
committed and written out) and the segment files that hold them, in order; a segment holds
[its base offset, the next segment's base offset). For each segment the task looks its
first wanted offset up in the segment's sparse offset index (`<base>.index`, beside the
log) to skip the batches before it, then reads the log forward in chunks of `chunk_bytes`
(into one reused buffer) and decodes them with jetstream.spark.arrow_decode, a few MiB per
call so the bytes stay in the CPU cache through decode's passes. A trailing partial batch is
carried into the next chunk. Nothing at or past `end` is ever returned: an active segment
may hold uncommitted batches past it, or a batch still being written.

The files belong to a live broker, so they can change under the reader. Appends are
harmless. The index of the active segment is only written when it is sealed, so a missing,
damaged or stale index (one whose entry does not point at a batch of the offset it names)
just means reading from the start of the segment. A segment deleted by retention, merged
into its predecessor by the log cleaner, cut short, holding batches that do not follow on
from each other (not the file the plan was made from), or a stream deleted and created
again (its version file differs) raise `SegmentGone` with the first offset not yet read:
the caller reads the rest from a broker. A compacted segment is fine: its batches keep their
offset ranges (emptied batches included), it only holds fewer records.

IO goes through `open_file`, a callable returning a binary file as a context manager: the
builtin `open` for paths, fsspec for URLs (file://, s3://, hdfs://...).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import IO

import fsspec
import pyarrow as pa

import jetstream.spark.arrow_decode as arrow_decode
from jetstream.stream import format as fmt
from jetstream.stream.config import GiB, MiB
from jetstream.stream.index import OffsetIndex

#: Bytes read from a segment file at once. Small enough that decode finds them still in
#: the CPU cache: reading 32 MiB at once made a whole read ~35% slower (full rows) to ~40%
#: (offsets and keys) on a 2-core EPYC.
CHUNK_BYTES = 4 * MiB
#: Bytes of batches decoded at once when a caller reads larger chunks (and so about the
#: size of a yielded RecordBatch).
DECODE_BYTES = 4 * MiB
#: The largest batch a log accepts (LogConfig.batch_bytes_max at most): a larger length
#: field is damage, not a batch to make room for.
BATCH_BYTES_MAX = 1 * GiB
#: An offset index file larger than this is not read (the log is read from its start).
INDEX_BYTES_MAX = 64 * MiB
VERSION_BYTES_MAX = 4096

OpenFile = Callable[[str], AbstractContextManager[IO[bytes]]]


def open_segment_file(path: str) -> AbstractContextManager[IO[bytes]]:
    """Open `path` for reading: through fsspec when it is a URL (has a scheme)."""
    if "://" in path:
        return fsspec.open(path, "rb")
    return open(path, "rb")


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A segment's log file (`<base>.log`, path or URL); its index is beside it."""

    base_offset: int
    path: str

    @property
    def index_path(self) -> str:
        stem = self.path[:-len(".log")] if self.path.endswith(".log") else self.path
        return stem + ".index"


@dataclass(frozen=True, slots=True)
class FileSplit:
    """Offsets [start, end) of a partition and the `segments` holding them, in order.
    `version_path` names the stream's version file, which must still hold `version`."""

    stream: str
    partition: int
    start: int
    end: int
    segments: tuple[SegmentFile, ...]
    version_path: str | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"bad offset range [{self.start}, {self.end})")
        bases = [s.base_offset for s in self.segments]
        if any(a >= b for a, b in itertools.pairwise(bases)):
            raise ValueError(f"segment base offsets must increase: {bases}")
        if self.start < self.end and (not bases or bases[0] > self.start
                                      or bases[-1] >= self.end):
            raise ValueError(f"segments at {bases} do not hold [{self.start}, {self.end})")
        if (self.version_path is None) != (self.version is None):
            raise ValueError("version_path and version go together")


class SegmentGone(Exception):
    """The segment files no longer hold the split from `offset` on: a segment was deleted
    (retention) or merged into another (compaction), a file is shorter than its offsets
    say, or the stream was deleted and created again. Read [offset, end) from a broker."""

    def __init__(self, stream: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(f"{stream}/{partition} from offset {offset}: {reason}")
        self.stream = stream
        self.partition = partition
        self.offset = offset


def segments_for(start: int, end: int,
                 segments: Sequence[SegmentFile]) -> tuple[SegmentFile, ...]:
    """The segments (ordered by base offset) that may hold offsets in [start, end)."""
    picked = []
    for i, segment in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else math.inf
        if segment.base_offset < end and upper > start:
            picked.append(segment)
    return tuple(picked)


def split_offsets(start: int, end: int, segment_bases: Sequence[int],
                  target_rows: int) -> list[tuple[int, int]]:
    """[start, end) as consecutive ranges of at most `target_rows` offsets, cut at segment
    boundaries where possible: whole segments are packed together while they fit, and a
    segment larger than `target_rows` is cut into equal parts."""
    if target_rows < 1:
        raise ValueError("target_rows must be positive")
    cuts = sorted({b for b in segment_bases if start < b < end})
    ranges: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for a, b in zip([start, *cuts], [*cuts, end], strict=True):
        if a >= b:
            continue
        if current is not None and b - current[0] <= target_rows:
            current = (current[0], b)
            continue
        if current is not None:
            ranges.append(current)
            current = None
        if b - a <= target_rows:
            current = (a, b)
            continue
        parts = -(-(b - a) // target_rows)
        edges = [a + (b - a) * i // parts for i in range(parts + 1)]
        ranges.extend(itertools.pairwise(edges))
    if current is not None:
        ranges.append(current)
    return ranges


def read_split(split: FileSplit, columns: Sequence[str], *,
               open_file: OpenFile = open_segment_file, timestamp_min_ms: int | None = None,
               timestamp_max_ms: int | None = None, chunk_bytes: int = CHUNK_BYTES,
               verify: bool = True) -> Iterator[pa.RecordBatch]:
    """The records of `split` as RecordBatches of `columns` (none empty), in offset order.
    Raises SegmentGone when the files no longer hold them (read the rest from a broker)."""
    arrow_decode.arrow_schema(columns)
    if chunk_bytes < fmt.BATCH_HEADER.size:
        raise ValueError(f"chunk_bytes must be at least {fmt.BATCH_HEADER.size}")
    if split.version_path is not None:
        _check_version(split, split.version_path, open_file)
    reader = _Reader(split, columns, open_file, timestamp_min_ms, timestamp_max_ms,
                     chunk_bytes, verify)
    offset = split.start
    for i, segment in enumerate(split.segments):
        upper = split.segments[i + 1].base_offset if i + 1 < len(split.segments) else split.end
        limit = min(upper, split.end)
        if offset < limit:
            offset = yield from reader.segment(segment, offset, limit)


def _check_version(split: FileSplit, path: str, open_file: OpenFile) -> None:
    try:
        with open_file(path) as f:
            found = f.read(VERSION_BYTES_MAX).strip().decode(errors="replace")
    except FileNotFoundError:
        raise SegmentGone(split.stream, split.partition, split.start,
                          f"the stream's version file {path} is gone") from None
    if found != split.version:
        raise SegmentGone(split.stream, split.partition, split.start,
                          f"the stream is at version {found!r}, not {split.version!r}")


class _Reader:
    def __init__(self, split: FileSplit, columns: Sequence[str], open_file: OpenFile,
                 timestamp_min_ms: int | None, timestamp_max_ms: int | None,
                 chunk_bytes: int, verify: bool) -> None:
        self.split = split
        self.columns = columns
        self.open_file = open_file
        self.timestamp_min_ms = timestamp_min_ms
        self.timestamp_max_ms = timestamp_max_ms
        self.verify = verify
        self.buffer = bytearray(chunk_bytes)  # reused: decoded columns never point into it

    def gone(self, offset: int, reason: str) -> SegmentGone:
        return SegmentGone(self.split.stream, self.split.partition, offset, reason)

    def segment(self, segment: SegmentFile, offset: int,
                limit: int) -> Generator[pa.RecordBatch, None, int]:
        """Yield the records of `segment` in [offset, limit); return the next offset."""
        position, base = self.start_position(segment, offset)
        try:
            with self.open_file(segment.path) as f:
                if position and self.first_base(f, position) != base:
                    position, base = 0, segment.base_offset  # a stale index entry
                f.seek(position)
                return (yield from self.batches(f, segment, base, offset, limit))
        except FileNotFoundError:
            raise self.gone(offset, f"{segment.path} is gone") from None

    def start_position(self, segment: SegmentFile, offset: int) -> tuple[int, int]:
        """(file position, base offset) of the last indexed batch at or before `offset`."""
        try:
            with self.open_file(segment.index_path) as f:
                data = f.read(INDEX_BYTES_MAX + 1)
        except FileNotFoundError:  # the active segment: its index is written when sealed
            return 0, segment.base_offset
        index = OffsetIndex.from_bytes(data) if len(data) <= INDEX_BYTES_MAX else None
        relative = offset - segment.base_offset
        if index is None or not 0 <= relative <= fmt.U32_MAX:
            return 0, segment.base_offset
        entry_offset, position = index.lookup(relative)
        return position, segment.base_offset + entry_offset

    def first_base(self, f: IO[bytes], position: int) -> int | None:
        """The base offset of the batch at `position`, None if no batch header is there."""
        f.seek(position)
        try:
            return fmt.parse_header(f.read(fmt.BATCH_HEADER.size)).base_offset
        except fmt.BatchFormatError:
            return None

    def batches(self, f: IO[bytes], segment: SegmentFile, base: int, offset: int,
                limit: int) -> Generator[pa.RecordBatch, None, int]:
        """Decode from the batch at `base` (where `f` is) on; return the next offset."""
        view = memoryview(self.buffer)
        readinto = getattr(f, "readinto", None)
        filled = checked = 0
        while True:
            if filled == len(view):  # a batch larger than the buffer: make room for it
                (found, length) = fmt.LOG_OVERHEAD.unpack_from(view, 0)
                if length > BATCH_BYTES_MAX:
                    raise fmt.BatchFormatError(
                        f"batch at offset {found} in {segment.path} claims {length} bytes")
                self.buffer = bytearray(fmt.LOG_OVERHEAD.size + length)
                self.buffer[:filled] = view[:filled]
                view = memoryview(self.buffer)
            if readinto is not None:
                got = readinto(view[filled:])
            else:
                data = f.read(len(view) - filled)
                got = len(data)
                view[filled:filled + got] = data
            if not got:
                raise self.gone(offset, f"{segment.path} ends before offset {limit}")
            filled += got
            checked, base, found = self.follow(view, checked, filled, base, limit)
            # Up to a batch that does not follow on, if there is one.
            end = filled if found is None else checked
            at = 0
            while at < end:
                window = min(end, at + DECODE_BYTES)
                decoded = self.decode(view[at:window], offset, limit)
                if not decoded.consumed and window < end:
                    decoded = self.decode(view[at:end], offset, limit)
                if decoded.next_offset is None:
                    break  # a partial batch: read on
                if decoded.batch.num_rows:
                    yield decoded.batch
                at += decoded.consumed
                offset = max(offset, decoded.next_offset)
                if offset >= limit:
                    return offset
            if found is not None:
                raise self.gone(offset, f"{segment.path} has a batch at offset {found} "
                                        f"where {base} should be")
            view[:filled - at] = view[at:filled]
            filled -= at
            checked -= at

    def follow(self, view: memoryview, position: int, filled: int, base: int,
               limit: int) -> tuple[int, int, int | None]:
        """Check that each batch header in view[position:filled] starts at the offset the
        one before it ended (decode does not look at that). Returns where the walk stopped,
        the offset expected there, and the base offset found there if it is not that one."""
        while filled - position >= fmt.BATCH_HEADER.size and base < limit:
            found, length, *_, last_delta, _first_ts, _max_ts, _count = (
                fmt.BATCH_HEADER.unpack_from(view, position))
            if found != base:
                return position, base, found
            if length < fmt.BATCH_LENGTH_MIN:
                break  # malformed: decode says so
            position += fmt.LOG_OVERHEAD.size + length
            base = found + last_delta + 1
        return position, base, None

    def decode(self, data: memoryview, offset: int, limit: int) -> arrow_decode.Decoded:
        return arrow_decode.decode(
            data, stream=self.split.stream, partition=self.split.partition,
            columns=self.columns, start=offset, end=limit,
            timestamp_min_ms=self.timestamp_min_ms, timestamp_max_ms=self.timestamp_max_ms,
            verify=self.verify)
