"""One segment of a log: `<base_offset>.log` with its offset and time indexes.

Theory of operation: a segment holds whole batches (jetstream.stream.format) back to back,
the first at `base_offset`, each next one starting where the previous ended. Appends go to
the end with pwrite; nothing is ever rewritten in place except by `truncate_to`. The indexes
live in memory and are written out whole when the segment is sealed (rolled) or the log is
closed; on any doubt they are rebuilt from the log by `recover`, which also checks every
batch's CRC and cuts a torn or corrupt tail.

Reads walk batch headers from the nearest index entry. Every header read back is checked
(structure, offset continuity) so a damaged file yields `CorruptRecord`, never wrong records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from jetstream.errors import CorruptRecord, DiskFull
from jetstream.stream import format as fmt
from jetstream.stream.checkpoint import DISK_FULL_ERRNOS, read_small
from jetstream.stream.handles import HandlePool
from jetstream.stream.index import OffsetIndex, TimeIndex, write_file
from jetstream.stream.verified import VerifiedRanges

# Recovery reads the log in chunks of this size (a larger batch is read whole).
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# Bytes of headers read at once when walking from an index entry to a batch.
WALK_READ_BYTES = 64 * 1024
#: The suffix of a deleted segment's files until they are unlinked (see `mark_deleted`).
DELETED_SUFFIX = ".deleted"
log = logging.getLogger(__name__)


def log_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


@dataclass(frozen=True, slots=True)
class Span:
    """Whole batches of a segment: `length` bytes at `position`, from the batch at
    `first_offset` to `next_offset`, holding `records` records (0: batches compaction
    emptied)."""

    position: int
    length: int
    first_offset: int
    next_offset: int
    records: int


class BatchLocation(NamedTuple):
    """Where a batch starts in the segment file, with its header. (A named tuple: each
    append makes one.)"""

    position: int
    header: fmt.BatchHeader


class Segment:
    def __init__(self, directory: Path, base_offset: int, pool: HandlePool,
                 index_interval_bytes: int) -> None:
        self.base_offset = base_offset
        # One Path, and the others' names as plain strings until asked for: a broker makes a
        # segment for each of thousands of logs as it starts.
        self.log_path = directory / log_file_name(base_offset)
        self._stem = f"{directory}/{base_offset:020d}"
        self._pool = pool
        self._interval = index_interval_bytes
        self.size = 0
        self.next_offset = base_offset
        self.first_timestamp = -1  # of the first batch: drives segment_ms_max
        self.max_timestamp = -1
        self.offset_index = OffsetIndex()
        self.time_index = TimeIndex()
        self._bytes_since_entry = 0
        #: The batch `account` took last: where tail reads (followers, consumers caught up)
        #: find their batch without reading the file; used only while it ends the segment.
        self._last: BatchLocation | None = None
        #: Byte ranges checked since they were written or opened (jetstream.stream.verified).
        self.verified = VerifiedRanges()

    @property
    def index_path(self) -> Path:
        return Path(self._stem + ".index")

    @property
    def time_index_path(self) -> Path:
        return Path(self._stem + ".timeindex")

    def pinned(self) -> AbstractContextManager[int]:
        """An open descriptor of the log file, valid inside the block."""
        return self._pool.pinned(self.log_path)

    def set_active(self, active: bool) -> None:
        """This segment is (or no longer is) its log's active one: the pool keeps the active
        segment open before any sealed one (jetstream.stream.handles)."""
        self._pool.set_hot(self.log_path, active)

    def shadow(self) -> Segment:
        """A segment object for the same file that opens nothing: `account` batches into it
        to learn the offsets and indexes those batches imply."""
        return Segment(self.log_path.parent, self.base_offset, self._pool, self._interval)

    def indexes_match(self, other: Segment) -> bool:
        mine, theirs = self.offset_index, other.offset_index
        my_times, their_times = self.time_index, other.time_index
        return (mine.relative_offsets == theirs.relative_offsets
                and mine.positions == theirs.positions
                and my_times.relative_offsets == their_times.relative_offsets
                and my_times.timestamps == their_times.timestamps
                and self.next_offset == other.next_offset and self.size == other.size)

    def adopt_indexes(self, other: Segment) -> None:
        """Take the indexes and offsets `other` (a shadow that accounted every batch of this
        file) holds: the file's own, in place of damaged ones."""
        assert other.base_offset == self.base_offset and other.size == self.size
        self.offset_index, self.time_index = other.offset_index, other.time_index
        self.next_offset = other.next_offset
        self.first_timestamp, self.max_timestamp = other.first_timestamp, other.max_timestamp
        self._bytes_since_entry = other._bytes_since_entry

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, pool: HandlePool,
               index_interval_bytes: int) -> Segment:
        segment = cls(directory, base_offset, pool, index_interval_bytes)
        with pool.pinned(segment.log_path, create=True) as fd:
            os.ftruncate(fd, 0)
        return segment

    def load(self) -> bool:
        """Open a sealed segment trusting its index files. False when they disagree with the
        log (the caller then runs `recover`)."""
        self.size = os.stat(self.log_path).st_size
        offsets = OffsetIndex.from_bytes(read_small(self._stem + ".index") or b"")
        times = TimeIndex.from_bytes(read_small(self._stem + ".timeindex") or b"")
        if offsets is None or times is None or (self.size > 0 and len(offsets) == 0):
            return False
        if offsets.positions and offsets.positions[-1] >= self.size:
            return False
        if times.relative_offsets and offsets.relative_offsets and (
            times.relative_offsets[-1] > offsets.relative_offsets[-1]
        ):
            return False
        self.offset_index, self.time_index = offsets, times
        if self.size == 0:
            return True
        try:
            first = self._read_batch_header(0)
            if first.base_offset != self.base_offset:
                return False
            # The first batch always has a time entry (unless its timestamps are negative): a
            # missing or emptied time index would understate max_timestamp, and retention by
            # age and time lookups would skip records.
            if first.max_timestamp >= 0 and (
                not times or times.relative_offsets[0] != 0
                or times.timestamps[0] != first.max_timestamp
            ):
                return False
            self.first_timestamp = first.first_timestamp
            rel, pos = offsets.lookup(offsets.relative_offsets[-1])
            last = self._walk_to_end(pos, self.base_offset + rel)
        except CorruptRecord:
            return False
        if last is None:
            return False
        self.next_offset, walked_max_ts = last
        self.max_timestamp = max(times.last_timestamp, walked_max_ts)
        self._bytes_since_entry = self.size - offsets.positions[-1]
        return True

    def _walk_to_end(self, position: int, expected_offset: int) -> tuple[int, int] | None:
        """Walk headers from `position` to the end of the file: (next offset, max timestamp),
        or None if the chain does not end exactly at the end of the file."""
        max_ts = -1
        while position < self.size:
            header = self._read_batch_header(position)
            if header.base_offset != expected_offset or position + header.size > self.size:
                return None
            max_ts = max(max_ts, header.max_timestamp)
            expected_offset = header.next_offset
            position += header.size
        return expected_offset, max_ts

    def recover(self) -> int:
        """Scan the whole log checking every batch; cut the file after the last valid one and
        rebuild the indexes. Returns the number of bytes cut off."""
        self.size = 0
        self.verified.clear()
        self.next_offset = self.base_offset
        self.first_timestamp = self.max_timestamp = -1
        self.offset_index, self.time_index = OffsetIndex(), TimeIndex()
        self._bytes_since_entry = 0
        with self._pool.pinned(self.log_path) as fd:
            file_size = os.fstat(fd).st_size
            position = 0
            buf = b""
            buf_start = 0
            while position < file_size:
                rel = position - buf_start
                if len(buf) - rel < fmt.BATCH_HEADER.size:
                    buf = os.pread(fd, SCAN_CHUNK_BYTES, position)
                    buf_start, rel = position, 0
                try:
                    header = fmt.parse_header(buf, rel)
                except fmt.BatchFormatError:
                    break
                if header.base_offset != self.next_offset or position + header.size > file_size:
                    break
                if rel + header.size > len(buf):
                    buf = os.pread(fd, max(SCAN_CHUNK_BYTES, header.size), position)
                    buf_start, rel = position, 0
                if not fmt.verify_crc(buf, rel, header):
                    break
                self.account(position, header)
                position += header.size
            cut = file_size - position
            if cut:
                os.ftruncate(fd, position)
        return cut

    # -- writing ------------------------------------------------------------------------------

    def append(self, chunks: Sequence[bytes], headers: list[fmt.BatchHeader]) -> None:
        """Write whole, already validated batches (given as consecutive chunks of bytes) at
        the end of the segment."""
        assert headers and headers[0].base_offset == self.next_offset
        position = self.size
        total = sum(len(c) for c in chunks)
        with self._pool.pinned(self.log_path) as fd:
            try:
                written = os.pwritev(fd, chunks, position)
                if written < total:  # rare: finish from one buffer
                    rest = memoryview(b"".join(chunks))
                    while written < total:
                        written += os.pwrite(fd, rest[written:], position + written)
            except OSError as exc:
                # Leave no partial batch behind: the file ends where it did before.
                os.ftruncate(fd, position)
                if exc.errno in DISK_FULL_ERRNOS:
                    raise DiskFull(f"no space to append {total} bytes to {self.log_path}: "
                                   f"{exc.strerror}") from exc
                raise
        for header in headers:
            self.account(position, header)
            position += header.size
        assert position == self.size

    def account(self, position: int, header: fmt.BatchHeader) -> None:
        """Update size, offsets, timestamps and indexes for a batch now at `position`."""
        assert position == self.size and header.base_offset == self.next_offset
        if self.first_timestamp < 0:
            self.first_timestamp = header.first_timestamp
        if not self.offset_index or self._bytes_since_entry >= self._interval:
            relative = header.base_offset - self.base_offset
            self.offset_index.append(relative, position)
            ts = max(self.max_timestamp, header.max_timestamp)
            if ts > self.time_index.last_timestamp:
                self.time_index.append(ts, relative)
            self._bytes_since_entry = 0
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self.verified.add(position, position + header.size)
        self._last = BatchLocation(position, header)
        self.size += header.size
        self._bytes_since_entry += header.size
        self.next_offset = header.next_offset

    def sync(self) -> None:
        with self._pool.pinned(self.log_path) as fd:
            os.fsync(fd)

    def seal(self, fsync: bool) -> bool:
        """Write the indexes out (at roll and close): `load` can then trust them. On a full
        disk the index files are removed instead (they are a cache: the next open rebuilds
        them from the log, and this segment keeps its indexes in memory); returns whether
        they were written."""
        written = True
        try:
            write_file(self.index_path, self.offset_index.to_bytes(), fsync)
            write_file(self.time_index_path, self.time_index.to_bytes(), fsync)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            self.index_path.unlink(missing_ok=True)
            self.time_index_path.unlink(missing_ok=True)
            log.warning("%s: no space for its index files (%s); they are rebuilt when the log "
                        "is next opened", self.log_path, exc.strerror)
            written = False
        if fsync:
            self.sync()
        return written

    def truncate_to(self, offset: int) -> bytes | None:
        """Drop everything at or past `offset` (base_offset <= offset <= next_offset).

        If `offset` falls inside a batch, returns that batch's bytes; the caller re-appends
        the retained prefix of it."""
        assert self.base_offset <= offset <= self.next_offset
        if offset == self.next_offset:
            return None
        location = self.find(offset)
        assert location is not None
        cut_batch = None
        if location.header.base_offset < offset:
            cut_batch = self.read_at(location.position, location.header.size)
        with self._pool.pinned(self.log_path) as fd:
            os.ftruncate(fd, location.position)
        self.verified.discard(location.position)
        # Recompute the tail state from the remaining index entries.
        relative = location.header.base_offset - self.base_offset
        self.offset_index.truncate(relative)
        self.time_index.truncate(relative)
        self.size = location.position
        self.next_offset = location.header.base_offset
        self.max_timestamp = self.time_index.last_timestamp
        if self.offset_index:
            last_pos = self.offset_index.positions[-1]
            walked = self._walk_to_end(last_pos,
                                       self.base_offset + self.offset_index.relative_offsets[-1])
            assert walked is not None and walked[0] == self.next_offset
            self.max_timestamp = max(self.max_timestamp, walked[1])
            self._bytes_since_entry = self.size - last_pos
        else:
            self.first_timestamp = -1
            self._bytes_since_entry = 0
        return cut_batch

    # -- reading ------------------------------------------------------------------------------

    def read_at(self, position: int, length: int) -> bytes:
        with self._pool.pinned(self.log_path) as fd:
            data = os.pread(fd, length, position)
        if len(data) != length:
            raise CorruptRecord(f"{self.log_path} is shorter than expected",
                                path=str(self.log_path), position=position)
        return data

    def _read_batch_header(self, position: int) -> fmt.BatchHeader:
        data = self.read_at(position, fmt.BATCH_HEADER.size)
        try:
            return fmt.parse_header(data)
        except fmt.BatchFormatError as exc:
            raise CorruptRecord(f"bad batch header in {self.log_path} at {position}: {exc}",
                                path=str(self.log_path), position=position) from exc

    def find(self, offset: int) -> BatchLocation | None:
        """The batch holding `offset`, or the first batch after it; None past the end."""
        if offset >= self.next_offset:
            return None
        last = self._last
        if last is not None and last.header.base_offset <= offset and \
                last.position + last.header.size == self.size and \
                last.header.next_offset == self.next_offset:
            return last
        rel, position = self.offset_index.lookup(max(0, offset - self.base_offset))
        expected = self.base_offset + rel
        buf = b""
        buf_start = position
        while position < self.size:
            at = position - buf_start
            if len(buf) - at < fmt.BATCH_HEADER.size:
                buf = self.read_at(position, min(WALK_READ_BYTES, self.size - position))
                buf_start, at = position, 0
            try:
                header = fmt.parse_header(buf, at)
            except fmt.BatchFormatError as exc:
                raise CorruptRecord(f"bad batch header in {self.log_path} at {position}: {exc}",
                                    path=str(self.log_path), position=position) from exc
            # A batch claiming offsets past the segment's end is damaged too: taken as is, a
            # read would see it reach past the bound and return nothing, forever.
            if (header.base_offset != expected or position + header.size > self.size
                    or header.next_offset > self.next_offset):
                raise CorruptRecord(
                    f"batch at {position} in {self.log_path} has offsets "
                    f"[{header.base_offset}, {header.last_offset}], expected it to start at "
                    f"{expected} and end before {self.next_offset}",
                    path=str(self.log_path), position=position)
            if header.last_offset >= offset:
                return BatchLocation(position, header)
            expected = header.next_offset
            position += header.size
        raise CorruptRecord(f"offset {offset} not found in {self.log_path}",
                            path=str(self.log_path), position=position)

    def span(self, offset: int, max_bytes: int, upper_bound: int) -> Span:
        """Whole batches from the one holding `offset`, none reaching `upper_bound`, about
        `max_bytes` in all (at least one batch when the first fits under the bound)."""
        location = self.find(offset)
        if location is None or location.header.last_offset >= upper_bound:
            return Span(0, 0, offset, offset, 0)
        start = position = location.position
        header = location.header
        first_base = header.base_offset
        next_offset = header.next_offset
        records = header.record_count
        position += header.size
        while position < self.size and position - start < max_bytes:
            header = self._read_batch_header(position)
            if header.base_offset != next_offset:
                raise CorruptRecord(
                    f"batch at {position} in {self.log_path} has offset {header.base_offset}, "
                    f"expected {next_offset}", path=str(self.log_path), position=position)
            if header.last_offset >= upper_bound or position + header.size - start > max_bytes:
                break
            next_offset = header.next_offset
            records += header.record_count
            position += header.size
        return Span(start, position - start, first_base, next_offset, records)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= `timestamp`, None if there is none."""
        if self.max_timestamp < timestamp:
            return None
        start_rel = self.time_index.lookup(timestamp)
        location = self.find(self.base_offset + start_rel)
        position = location.position if location else self.size
        while position < self.size:
            header = self._read_batch_header(position)
            if header.max_timestamp >= timestamp:
                data = self.read_at(position, header.size)
                if not fmt.verify_crc(data, 0, header):
                    raise CorruptRecord(f"CRC mismatch in {self.log_path} at {position}",
                                        path=str(self.log_path), position=position)
                for record in fmt.decode_records(data, 0, header):
                    if record.timestamp_ms >= timestamp:
                        return record.offset
            position += header.size
        return None

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        self._pool.close(self.log_path)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.time_index_path):
            path.unlink(missing_ok=True)

    def mark_deleted(self) -> list[Path]:
        """Close the segment and rename its files `*.deleted` (a rename costs microseconds
        where the unlink of a large file costs a millisecond or more); returns the renamed
        files, for the caller to unlink outside the log's lock. Recovery unlinks any
        `*.deleted` file a crash left (Kafka's asynchronous segment deletion)."""
        self.close()
        renamed: list[Path] = []
        for path in (self.log_path, self.index_path, self.time_index_path):
            doomed = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.replace(path, doomed)
            except FileNotFoundError:
                continue
            renamed.append(doomed)
        return renamed
