"""One cleaning pass over one partition replica's log: the IO around the pure planner and
rewrite rule.

Theory of operation: given a plan (jetstream.compaction.planner), the pass reads the dirty
segments to build the offset map (as many whole segments as `buffer_bytes` allows), then
rewrites every sealed segment from the log start up to the map's end, group by group, each
group into one `.cleaned` file swapped in crash-safely (jetstream.stream.cleaning) under the
log's lock; the log goes on taking appends and reads meanwhile. Last it writes the cleaner
checkpoint. Everything here runs in a worker thread: it reads and writes files and never
touches the event loop. A corrupt batch raises CorruptRecord (the caller leaves that
partition alone); segments that changed meanwhile raise SegmentsChanged (the caller plans
again).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jetstream.compaction import checkpoint as cleaner_checkpoint
from jetstream.compaction.checkpoint import CleanerCheckpoint
from jetstream.compaction.offset_map import OffsetMap, scan_keys
from jetstream.compaction.planner import (
    CleaningPlan,
    CompactionConfig,
    SegmentInfo,
    group_segments,
)
from jetstream.compaction.rewrite import PassStats, filter_batches, retention_rule
from jetstream.errors import CorruptRecord, SegmentsChanged, StorageError
from jetstream.stream import cleaning
from jetstream.stream import format as fmt
from jetstream.stream.log import Log
from jetstream.stream.segment import Segment

#: Segment files are read in chunks of this size (a larger batch is read whole).
READ_CHUNK_BYTES = 4 * 1024 * 1024


class OffsetMapTooSmall(StorageError):
    """Not even one dirty segment's keys fit the cleaner's buffer: raise
    `cleaner_buffer_bytes` (or lower the stream's segment size)."""

    code = "CLEANER_BUFFER_TOO_SMALL"


@dataclass(frozen=True, slots=True)
class PassResult:
    end_offset: int
    stats: PassStats
    segments_before: int
    segments_after: int
    duration_s: float
    checkpoint: CleanerCheckpoint


def segment_info(segment: Segment) -> SegmentInfo:
    return SegmentInfo(segment.base_offset, segment.next_offset, segment.size,
                       segment.first_timestamp, segment.max_timestamp)


def read_batches(path: Path) -> Iterator[tuple[bytes, int, fmt.BatchHeader]]:
    """(buffer, position, header) of every batch of a sealed segment file, CRC-checked, read
    in bounded chunks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SegmentsChanged(f"{path} was deleted while cleaning") from None
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            buf = os.pread(fd, READ_CHUNK_BYTES, position)
            pos = 0
            while pos < len(buf):
                try:
                    header = fmt.parse_header(buf, pos) if len(buf) - pos >= \
                        fmt.BATCH_HEADER.size else None
                except fmt.BatchFormatError as exc:
                    raise CorruptRecord(f"bad batch header in {path} at {position + pos}: "
                                        f"{exc}", path=str(path),
                                        position=position + pos) from exc
                if header is None or pos + header.size > len(buf):
                    if pos == 0:  # one batch larger than a chunk: read it whole
                        need = header.size if header is not None else fmt.BATCH_HEADER.size
                        buf = os.pread(fd, need, position)
                        if len(buf) < need:
                            raise CorruptRecord(f"{path} ends inside a batch",
                                                path=str(path), position=position)
                        continue
                    break
                if not fmt.verify_crc(buf, pos, header):
                    raise CorruptRecord(f"CRC mismatch in {path} at {position + pos}",
                                        path=str(path), position=position + pos)
                yield buf, pos, header
                pos += header.size
            position += pos
    finally:
        os.close(fd)


def build_offset_map(segments: list[Segment], first_dirty_offset: int,
                     budget_bytes: int) -> OffsetMap:
    """The offset map over the dirty segments, as many whole ones as fit."""
    offset_map = OffsetMap(budget_bytes)
    for segment in segments:
        if segment.next_offset <= first_dirty_offset:
            continue
        keys = [info for buf, pos, header in read_batches(segment.log_path)
                for info in _scan(buf, pos, header, segment)]
        if not offset_map.add_segment(keys, segment.next_offset):
            break
    if offset_map.end_offset is None:
        raise OffsetMapTooSmall(f"the keys of one segment do not fit {budget_bytes} bytes",
                                budget_bytes=budget_bytes)
    return offset_map


def _scan(buf: bytes, pos: int, header: fmt.BatchHeader,
          segment: Segment) -> list[tuple[int, bytes | None, bool]]:
    try:
        return scan_keys(buf, pos, header)
    except fmt.BatchFormatError as exc:
        raise CorruptRecord(f"malformed batch in {segment.log_path}: {exc}",
                            path=str(segment.log_path), position=pos) from exc


def clean(log: Log, plan: CleaningPlan, config: CompactionConfig, buffer_bytes: int,
          now_ms: int | None = None, hook: cleaning.StepHook | None = None) -> PassResult:
    """Run one pass (see the module docstring)."""
    started = time.monotonic()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    state = cleaner_checkpoint.read(log.directory).reset_to(log.log_start_offset)
    sealed = [s for s in log.sealed_segments()
              if s.next_offset <= plan.first_uncleanable_offset]
    first_dirty = max(state.first_dirty_offset, plan.first_dirty_offset)
    if any(s.next_offset > first_dirty for s in sealed):
        offset_map = build_offset_map(sealed, first_dirty, buffer_bytes)
        assert offset_map.end_offset is not None
        end_offset = offset_map.end_offset
    else:  # nothing new: a pass over the clean part drops tombstones past their horizon
        offset_map, end_offset = OffsetMap(buffer_bytes), first_dirty
    stats = PassStats()
    keep = retention_rule(offset_map, state, now, config.delete_retention_ms, stats)
    to_clean = [s for s in sealed if s.next_offset <= end_offset]
    if not to_clean:
        return PassResult(end_offset, stats, 0, 0, time.monotonic() - started, state)
    by_base = {s.base_offset: s for s in to_clean}
    groups = group_segments([segment_info(s) for s in to_clean], config.segment_bytes_max)
    for group in groups:
        replaced = [by_base[info.base_offset] for info in group]
        batches = (item for segment in replaced for item in read_batches(segment.log_path))
        path = cleaning.write_cleaned(log.directory, replaced[0].base_offset,
                                      filter_batches(batches, keep, stats,
                                                     now - config.duplicate_window_ms))
        log.replace_segments(replaced, path, hook)
    new_state = state.after_pass(end_offset, now, config.delete_retention_ms,
                                 stats.new_tombstones > 0)
    cleaner_checkpoint.write(log.directory, new_state)
    return PassResult(end_offset, stats, len(to_clean), len(groups),
                      time.monotonic() - started, new_state)
