"""A log's reads: whole batches from an offset, as file slices, bytes or decoded records, and
the offset of a timestamp.

`LogReads` is a part of jetstream.stream.log.Log, apart to keep each file to one concern: it
uses the log's lock, segments and handle pool, and checks unverified bytes through
`LogIntegrity` before it hands them out.
"""

from __future__ import annotations

import os

from jetstream.errors import CorruptRecord, OffsetOutOfRange, SegmentsChanged
from jetstream.stream import format as fmt
from jetstream.stream.file_slice import INLINE_BYTES_MAX, FileSlice
from jetstream.stream.handles import HandlePool
from jetstream.stream.log_integrity import LogIntegrity


class LogReads(LogIntegrity):
    _pool: HandlePool

    def _check_range(self, offset: int, upper_bound: int | None) -> int:
        bound = self.log_end_offset if upper_bound is None else min(upper_bound,
                                                                    self.log_end_offset)
        if offset < self.log_start_offset or offset > bound:
            raise OffsetOutOfRange(offset, self.log_start_offset, bound)
        return bound

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None, *,
             skip_empty: bool = False, verify: bool = False) -> FileSlice:
        """Whole batches from the one holding `offset`, none reaching `upper_bound` (default:
        the LEO), about `max_bytes` in all but at least one batch. The first batch may start
        before `offset`: readers skip records below it. An empty slice means: nothing yet.
        `skip_empty` (consumers; never a replica, which must copy every batch to stay
        contiguous) passes over batches compaction emptied to the next records.

        A small checked slice comes already read (jetstream.stream.file_slice). Bytes not
        checked since they were written or opened (or every byte, with `verify`) are
        checked first (jetstream.stream.verified); damage raises CorruptRecord with the
        damaged offsets and is recorded (`damage`)."""
        with self._lock:
            self._check_open()
            bound = self._check_range(offset, upper_bound)
            if offset == bound:
                return FileSlice(-1, 0, 0, offset, offset)
            segment = self._segments.segment_for(offset)
            span = segment.span(offset, max(1, max_bytes), bound)
            while skip_empty and span.length and not span.records and span.next_offset < bound:
                # Batches compaction emptied: go on to the next records rather than cost the
                # reader one round trip per emptied segment.
                after = self._segments.segment_for(span.next_offset)
                following = after.span(span.next_offset, max(1, max_bytes), bound)
                if not following.length:
                    break
                segment, span = after, following
            if span.length == 0:
                return FileSlice(-1, 0, 0, offset, offset)
            checked = not verify and segment.verified.covers(span.position,
                                                             span.position + span.length)
            if checked and span.length <= INLINE_BYTES_MAX:
                with self._pool.pinned(segment.log_path) as fd:
                    data = os.pread(fd, span.length, span.position)
                return FileSlice(-1, span.position, span.length, span.first_offset,
                                 span.next_offset, data)
            fd = self._pool.dup(segment.log_path)
        piece = FileSlice(fd, span.position, span.length, span.first_offset, span.next_offset)
        if not checked:
            self._check_piece(segment, piece)
        return piece

    def read_segment(self, base_offset: int, size: int, next_offset: int) -> bytes:
        """The whole sealed segment at `base_offset` (`size` bytes holding the offsets up to
        `next_offset`), checked where it was not since it was written or opened; raises
        SegmentsChanged when the log no longer holds that segment sealed as it was
        (retention, truncation or compaction came first). A bulk copy (tiered storage's
        offload): the lock that appends take is held only to find the segment and take a
        descriptor, never for a walk of its batches."""
        with self._lock:
            self._check_open()
            segments = self._segments
            segment = segments.segment_for(base_offset)
            if (segment is segments.active or segment.base_offset != base_offset
                    or segment.size != size or segment.next_offset != next_offset):
                raise SegmentsChanged(f"segment {base_offset} of {self.directory} is no longer "
                                      f"the sealed one of {size} bytes up to {next_offset}")
            checked = segment.verified.covers(0, size)
            fd = self._pool.dup(segment.log_path)
        piece = FileSlice(fd, 0, size, base_offset, next_offset)
        with piece:
            data = piece.read()
            if not checked:
                self._check_piece(segment, piece, data)
            elif len(data) != size:
                raise CorruptRecord("segment shrank while being read")
        return data

    def read_bytes(self, offset: int, max_bytes: int, upper_bound: int | None = None, *,
                   skip_empty: bool = False) -> tuple[bytes, int]:
        """Like `read`, as (bytes, next offset)."""
        with self.read(offset, max_bytes, upper_bound, skip_empty=skip_empty) as piece:
            data = piece.read()
            if len(data) != piece.length:
                raise CorruptRecord("segment shrank while being read")
            return data, piece.next_offset

    def read_records(self, offset: int, max_bytes: int = 1 << 20,
                     upper_bound: int | None = None) -> list[fmt.StoredRecord]:
        """Decoded records from `offset` (CRC-checked), none at or past `upper_bound`; empty
        only when no record is left below the bound. A batch whose kept records all lie
        below `offset` (compaction removed the rest) is passed over, not returned empty."""
        at = offset
        while True:
            data, next_offset = self.read_bytes(at, max_bytes, upper_bound, skip_empty=True)
            try:
                records = fmt.decode_batches(data, min_offset=offset, verify=True)
            except (fmt.BatchFormatError, UnicodeDecodeError) as exc:
                raise CorruptRecord(f"cannot decode records at offset {at} in "
                                    f"{self.directory}: {exc}") from exc
            if records or not data or next_offset <= at:
                return records
            at = next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose timestamp is >= `timestamp_ms`, or the LEO if none is."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp >= timestamp_ms:
                    found = segment.offset_for_timestamp(timestamp_ms)
                    if found is not None:
                        return found
            return self.log_end_offset
